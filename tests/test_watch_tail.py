"""RunTail reads a run as it is written: after every poll its frame is the frame a whole read
gives on the same complete lines and records, nothing lost or repeated; only the appended
bytes are read; new files are picked up; a shrunk or replaced file is read again."""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from polars.testing import assert_frame_equal

from forensics.errors import ForensicsError
from forensics.importers import ReadOptions, read_run
from forensics.importers.tfevents_scan import walk
from forensics.watch.tail import RunTail
from tests.conftest import shared_path

OPTS = ReadOptions(cache=False)


def _sorted(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.sort(frame.columns, nulls_last=True)


def _whole(folder: Path) -> pl.DataFrame | None:
    try:
        return read_run(folder, options=OPTS).frame
    except ForensicsError:
        return None


def _same(tail: RunTail, expected: pl.DataFrame | None, where: str) -> None:
    if expected is None:
        assert tail.run is None, where
        return
    assert tail.run is not None, where
    try:
        assert_frame_equal(_sorted(tail.run.frame), _sorted(expected))
    except AssertionError as exc:
        raise AssertionError(f"{where}: {exc}") from None


def _line_prefix(data: bytes) -> bytes:
    return data[: data.rfind(b"\n") + 1]


def _record_prefix(data: bytes) -> bytes:
    return data[: walk(data, 1 << 30).end]


def _cuts(data: bytes, n: int, seed: int) -> list[int]:
    """Cut points of every kind: at a line end, just after it, just before it, mid-line,
    inside a multi-byte character when there is one, and random ones; ending at the end."""
    rng = random.Random(seed)
    ends = [i for i, b in enumerate(data) if b == 10]
    picks = {len(data)}
    for _ in range(n):
        e = rng.choice(ends) if ends else rng.randrange(len(data))
        picks |= {e, e + 1, max(1, e - 1), max(1, e - rng.randrange(1, 40))}
    wide = [i for i, b in enumerate(data) if b >= 0xC0]
    if wide:
        picks.add(rng.choice(wide) + 1)
    picks |= {rng.randrange(1, len(data)) for _ in range(n)}
    return sorted(p for p in picks if 0 < p <= len(data))


def _follow(tmp: Path, data: bytes, rel: str, cuts: list[int], prefix) -> RunTail:  # noqa: ANN001
    """Write ``data`` into tmp/run/rel in pieces ending at ``cuts``; after each piece poll
    and compare with a whole read of a copy holding only its complete lines/records."""
    run, ref = tmp / "run", tmp / "ref"
    (run / rel).parent.mkdir(parents=True, exist_ok=True)
    (ref / rel).parent.mkdir(parents=True, exist_ok=True)
    tail = RunTail(run, OPTS)
    done = 0
    found_at = None  # discoveries when the log was first claimed
    for cut in cuts:
        with (run / rel).open("ab") as fh:
            fh.write(data[done:cut])
        done = cut
        tail.poll()
        (ref / rel).write_bytes(prefix(data[:cut]))
        _same(tail, _whole(ref), f"{rel} cut at byte {cut} of {len(data)}")
        if found_at is None and tail.sources:
            found_at = tail.discoveries
    assert tail.discoveries == found_at  # once claimed, appending does not discover again
    return tail


REAL_TEXT = [
    ("bigscience-megatron-experiments", "meg_gpt2_base_n4_dp1_tp4_pp4-1809579.out"),
    ("llmc-gpt2-124M-siddanthemani", "main.log"),
    ("modded-nanogpt", "2024-06-06_AdamW/f66d43d7-e449-4029-8adf-e8537bab49ea.log"),
    ("deepspeed-chat-logs", "step3_rlhf/actor_opt-1.3b_critic_opt-350m_globalBatchSize64.log"),
    ("llamafactory-mistral7b-translator-lora", "trainer_log.jsonl"),
    ("lightning-csv-slm-wikitext103", "lightning_logs/version_7/metrics.csv"),
]


@pytest.mark.parametrize(("run", "rel"), REAL_TEXT, ids=[r for r, _ in REAL_TEXT])
def test_real_line_logs_written_in_pieces_read_as_a_whole_read(
    tmp_path: Path, run: str, rel: str
) -> None:
    data = shared_path("real_runs", run, rel).read_bytes()[:150_000]
    tail = _follow(tmp_path, data, Path(rel).name, _cuts(data, 6, seed=len(rel)), _line_prefix)
    assert tail.run is not None
    assert all(t.mode == "incremental" for t in tail.sources.values())


def test_jsonl_lines_cut_anywhere_nothing_lost_or_repeated(tmp_path: Path) -> None:
    # a resumed job logs steps 150.. again after 199: a restart, appended like any line
    steps = [*range(200), *range(150, 300)]
    lines = [
        json.dumps({"step": i, "loss": 3 - i / 100, "lr": 1e-4, "epoch": i / 50}) for i in steps
    ]
    lines[120] = "not json at all"  # a bad line is counted once, at its own line number
    data = ("\n".join(lines) + "\n").encode()
    tail = _follow(tmp_path, data, "metrics.jsonl", _cuts(data, 15, seed=1), _line_prefix)
    assert tail.run is not None
    loss = tail.run.frame.filter(pl.col("metric") == "loss")
    assert loss.height == len(steps) - 1
    assert loss.get_column("segment").to_list() == [0] * 199 + [1] * 150
    assert any("line 121" in n for n in tail.run.notes)
    (st,) = tail.sources.values()
    assert st.appends > 3  # polls before the restart appended their rows alone


def _tensorboardx_steps(logdir: Path, steps: range, purge_step: int | None = None) -> None:
    from tensorboardX import SummaryWriter

    w = SummaryWriter(str(logdir), purge_step=purge_step)
    for s in steps:
        w.add_scalar("train/loss", 3.0 / (1 + s), s)
        w.add_scalar("train/grad_norm", 1.0 + (s % 7) / 10, s)
        if s % 20 == 0:  # histograms (protobuf records, per-layer vitals) now and then
            w.add_histogram("weights", np.linspace(-1, 1, 50) * (1 + s / 100), s)
    w.close()


def test_tensorboard_records_cut_mid_record(tmp_path: Path) -> None:
    src = tmp_path / "src"
    _tensorboardx_steps(src, range(60))
    (ev,) = src.glob("events.out.tfevents.*")
    data = ev.read_bytes()
    offs = walk(data, 1 << 30).offs.tolist()
    rng = random.Random(3)
    # at a record start, inside its length, its length CRC, its data and its data CRC
    cuts = {len(data)}
    for o in rng.sample(offs[1:], 12):
        cuts |= {o, o + 3, o + 9, o + 14, o + 30}
    cuts |= {rng.randrange(1, len(data)) for _ in range(10)}
    tail = _follow(
        tmp_path, data, ev.name, sorted(c for c in cuts if c <= len(data)), _record_prefix
    )
    assert tail.run is not None
    assert tail.run.frame.filter(pl.col("metric") == "loss").height == 60
    (st,) = tail.sources.values()
    assert st.mode == "incremental" and st.rereads == 1 and st.appends > 10


def test_torch_writer_live_and_restart_in_a_new_file(tmp_path: Path) -> None:
    from torch.utils.tensorboard import SummaryWriter  # its flush() drains the queue

    run = tmp_path / "run"
    tail = RunTail(run, OPTS)
    assert not tail.poll() and tail.run is None  # nothing there yet: no error
    w = SummaryWriter(str(run))
    for s in range(40):
        w.add_scalar("train/loss", 3.0 / (1 + s), s)
        if s % 10 == 9:
            w.flush()
            assert tail.poll()
            _same(tail, _whole(run), f"live step {s}")
    w.close()
    # The job restarts from step 25 in a new event file (purge_step), here tensorboardX's.
    _tensorboardx_steps(run, range(25, 50), purge_step=25)
    assert tail.poll()
    _same(tail, _whole(run), "after the restart")
    assert len(list(run.glob("events.out.tfevents.*"))) == 2
    assert any(f.kind.value == "restart" for f in tail.run.import_findings)  # type: ignore[union-attr]
    (st,) = tail.sources.values()
    assert st.rereads == 1  # the new file was added to the tail, not read from the start


def test_trainer_state_rewritten_whole_is_read_again(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    tail = RunTail(run, OPTS)
    history: list[dict[str, float]] = []
    for s in range(1, 6):
        history.append({"step": s * 10, "loss": 2.0 / s, "learning_rate": 1e-4, "epoch": s / 10})
        state = {"global_step": s * 10, "log_history": history, "max_steps": 100}
        tmp = run / "trainer_state.json.tmp"
        tmp.write_text(json.dumps(state, indent=2))
        os.replace(tmp, run / "trainer_state.json")  # HF writes the document whole
        assert tail.poll()
        _same(tail, _whole(run), f"save {s}")
    (st,) = tail.sources.values()
    assert st.mode == "reread" and st.rereads == 5
    assert not tail.poll()


def test_lightning_csv_logger_rewrite_with_a_new_column(tmp_path: Path) -> None:
    from lightning.pytorch.loggers import CSVLogger

    logger = CSVLogger(str(tmp_path), name="lg", version=0)
    run = tmp_path / "lg" / "version_0"
    tail = RunTail(run, OPTS)
    for s in range(30):
        logger.log_metrics({"train_loss": 2.0 / (1 + s)}, step=s)
        if s >= 20:
            logger.log_metrics({"val_loss": 2.5 / (1 + s)}, step=s)  # a new column: rewrite
        if s % 5 == 4:
            logger.save()
            assert tail.poll()
            _same(tail, _whole(run), f"save at step {s}")


def test_shrunk_or_replaced_file_is_read_from_the_start(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    log = run / "metrics.jsonl"
    rows = [json.dumps({"step": i, "loss": 1.0 + i}) for i in range(50)]
    log.write_text("\n".join(rows) + "\n")
    tail = RunTail(run, OPTS)
    assert tail.poll()
    # truncated in place to fewer lines with other values
    log.write_text("\n".join(json.dumps({"step": i, "loss": -1.0}) for i in range(10)) + "\n")
    assert tail.poll()
    _same(tail, _whole(run), "after truncation")
    # replaced by a new file (another inode) longer than the old one
    new = tmp_path / "new.jsonl"
    new.write_text("\n".join(json.dumps({"step": i, "loss": 5.0}) for i in range(80)) + "\n")
    os.replace(new, log)
    assert tail.poll()
    _same(tail, _whole(run), "after replacement")
    assert tail.run.frame.filter(pl.col("metric") == "loss").get_column(
        "value"
    ).unique().to_list() == [5.0]  # type: ignore[union-attr]


def test_a_new_log_file_is_picked_up(tmp_path: Path) -> None:
    """The next job of a chain: its own text log appears beside the event files."""
    run = tmp_path / "run"
    _tensorboardx_steps(run, range(20))
    tail = RunTail(run, OPTS)
    assert tail.poll()
    (run / "train.log").write_text("")  # created empty: claimed by nothing yet
    assert not tail.poll()
    src = shared_path("real_runs", "llmc-gpt2-124M-siddanthemani", "main.log").read_bytes()
    (run / "train.log").write_bytes(src[:20000])
    assert tail.poll()
    _same(tail, _whole(run), "after the log appeared")
    assert {k[0] for k in tail.sources} == {"tfevents", "text_logs"}


def test_bytes_read_follow_the_new_bytes(tmp_path: Path) -> None:
    from benchmarks.generate import series, write_jsonl, write_tfevents

    ser = series(3000)
    jl = write_jsonl(tmp_path / "src_jsonl", ser)
    ev = write_tfevents(tmp_path / "src_tb", ser)
    for src in (jl, ev):
        data = src.read_bytes()
        run = tmp_path / f"run_{src.name}"
        run.mkdir()
        dst = run / src.name
        cut = (_line_prefix if src is jl else _record_prefix)(data[: len(data) * 9 // 10])
        dst.write_bytes(cut)
        tail = RunTail(run, OPTS)
        tail.poll()
        first = tail.bytes_read
        assert first == len(cut)
        add = data[len(cut) : len(cut) + 20000]
        with dst.open("ab") as fh:
            fh.write(add)
        tail.poll()
        grew = tail.bytes_read - first
        assert len(add) <= grew <= len(add) + 512, (src.name, grew, len(add))
        assert not tail.poll() and tail.bytes_read - first == grew  # unchanged: nothing read


def test_nothing_is_written_into_the_run_folder(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _tensorboardx_steps(run, range(10))
    shutil.copy(
        shared_path("real_runs", "llamafactory-mistral7b-translator-lora", "trainer_log.jsonl"), run
    )

    def snapshot() -> dict[str, tuple[int, int]]:
        return {
            str(p.relative_to(run)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(run.rglob("*"))
        }

    before = snapshot()
    tail = RunTail(run, OPTS)
    assert tail.poll()
    assert not tail.poll()
    assert snapshot() == before


def test_compressed_log_is_read_again_whole_on_change(tmp_path: Path) -> None:
    import gzip

    run = tmp_path / "run"
    run.mkdir()
    tail = RunTail(run, OPTS)
    rows: list[str] = []
    for k in range(3):
        rows += [json.dumps({"step": i, "loss": 2.0 - i / 100}) for i in range(k * 20, k * 20 + 20)]
        (run / "metrics.jsonl.gz").write_bytes(gzip.compress(("\n".join(rows) + "\n").encode()))
        assert tail.poll()
        _same(tail, _whole(run), f"gzip rewrite {k}")
    (st,) = tail.sources.values()
    assert st.mode == "reread" and st.rereads == 3


def test_a_single_file_path_is_followed(tmp_path: Path) -> None:
    log = tmp_path / "train.jsonl"
    log.write_text(json.dumps({"step": 0, "loss": 2.0}) + "\n" + '{"step": 1, "lo')
    tail = RunTail(log, OPTS)
    assert tail.poll()
    assert tail.run is not None and tail.run.frame.height == 1  # the cut line waits
    with log.open("a") as fh:
        fh.write('ss": 1.5}\n')
    assert tail.poll()
    _same(tail, _whole(log), "the line completed")
    assert tail.run.frame.height == 2


def test_the_benchmark_runs_small(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks.watch_poll import main

    assert main(["--size", "2k", "--new", "100", "--data", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| tfevents | 2k (+100) |" in out and "| jsonl | 2k (+100) |" in out


LIVE_WANDB = """
import math, pathlib, sys, time, wandb
go = pathlib.Path(sys.argv[1])
run = wandb.init(project="forensics-test", mode="offline", name="live")
print("DIR=" + str(pathlib.Path(run.dir).parent), flush=True)
for s in range(3000):
    run.log({"train/loss": 3.0 - s / 100, "train/lr": 1e-4}, step=s)
print("HALF", flush=True)
while not go.exists():
    time.sleep(0.05)
for s in range(3000, 3100):
    run.log({"train/loss": 3.0 - s / 100, "train/lr": 1e-4}, step=s)
run.finish()
"""


def test_wandb_offline_client_live(tmp_path: Path) -> None:
    """The real wandb client writes its .wandb file while the tail polls (re-read on change:
    its records are framed in blocks the client writes itself, see tail_sources)."""
    import subprocess
    import sys
    import time

    pytest.importorskip("wandb")
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path)}
    env |= {"WANDB_SILENT": "true", "WANDB_CONSOLE": "off"}
    go = tmp_path / "go"
    proc = subprocess.Popen(
        [sys.executable, "-c", LIVE_WANDB, str(go)],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        run_dir = Path(proc.stdout.readline().strip().removeprefix("DIR="))
        assert proc.stdout.readline().strip() == "HALF"
        tail = RunTail(run_dir, OPTS)
        quiet_since, deadline = time.monotonic(), time.monotonic() + 30
        while time.monotonic() < deadline and time.monotonic() - quiet_since < 1.5:
            if tail.poll():
                quiet_since = time.monotonic()
            time.sleep(0.1)
        _same(tail, _whole(run_dir), "while the writer waits")
        assert tail.run is not None  # the client had written blocks of records mid-run
        go.touch()
        assert proc.wait(timeout=120) == 0
    finally:
        proc.kill()
    assert tail.poll()
    _same(tail, _whole(run_dir), "after run.finish()")
    assert tail.run is not None
    assert tail.run.frame.filter(pl.col("metric") == "loss").height == 3100
    assert {t.mode for t in tail.sources.values()} == {"reread"}


def test_a_new_event_file_with_only_its_header_is_no_error(tmp_path: Path) -> None:
    """A restarted job's writer opens its event file (the header record) before it logs a
    scalar: a poll in between sees records but no rows (this crashed the watcher once)."""
    from torch.utils.tensorboard import SummaryWriter

    run = tmp_path / "run"
    w = SummaryWriter(str(run), filename_suffix=".a")
    for s in range(20):
        w.add_scalar("train/loss", 3.0 / (1 + s), s)
    w.close()
    tail = RunTail(run, OPTS)
    assert tail.poll()
    w2 = SummaryWriter(str(run), filename_suffix=".b")  # writes the header record only
    w2.flush()
    assert len(list(run.glob("events.out.tfevents.*"))) == 2
    tail.poll()
    _same(tail, _whole(run), "after the header-only file")
    for s in range(20, 30):
        w2.add_scalar("train/loss", 3.0 / (1 + s), s)
    w2.close()
    assert tail.poll()
    _same(tail, _whole(run), "after the second file's scalars")
