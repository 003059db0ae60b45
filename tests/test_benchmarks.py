"""The benchmark suite runs end to end at its smallest size (untimed) and writes true data."""

from __future__ import annotations

import math

import numpy as np
import polars as pl

from benchmarks import generate
from benchmarks.__main__ import main, table, write_readme
from benchmarks.measure import exponent


def test_suite_smoke(tmp_path, capsys, monkeypatch):
    """`python -m benchmarks --smoke`: every format imports, analyzes and reads back from the
    cache, even from a shell that turned the cache off for its own commands (the suite's
    cache measurement then measured fresh parses, a ratio about 1.0)."""
    monkeypatch.setenv("FORENSICS_NO_CACHE", "1")
    results = main(["--smoke", "--data", str(tmp_path / "data")])
    assert {r["format"] for r in results} == {"tfevents", "jsonl", "megatron"}
    for r in results:
        assert r["cache_ok"], r
        assert r["import_cpu"] > 0 and r["analyze_cpu"] > 0
    assert "| tfevents | 2k |" in capsys.readouterr().out


def test_event_writer_matches_tensorboardx(tmp_path):
    """The direct record writer writes the bytes tensorboardX writes for add_scalar."""
    from tensorboardX import SummaryWriter

    w = SummaryWriter(str(tmp_path / "tbx"))
    for step, (tag, v) in enumerate(
        [("train/loss", 2.5), ("grad_norm/layers.3", 0.125), ("x", 1e30)]
    ):
        w.add_scalar(tag, v, step * 300, walltime=1.7e9 + step)
    w.close()
    ours = generate.EventWriter(tmp_path / "ours.tfevents")
    for step, (tag, v) in enumerate(
        [("train/loss", 2.5), ("grad_norm/layers.3", 0.125), ("x", 1e30)]
    ):
        ours.scalar(tag, v, step * 300, 1.7e9 + step)
    ours.close()
    (theirs,) = (tmp_path / "tbx").iterdir()
    a, b = theirs.read_bytes(), (tmp_path / "ours.tfevents").read_bytes()
    first = lambda buf: 16 + int.from_bytes(buf[:8], "little")  # noqa: E731 - skip file_version
    assert a[first(a) :] == b[first(b) :]


def test_generated_run_reads_like_tbparse(tmp_path):
    """tbparse and forensics read the same points from a generated event file."""
    from tbparse import SummaryReader

    from forensics.importers import ReadOptions, read_run

    ser = generate.series(1200)
    generate.write_tfevents(tmp_path / "run", ser)
    df = SummaryReader(str(tmp_path / "run"), extra_columns={"wall_time"}).scalars
    ref = pl.DataFrame({c: df[c].to_numpy() for c in df.columns}).sort("tag", "step")
    got = read_run(tmp_path / "run", options=ReadOptions(cache=False)).frame
    got = got.select("step", "tag", "value", "wall_time").sort("tag", "step")
    assert got.height == ref.height == ser.points
    assert got["tag"].cast(pl.Utf8).to_list() == ref["tag"].to_list()
    assert np.array_equal(got["step"].to_numpy(), ref["step"].to_numpy())
    assert np.array_equal(got["value"].to_numpy(), ref["value"].to_numpy().astype(np.float64))
    assert np.array_equal(got["wall_time"].to_numpy(), ref["wall_time"].to_numpy())


def test_scaling_exponent():
    """The exponent is the log-log slope: 1 for linear cost, 2 for quadratic."""
    xs = [1e4, 1e5, 1e6]
    assert math.isclose(exponent(xs, [2 * x for x in xs]), 1.0)
    assert math.isclose(exponent(xs, [x * x for x in xs]), 2.0)


def test_write_readme_replaces_the_table(tmp_path):
    """--write-readme replaces the table between its markers and leaves the rest alone."""
    readme = tmp_path / "README.md"
    readme.write_text("# x\n\nintro\n")
    write_readme("table one", readme)
    write_readme("table two", readme)
    text = readme.read_text()
    assert text.startswith("# x\n\nintro\n") and "table two" in text and "table one" not in text


def test_the_readme_block_holds_only_what_write_readme_writes():
    """The project README's benchmark block is the table (and exponents) that --write-readme
    writes, nothing else: notes kept by hand go after its end marker, where a refresh leaves
    them (inside, a refresh would drop them)."""
    from benchmarks.__main__ import BEGIN, END, ROOT

    body = (ROOT / "README.md").read_text()
    block = body[body.index(BEGIN) + len(BEGIN) : body.index(END)].strip("\n").splitlines()
    header = table([], {}, "WHERE", "WHEN").splitlines()
    assert block[0].startswith("Measured ") and block[0].endswith(header[0].split("WHERE")[1])
    assert block[1:6] == header[1:6]
    rest = [ln for ln in block[6:] if ln]
    exponents = "Scaling exponents (slope of log cost on log points over the sizes; 1 = linear):"
    for ln in rest:
        assert ln.startswith(("| ", "- ")) or ln == exponents, f"not a generated line: {ln[:60]}"


def test_stress_runs_hold_the_events_they_are_named_for(tmp_path):
    """Each event-dense kind of ``python -m benchmarks.stress`` is found as that event, once
    per interval: 3,000 steps hold 9 LR restarts, 10 dips, 17 coupled spikes, 10 loss spikes,
    2 resumes; the 9 stalls are one finding of recurring stalls with each one's step, and the
    9 shorter pauses one finding of the time they cost."""
    from collections import Counter

    from benchmarks.stress import KINDS, write
    from forensics.pipeline import analyze

    want = {
        "lr_restarts": ("lr_restart", 9),
        "dips": ("throughput_drop", 10),
        "coupled_spikes": ("grad_norm_spike", 17),
        "loss_spikes": ("loss_spike", 10),
        "resumes": ("restart", 2),
        "overflows": ("loss_scale_drop", 1),
        "stalls": ("stall", 1),
        "pauses": ("stall", 1),
    }
    assert set(want) == set(KINDS)
    for kind, (finding, count) in want.items():
        d = analyze(write(tmp_path / kind, kind, 3000))
        assert Counter(f.kind.value for f in d.findings)[finding] == count, kind
        if kind == "stalls":
            (f,) = [f for f in d.findings if f.kind.value == "stall"]
            assert f.measures["stalls"] == 9 and f.events_at is not None
            assert len(f.events_at) == 9


def test_stress_smoke(tmp_path, capsys):
    """The stress benchmark runs end to end at two small sizes (untimed) and gives each stage
    an exponent."""
    from benchmarks.stress import main as stress

    rows = stress(["--sizes", "2k,4k", "--kinds", "resumes", "--data", str(tmp_path)])
    stages = {r["stage"] for r in rows}
    assert {"import", "detector:spikes", "detector:resume_regression", "diagnose"} <= stages
    assert "resumes: 10,000 / 20,000 points" in capsys.readouterr().out  # (5 signs a step)


def test_tbparse_targets_apply_from_100k_steps():
    """The issue asks 30x tbparse of the 100k- and 1M-step runs: a 10k-step row, where
    starting Python is most of the import, shows its ratio without the target; JSONL's and
    Megatron's targets apply at every size."""

    def row(fmt: str, steps: int, ref: str) -> dict:
        return {
            "format": fmt,
            "steps": steps,
            "points": steps * 7,
            "import_wall": 0.3,
            "import_cpu": 0.3,
            f"ref_{ref}_wall": 2.0,
            f"ref_{ref}_cpu": 2.0,
            f"ratio_{ref}_wall": 0.15,
            f"ratio_{ref}_cpu": 0.15,
        }

    rows = [row("tfevents", 10_000, "tbparse"), row("tfevents", 100_000, "tbparse")]
    rows += [row("jsonl", 10_000, "polars")]
    text = table(rows, {}, "here", "now")
    cells = [ln.split("|") for ln in text.splitlines() if ln.startswith("| ")]
    target = {(c[1].strip(), c[2].strip()): c[8].strip() for c in cells}
    assert target[("tfevents", "10k")] == ""
    assert target[("tfevents", "100k")] == ">= 30"
    assert target[("jsonl", "10k")] == "<= 1.5"
