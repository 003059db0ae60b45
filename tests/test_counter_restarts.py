"""Issue 14: restarts seen in any counter that starts again (step, epoch, consumed samples or
tokens, elapsed time), the counter named; two writers interleaving lines are no restart."""

from __future__ import annotations

import json
from pathlib import Path

from forensics.findings import FindingKind
from forensics.importers import read_run


def _restarts(run):  # noqa: ANN001, ANN202
    return [f for f in run.import_findings if f.kind == FindingKind.RESTART]


def test_hf_epoch_goes_back_while_step_continues(tmp_path: Path) -> None:
    """HF Trainer log lines (shape of ``Trainer.log``): a resume that keeps counting steps but
    restarts the epoch at 0."""
    rows = []
    for s in range(10, 410, 10):
        epoch = s / 200 if s <= 200 else (s - 200) / 200
        rows.append({"loss": 3.0 - s * 0.001, "grad_norm": 0.5, "epoch": epoch, "step": s})
    p = tmp_path / "log_history.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    run = read_run(p)
    found = _restarts(run)
    assert len(found) == 1, [f.summary for f in found]
    assert found[0].measures["counter"] == "epoch"
    assert found[0].measures["resumed_from_step"] == 210
    assert "epoch" in found[0].summary
    assert run.series("loss").height == 40  # nothing pre-empted: the steps never overlap


def test_llamafactory_elapsed_time_starts_again(tmp_path: Path) -> None:
    """LLaMA-Factory ``trainer_log.jsonl``: ``current_steps`` goes on, ``elapsed_time``
    (H:MM:SS) starts again in the resumed job."""
    rows = []
    for s in range(5, 205, 5):
        t = s * 12 if s <= 100 else (s - 100) * 12
        h, m, sec = t // 3600, (t % 3600) // 60, t % 60
        rows.append(
            {
                "current_steps": s,
                "total_steps": 200,
                "loss": 2.0 - s * 0.001,
                "lr": 1e-4,
                "epoch": s / 200,
                "percentage": s / 2,
                "elapsed_time": f"{h}:{m:02d}:{sec:02d}",
                "remaining_time": "0:10:00",
            }
        )
    p = tmp_path / "trainer_log.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    found = _restarts(read_run(p))
    assert len(found) == 1, [f.summary for f in found]
    assert found[0].measures["counter"] == "elapsed time"
    assert found[0].measures["resumed_from_step"] == 105


def test_consumed_samples_go_back_in_a_text_log(tmp_path: Path) -> None:
    lines = []
    for s in range(1, 121):
        consumed = s * 32 if s <= 60 else (s - 60) * 32
        lines.append(f"step {s} | loss: {3.0 - s * 0.01:.3f} | consumed_samples: {consumed}")
    p = tmp_path / "train.log"
    p.write_text("\n".join(lines) + "\n")
    found = _restarts(read_run(p))
    assert [f.measures["counter"] for f in found] == ["consumed_samples"]
    assert found[0].measures["resumed_from_step"] == 61


def test_interleaved_writers_are_no_restart(tmp_path: Path) -> None:
    """Two ranks appending to one file: rank 1 runs a step behind rank 0, so the steps go
    10, 9, 11, 10, 12, ... Read as one job with a note, no restart."""
    rows = []
    for s in range(1, 200):
        rows.append({"step": s, "loss": 3.0 - s * 0.01, "rank": 0})
        if s > 1:
            rows.append({"step": s - 1, "loss": 3.0 - (s - 1) * 0.01, "rank": 1})
    p = tmp_path / "metrics.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    run = read_run(p)
    assert _restarts(run) == []
    assert any("two writers" in n for n in run.notes), run.notes


def test_step_restart_still_named_step(tmp_path: Path) -> None:
    rows = [{"step": s, "loss": 3.0 - s * 0.01} for s in range(1, 101)]
    rows += [{"step": s, "loss": 3.0 - s * 0.01} for s in range(80, 151)]
    p = tmp_path / "metrics.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    found = _restarts(read_run(p))
    assert len(found) == 1 and found[0].measures["counter"] == "step"
    assert found[0].measures["resumed_from_step"] == 80


def test_restart_gap_in_words(tmp_path: Path) -> None:
    """The restart's wall-clock gap reads as a duration ("8 s", "3 min", "2.5 h"), never
    "0.0 min"; a first record stamped before the last one before it is said so, not given as
    a negative time."""
    from forensics.importers.restarts import duration_text

    assert [duration_text(x) for x in (0.2, 8, 119.4, 180, 9000)] == [
        "under a second",
        "8 s",
        "119 s",
        "3 min",
        "2.5 h",
    ]
    for gap, said in ((8.0, ", 8 s after the last record"), (-90.0, "stamped 90 s before")):
        rows = [{"step": s, "loss": 3.0, "_timestamp": 1.7e9 + s} for s in range(0, 100, 10)]
        last = rows[-1]["_timestamp"]
        rows += [
            {"step": s, "loss": 2.9, "_timestamp": last + gap + (s - 50)}
            for s in range(50, 150, 10)
        ]
        p = tmp_path / f"gap{gap:g}.jsonl"
        p.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
        (found,) = _restarts(read_run(p))
        assert said in found.summary, found.summary
        assert "min after" not in found.summary
