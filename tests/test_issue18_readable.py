"""Issue 18, readable data kept: damaged or oddly encoded logs give every row they hold."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import write_tb_run

from forensics.findings import FindingKind
from forensics.importers import read_run


def _nanogpt(n: int = 60) -> str:
    return "".join(
        f"iter {i}: loss {3 - i * 0.01:.4f}, time 10.00ms, mfu 1.00%\n" for i in range(n)
    )


def _jsonl_text(n: int = 40, **extra: object) -> str:
    return "".join(
        json.dumps({"step": i, "loss": 3 - i * 0.01, **extra}, ensure_ascii=False) + "\n"
        for i in range(n)
    )


def _state(n: int = 30) -> str:
    hist = [{"step": i, "loss": 2.0 - i / 100} for i in range(1, n + 1)]
    return json.dumps({"global_step": n, "log_history": hist})


def test_an_event_file_zeroed_from_the_middle_of_a_record_keeps_the_records_before(
    tmp_path: Path,
) -> None:
    """A crash's zero-filled last 4 KiB block, from inside a record on: complete records read."""
    src = write_tb_run(tmp_path / "src", n=200, spike_at=None)
    (f,) = src.glob("events.out.tfevents*")
    data = f.read_bytes()
    full = read_run(src).series("loss").height
    for cut in range(len(data) - 400, len(data) - 1, 13):
        run_dir = tmp_path / f"cut{cut}"
        run_dir.mkdir()
        block = (cut // 4096 + 1) * 4096
        (run_dir / f.name).write_bytes(data[:cut] + b"\0" * (block - cut))
        run = read_run(run_dir)
        assert full - 3 <= run.series("loss").height <= full
        assert any(x.kind == FindingKind.TRUNCATED_LOG for x in run.import_findings)


@pytest.mark.parametrize(
    "name, content",
    [
        ("latin1", b"d\xe9marrage du job\n" + _nanogpt().encode()),
        ("nul-line", b"\x00\x00\x00\x00\n" + _nanogpt().encode()),
        ("nul-tail", _nanogpt(20).encode() + b"\x00" * 3000),
        ("utf16-bom", _nanogpt().encode("utf-16")),
        ("utf16le", _nanogpt().encode("utf-16-le")),
        ("utf16be", _nanogpt().encode("utf-16-be")),
    ],
)
def test_text_logs_with_odd_bytes_are_read(tmp_path: Path, name: str, content: bytes) -> None:
    """latin-1 bytes, NUL lines, NUL tails and UTF-16 in a text log: the metric lines are read."""
    path = tmp_path / "train.log"
    path.write_bytes(content)
    assert read_run(path).series("loss").height == (20 if name == "nul-tail" else 60)


@pytest.mark.parametrize(
    "encode",
    [
        lambda t: t.encode("utf-16"),
        lambda t: t.encode("utf-16-le"),
        lambda t: b"\xef\xbb\xbf" + t.encode(),
    ],
    ids=["utf16-bom", "utf16le", "utf8-bom"],
)
def test_jsonl_and_trainer_state_in_other_encodings(tmp_path: Path, encode) -> None:  # noqa: ANN001
    """UTF-16 and a UTF-8 BOM: every JSONL line (the first too) and the trainer state read."""
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "m.jsonl").write_bytes(encode(_jsonl_text()))
    assert read_run(tmp_path / "a" / "m.jsonl").series("loss").height == 40
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "trainer_state.json").write_bytes(encode(_state()))
    assert read_run(tmp_path / "b").series("loss").height == 30


def test_line_separators_inside_json_strings_do_not_split_records(tmp_path: Path) -> None:
    """Raw U+2028 / U+2029 / U+0085 inside strings (orjson, ensure_ascii=False) are legal JSON."""
    path = tmp_path / "m.jsonl"
    path.write_text(_jsonl_text(note="a\u2028b\u2029c\u0085d"), encoding="utf-8")
    run = read_run(path)
    assert run.series("loss").height == 40
    assert not any("skipped" in n for n in run.notes), run.notes


def test_deepspeed_chat_lines_with_trailing_whitespace_keep_their_last_field(
    tmp_path: Path,
) -> None:
    """DeepSpeed-Chat's `...|unsuper_loss: 0.0   `: the last field is read like the others."""
    path = tmp_path / "train.log"
    path.write_text(
        "".join(
            f"epoch: 0|step: {i}|ppo_ep: 1|act_loss: {0.5 + i / 100}|cri_loss: 0.3"
            "|unsuper_loss: 0.0   \n"
            for i in range(40)
        )
    )
    tags = set(read_run(path).frame.get_column("tag").unique().to_list())
    assert {"act_loss", "cri_loss", "unsuper_loss"} <= tags


def test_a_jsonl_whose_first_line_is_huge_is_recognised(tmp_path: Path) -> None:
    """A first record holding a multi-megabyte blob: the file is still JSONL, every line read."""
    path = tmp_path / "m.jsonl"
    path.write_text(json.dumps({"step": 0, "config": "x" * 3_000_000}) + "\n" + _jsonl_text())
    assert read_run(path).series("loss").height == 40
