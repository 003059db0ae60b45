"""The terminal summary says what reading the logs left out (a skipped line, a value not
used), under the verdict; before, those notes reached only the report, and a user reading the
terminal saw a green light with no word of the lines it never read."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

from typer.testing import CliRunner

from forensics.cli import app
from forensics.summary import MAX_READ_NOTES, read_note_lines

runner = CliRunner()


def _jsonl_with_bad_lines(path: Path) -> None:
    rng = random.Random(0)
    with path.open("w") as f:
        for s in range(1, 601):
            loss = 3 * math.exp(-s / 300) + 1 + rng.gauss(0, 0.02)
            f.write(json.dumps({"step": s, "loss": loss, "lr": 1e-4}) + "\n")
            if s % 200 == 0:
                f.write("{broken json\n")


def test_skipped_lines_are_said_under_the_verdict(tmp_path: Path) -> None:
    log = tmp_path / "run" / "metrics.jsonl"
    log.parent.mkdir()
    _jsonl_with_bad_lines(log)
    res = runner.invoke(app, ["analyze", str(log), "--no-report"])
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert "HEALTHY" in lines[0]
    assert lines[1] == (
        "Input: metrics.jsonl: skipped 3 line(s) that are not JSON objects (line 201, 402, 603)"
    )


def test_a_clean_log_prints_no_input_line(tmp_path: Path) -> None:
    log = tmp_path / "run" / "metrics.jsonl"
    log.parent.mkdir()
    log.write_text(
        "".join(json.dumps({"step": s, "loss": 3.0 / (1 + s / 50)}) + "\n" for s in range(300))
    )
    res = runner.invoke(app, ["analyze", str(log), "--no-report"])
    assert res.exit_code == 0, res.output
    assert "Input:" not in res.stdout
    # (the detectors' own notes, "eval_regression: not run ...", stay in the report)
    assert "not run" not in res.stdout


def test_many_input_notes_are_cut_with_a_count() -> None:
    notes = [f"note {i}" for i in range(MAX_READ_NOTES + 2)]
    lines = read_note_lines(notes)
    assert lines[:MAX_READ_NOTES] == [f"Input: note {i}" for i in range(MAX_READ_NOTES)]
    assert lines[-1] == "... and 2 more note(s) on the input in the report."


def test_which_trainers_lines_were_read_is_run_metadata_not_a_note() -> None:
    """ "read as megatron text log" left nothing out: it is the run section's `text_log`, not
    an Input line under every text log's verdict."""
    from pathlib import Path

    sample = Path(__file__).resolve().parents[1] / "sample_runs" / "loss_scale_collapse"
    res = runner.invoke(app, ["analyze", str(sample), "--no-report"])
    assert res.exit_code == 0, res.output
    assert "read as" not in res.stdout
    from forensics.importers import read_run

    run = read_run(sample)
    assert run.metadata["text_log"] == "megatron"
    assert not any("read as" in n for n in run.notes)
