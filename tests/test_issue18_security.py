"""Issue 18, security: hostile names stay inert on the terminal, --redact leaves no host,
user or home path, and links out of the run folder are not followed."""

from __future__ import annotations

import json
import os
import socket
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
from conftest import write_tb_run
from typer.testing import CliRunner

from forensics.cli import app
from forensics.importers import read_run

runner = CliRunner()

HOST = "gpu-node-17.corp.example"
USER = "alice_q"


@pytest.fixture(autouse=True)
def _cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def test_escape_sequences_in_folder_and_tag_names_do_not_reach_the_terminal(
    tmp_path: Path,
) -> None:
    """ESC in a run folder's and a tag's name: shown as \\x1b, never sent raw."""
    run = tmp_path / "run\x1b]0;pwned\x07\x1b[2J"
    run.mkdir()
    lines = [json.dumps({"step": i, "loss": 3 - i / 100, "evil\x1b[2Jtag": 1.0}) for i in range(60)]
    (run / "m.jsonl").write_text("\n".join(lines) + "\n")
    for args in (
        ["analyze", str(run), "--no-report"],
        ["metrics", str(run)],
        ["analyze", str(run / "nope")],
    ):
        res = runner.invoke(app, args)
        text = res.stdout + res.stderr
        assert "\x1b" not in text and "\x07" not in text, (args, text)
    assert "\\x1b" in runner.invoke(app, ["metrics", str(run)]).stdout


def _hostile_run(root: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A job with a host name in its event-file name, /home/<user> in a crash, W&B args."""
    with pytest.MonkeyPatch.context() as mp:  # only the writer sees the fake host name
        mp.setattr(socket, "gethostname", lambda: HOST)
        run = write_tb_run(root / "job", n=200)
    (run / "train.log").write_text(
        "".join(f"iter {i}: loss {3 - i / 100:.4f}, time 10.00ms, mfu 1.00%\n" for i in range(50))
        + "Traceback (most recent call last):\n"
        + f'  File "/home/{USER}/proj/train.py", line 10, in <module>\n'
        + "RuntimeError: CUDA error: an illegal memory access was encountered\n"
    )
    files = run / "wandb" / "run-20240101_120000-abc123" / "files"
    files.mkdir(parents=True)
    (files / "wandb-history.jsonl").write_text(
        "".join(json.dumps({"_step": i, "loss": 3 - i / 100}) + "\n" for i in range(20))
    )
    (files / "wandb-metadata.json").write_text(
        json.dumps(
            {
                "host": HOST.split(".")[0],
                "username": USER,
                "email": f"{USER}@corp.example",
                "args": ["--output_dir", f"/home/{USER}/out", "--run_name", f"{USER}-sft"],
                "program": f"/home/{USER}/proj/train.py",
            }
        )
    )
    return run


class _Text(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.chunks: list[str] = []

    def handle_data(self, data: str) -> None:
        self.chunks.append(data)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.chunks.extend(v for _, v in attrs if v)


def test_redact_leaves_no_host_user_or_home_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--redact: the host (event-file name), the user (crash line, W&B args) and /home/<user>
    appear nowhere in the page (text, attributes, chart data) or the findings document."""
    run = _hostile_run(tmp_path, monkeypatch)
    assert any(HOST in f.name for f in run.glob("events*"))
    res = runner.invoke(
        app,
        ["analyze", str(run), "--redact", "-o", "r.html", "--json", "r.json", "--format", "json"],
    )
    assert res.exit_code == 0, res.output
    page = Path("r.html").read_text()
    from forensics.report.render import _plotly_inline

    page = page.replace(_plotly_inline(), "")
    parser = _Text()
    parser.feed(page)
    everything = page + "\n".join(parser.chunks) + Path("r.json").read_text() + res.stdout
    for secret in (HOST, HOST.split(".")[0], USER, f"/home/{USER}", "corp.example"):
        assert secret not in everything, secret
    # Without --redact they are there: the test sees what it claims to remove.
    res = runner.invoke(app, ["analyze", str(run), "-o", "plain.html", "--json", "p.json"])
    plain = Path("plain.html").read_text() + Path("p.json").read_text()
    assert HOST in plain and f"/home/{USER}" in plain and f"{USER}-sft" in plain


def test_links_out_of_the_run_folder_are_not_followed(tmp_path: Path) -> None:
    """A linked hparams.yaml, log and folder pointing outside the run: not read, noted."""
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "hparams.yaml").write_text("api_token: sk-SECRET-123\n")
    (secret / "other.jsonl").write_text(
        "".join(json.dumps({"step": i, "loss": 9.0}) + "\n" for i in range(50))
    )
    run = tmp_path / "lightning_logs" / "version_0"
    run.mkdir(parents=True)
    (run / "metrics.csv").write_text(
        "step,train_loss\n" + "".join(f"{i},{3 - i / 100}\n" for i in range(60))
    )
    os.symlink(secret / "hparams.yaml", run / "hparams.yaml")
    os.symlink(secret / "other.jsonl", run / "other.jsonl")
    os.symlink(secret, run / "linked_dir")
    got = read_run(run)
    assert "api_token" not in got.config
    assert got.series("loss").get_column("value").max() < 9.0
    note = next(n for n in got.notes if "outside the run folder" in n)
    assert "3 link(s)" in note
    res = runner.invoke(app, ["analyze", str(run), "-o", "r.html"])
    assert res.exit_code == 0, res.output
    assert "sk-SECRET" not in Path("r.html").read_text()


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads every folder: no unreadable path")
def test_a_link_into_an_unreadable_folder_is_passed_over(tmp_path: Path) -> None:
    """A link into a chmod-000 folder inside the run: the run is read, the link noted."""
    run = tmp_path / "run"
    (run / "locked").mkdir(parents=True)
    (run / "locked" / "x.log").write_text("x")
    (run / "m.jsonl").write_text(
        "".join(json.dumps({"step": i, "loss": 1.0}) + "\n" for i in range(50))
    )
    os.symlink(run / "locked" / "x.log", run / "link.log")
    (run / "locked").chmod(0)
    try:
        got = read_run(run)
        assert got.series("loss").height == 50
        assert any("unreadable" in n for n in got.notes)
    finally:
        (run / "locked").chmod(0o755)


def test_the_terminal_escape_helper() -> None:
    """Control characters, bidi overrides and lone surrogates become visible escapes."""
    from forensics.terminal import safe

    assert safe("a\x1b[2Jb\x07\u202e\ud800\tc\n") == "a\\x1b[2Jb\\x07\\u202e\\ud800\tc\n"
    assert sys.getdefaultencoding() == "utf-8"
