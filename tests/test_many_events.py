"""Runs with thousands of events: the searches that replaced per-event scans of the whole
series give what the rule they stand for gives, and a long run's many scheduled dips are
still one schedule (issue 17: no detector's cost grows faster than the points it reads).

Found by crafted stress runs of 100k and 1M steps: an LR restarted every 300 steps (the spike
search's LR kinks 239 s, lr_restart 15.5 s at 1M), a throughput dip every 250 steps (3.2 s),
6,665 warnings (5.2 s of diagnosis), 5,000 regular loss spikes (the periodicity's Monte Carlo
2.4 s), a loss climbing briefly every 200 steps (the divergence search 2.5 s).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from synthetic import long_frame, run_from_frame

from forensics.evidence import Evidence, Series
from forensics.evidence.spike_context import lr_kinks
from forensics.evidence.trend_utils import first_at_least, first_below, last_not_above
from forensics.findings import Finding, FindingKind, Severity
from forensics.incidents import build_incidents
from forensics.pipeline import analyze


def _jsonl(folder: Path, columns: dict[str, np.ndarray]) -> Path:
    n = len(next(iter(columns.values())))
    folder.mkdir(parents=True, exist_ok=True)
    rows = (
        json.dumps({"step": i, **{k: float(v[i]) for k, v in columns.items()}}) for i in range(n)
    )
    (folder / "metrics.jsonl").write_text("\n".join(rows) + "\n")
    return folder


def test_the_block_searches_find_the_first_index_a_scan_finds() -> None:
    rng = np.random.default_rng(5)
    v = rng.standard_normal(5000)
    v[rng.choice(5000, 200, replace=False)] = np.nan
    for start in (0, 1, 255, 256, 257, 3000, 4999, 5000, 6000):
        for line in (-10.0, 0.5, 2.5, 3.2, 10.0):
            hit = np.flatnonzero(v[start:] >= line)
            want = start + int(hit[0]) if len(hit) else len(v)
            assert first_at_least(v, start, line) == want
            hit = np.flatnonzero(v[start:] < line)
            want = start + int(hit[0]) if len(hit) else len(v)
            assert first_below(v, start, line) == want
            hit = np.flatnonzero(~(v[:start] > line))
            assert last_not_above(v, start, line) == (int(hit[-1]) if len(hit) else -1)


def test_a_hundred_checkpoint_dips_are_one_schedule(tmp_path: Path) -> None:
    """A 100k-step run whose throughput dips for 20 steps every 1,000 (a checkpoint save's):
    its 99 dips had read as 99 warnings and 99 incidents of a healthy run, because the grid
    search (cubic in the drops) was not tried past 60 of them."""
    rng = np.random.default_rng(12)
    n = 100_000
    s = np.arange(n)
    tp = 1e5 * (1 + 0.01 * rng.standard_normal(n))
    for k in range(1000, n, 1000):
        tp[k : k + 20] *= 0.3
    d = analyze(
        _jsonl(
            tmp_path / "run",
            {
                "loss": 2 + 3 / (1 + s / 500) + rng.normal(0, 0.02, n),
                "grad_norm": 1.0 + 0.05 * rng.standard_normal(n),
                "tokens_per_sec": tp,
            },
        )
    )
    drops = [f for f in d.findings if f.kind is FindingKind.THROUGHPUT_DROP]
    assert [f.start_step for f in drops] == list(range(1000, n, 1000))
    assert {f.severity for f in drops} == {Severity.INFO}
    assert {(f.measures["recurs_every"], f.measures["recurrences"]) for f in drops} == {(1000, 99)}
    assert d.verdict == "healthy" and d.incidents == []


def _drop(start: int, width: int = 15) -> Finding:
    return Finding(
        FindingKind.THROUGHPUT_DROP,
        Severity.WARNING,
        "throughput",
        start,
        "a drop",
        start,
        start + width,
        {"shape": "sudden", "recovered": True, "source": "throughput"},
    )


def test_drops_at_random_steps_make_no_schedule() -> None:
    """4,000 drops at random steps over 1M: some dozens sit on a grid by chance (54 on one of
    3,461 steps at three in four of its points); a schedule must hold at least half of
    them. A grid that does, with random drops beside it, is still found."""
    from forensics.detectors.throughput import _on_one_grid

    rng = np.random.default_rng(0)
    random = [_drop(int(s)) for s in np.sort(rng.choice(1_000_000, 4000, replace=False))]
    assert _on_one_grid(random, 1.0) == ([], 0)
    grid = np.arange(1000, 400_000, 1000)
    noise = rng.choice(np.setdiff1d(np.arange(400_000), grid), 100, replace=False)
    mixed = [_drop(int(s)) for s in np.sort(np.concatenate([grid, noise]))]
    on, period = _on_one_grid(mixed, 1.0)
    assert period == 1000
    assert set(grid) <= {f.start_step for f in on}
    assert len(on) < len(mixed)  # (the random ones off the grid stay drops)


def test_an_lr_restarted_every_300_steps_has_each_restart_found() -> None:
    steps = np.arange(30_000)
    lr = 3e-4 * 0.5 * (1 + np.cos(np.pi * (steps % 300) / 300))
    kinks = lr_kinks(Series(steps, lr))
    restarts = [k.step for k in kinks if k.kind == "restart"]
    assert restarts == list(range(300, 30_000, 300))
    # (no other kink within the reach of a restart: the suppression searches the kept steps)
    others = [k.step for k in kinks if k.kind != "restart"]
    assert all(min(abs(o - r) for r in restarts) > 3 for o in others)


def test_a_climb_after_two_hundred_brief_ones_is_still_found_from_its_onset() -> None:
    """The divergence search finds each climb's return and onset by a search; a loss that
    climbs and comes back every 200 steps, then climbs for good with its grad norm, is a
    divergence from the last climb's onset."""
    n = 45_000
    steps = np.arange(n)
    rng = np.random.default_rng(1)
    loss = 3.0 + 0.005 * rng.standard_normal(n)
    for s in range(1000, 40_000, 200):
        loss[s : s + 30] *= 1.6
    grad = 1.0 + 0.02 * rng.standard_normal(n)
    loss[42_000:] *= np.linspace(1.0, 3.0, n - 42_000)
    grad[42_000:] *= np.linspace(1.0, 6.0, n - 42_000)
    run = run_from_frame(
        long_frame({"train/loss": (steps, loss), "train/grad_norm": (steps, grad)})
    )
    from forensics.detectors.divergence import DivergenceDetector

    (f,) = DivergenceDetector().divergences(Evidence(run))
    assert 42_000 <= f.start_step <= 42_300


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_overlapping_onsets_join_as_the_pairwise_rule_says(seed: int) -> None:
    """The incident pass over onsets that cannot be ordered looks only at the pairs that can
    overlap; on warnings with and without fitted onset ranges it joins exactly what checking
    every pair joins."""
    rng = np.random.default_rng(seed)
    found = []
    for k in range(400):
        start = int(rng.integers(0, 200_000))
        ranged = rng.random() < 0.1
        lo, hi = start - int(rng.integers(0, 3000)), start + int(rng.integers(0, 3000))
        found.append(
            Finding(
                FindingKind.MEMORY_GROWTH if ranged else FindingKind.THROUGHPUT_DROP,
                Severity.WARNING if rng.random() < 0.8 else Severity.INFO,
                f"m{k}",
                start,
                "a sign",
                start,
                start + 10,
                onset_range=(lo, hi) if ranged else None,
            )
        )
    got = {frozenset(i.indexes) for i in build_incidents(found, [[]] * len(found))}
    # Every pair, as the rule reads: touching onsets (within TOUCH_STEPS) or overlapping onset
    # ranges of two warnings join.
    from forensics.incidents import TOUCH_STEPS

    parent = list(range(len(found)))

    def root(i: int) -> int:
        while parent[i] != i:
            i = parent[i]
        return i

    for i, a in enumerate(found):
        for j, b in enumerate(found):
            if i >= j:
                continue
            touch = abs(a.start_step - b.start_step) <= TOUCH_STEPS
            acting = Severity.INFO not in (a.severity, b.severity)
            (alo, ahi), (blo, bhi) = a.onset_bounds, b.onset_bounds
            if touch or (acting and alo <= bhi and blo <= ahi):
                parent[root(j)] = root(i)
    groups: dict[int, set[int]] = {}
    for i in range(len(found)):
        groups.setdefault(root(i), set()).add(i)
    want = {
        frozenset(g)
        for g in groups.values()
        if any(found[i].severity is not Severity.INFO for i in g)
    }
    assert got == want


def test_a_hundred_regular_spikes_are_one_incident(tmp_path: Path) -> None:
    """Periodic spikes are one recurring event: every spike they hold joins their incident.
    They named their first 20 onsets only, so a run's later spikes each made an incident of
    their own (6,645 incidents for 6,664 spikes every 150 steps over 1M)."""
    n = 30_000
    rng = np.random.default_rng(4)
    s = np.arange(n)
    loss = 2 + 3 / (1 + s / 500) + rng.normal(0, 0.01, n)
    gn = 1.0 + 0.03 * rng.standard_normal(n)
    spikes = list(range(600, n - 300, 300))
    for k in spikes:
        gn[k : k + 3] *= 6
        loss[k + 1 : k + 20] *= 1.3
    d = analyze(_jsonl(tmp_path / "run", {"loss": loss, "grad_norm": gn}))
    periodic = [f for f in d.findings if f.kind is FindingKind.PERIODIC_SPIKES]
    assert periodic and all(len(f.events_at or ()) >= len(spikes) - 1 for f in periodic)
    assert len(spikes) > 20
    acting = [f for f in d.findings if f.severity is not Severity.INFO]
    assert len(d.incidents) == 1
    (inc,) = d.incidents
    assert set(map(id, acting)) <= set(map(id, inc.findings))


def test_a_job_resumed_fifty_times_has_each_resume_counted(tmp_path: Path) -> None:
    """Every resume's counts come from one pass over the rows (a pass over the earlier
    segments at each resume made a job resumed 200 times take 6 s to read). The job runs
    1,000 steps, then resumes 100 steps back; at the 30th resume its LR is halved."""
    rng = np.random.default_rng(2)
    lines, step = [], 0
    for seg in range(51):
        for k in range(1000):
            lr = 3e-4 * (0.5 if seg >= 30 else 1.0)
            lines.append(
                json.dumps(
                    {
                        "step": step + k,
                        "loss": 3 + 0.01 * rng.standard_normal(),
                        "lr": lr,
                        "grad_norm": 1 + 0.05 * rng.standard_normal(),
                    }
                )
            )
        step += 900
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    from forensics.importers import ReadOptions, read_run

    run = read_run(tmp_path / "run", options=ReadOptions(cache=False))
    found = [f for f in run.import_findings if f.kind is FindingKind.RESTART]
    assert [f.start_step for f in found] == [900 * s for s in range(1, 51)]
    for f in found:
        m = f.measures
        assert (m["steps_replayed"], m["points_replayed"], m["points_repeated"]) == (100, 300, 300)
        assert m["counter"] == "step"
    halved = [f for f in found if f.measures["lr_step"] is not None]
    assert [f.start_step for f in halved] == [900 * 30]
    (h,) = halved
    assert h.measures["lr_after"] == pytest.approx(h.measures["lr_before"] / 2)
    assert h.measures["lr_reshaped"] is False
