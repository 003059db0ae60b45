"""The spike shapes' fast path gives the straightforward computation's numbers, bit for bit.

The reference is ``tests/spike_reference.py``: Theil-Sen, the trend fit and the shape measures
as they were before the fast path (every pairwise slope gathered and partitioned, np.median
everywhere). Compared on real logs (../shared/real_runs), on the bench generator's run and on
random series with ties, zeros of both signs, tiny and huge values, NaN, short windows and
log-scale series. Floats are compared by their bits (NaN equal to NaN).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import spike_reference as ref
from conftest import shared_path
from synthetic import long_frame, run_from_frame

from forensics.config import Config
from forensics.evidence import Evidence, order_stats
from forensics.evidence.robust import theil_sen, theil_sen_line, theil_sen_with_half
from forensics.evidence.spike_shape import ShapeParams, fit_trend, log_steps, measure
from forensics.importers import read_run
from forensics.params import SpikesParams


def _bits(v: Any) -> Any:
    """A value with every float replaced by its bit pattern (so -0.0 != 0.0, NaN == NaN)."""
    if isinstance(v, (float, np.floating)):
        return ("f", np.float64(v).tobytes())
    if isinstance(v, (np.integer, np.bool_)):
        return v.item()
    if isinstance(v, np.ndarray):
        return [_bits(x) for x in v.tolist()]
    if isinstance(v, dict) or hasattr(v, "items"):
        return {k: _bits(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_bits(x) for x in v]
    return v


def _spikes(spikes: list) -> list:
    return _bits(
        [
            (s.metric, s.start_step, s.peak_step, s.end_step, s.alarm_at, dict(s.measures))
            for s in spikes
        ]
    )


def _series(rng: np.random.Generator, n: int, kind: int) -> np.ndarray:
    """A random series of one of the kinds the fast path has to agree on."""
    if kind == 0:  # continuous noise
        return rng.standard_normal(n)
    if kind == 1:  # printed with one decimal: many ties, zeros
        return np.round(rng.standard_normal(n), 1)
    if kind == 2:  # a positive series printed with two decimals, in log units (exact zeros)
        return np.log(np.round(1.0 + rng.random(n), 2))
    if kind == 3:  # constant but for one point
        y = np.zeros(n)
        y[rng.integers(0, n)] = 1.0
        return y
    if kind == 4:  # a slow random walk
        return np.cumsum(rng.standard_normal(n)) * 1e-3
    if kind == 5:  # signed zeros among ties
        return rng.choice(np.array([-0.0, 0.0, 1.0, -1.0]), n)
    if kind == 6:  # tiny and huge magnitudes (subnormal differences, overflowing ones)
        return rng.choice(np.array([5e-324, 1e-310, 0.0, 1e308, -1e308, 1.0]), n)
    y = rng.standard_normal(n)  # non-finite values
    y[rng.integers(0, n, size=2)] = rng.choice(np.array([np.nan, np.inf, -np.inf]), 2)
    return y


def _abscissa(rng: np.random.Generator, n: int) -> np.ndarray:
    if rng.random() < 0.5:  # every step from somewhere in the run
        steps = np.arange(n) + int(rng.integers(0, 10**6))
    else:  # sparse, irregular steps
        steps = np.sort(rng.choice(np.arange(1, 10 ** int(rng.integers(3, 8))), n, replace=False))
    return log_steps(steps)


def test_theil_sen_equals_the_straightforward_fit() -> None:
    rng = np.random.default_rng(17)
    for _ in range(600):
        n = int(rng.choice([2, 3, 5, 39, 40, 41, 64, 80, 81, 150, 151, 299, 300]))
        x, y = _abscissa(rng, n), _series(rng, n, int(rng.integers(0, 8)))
        if rng.random() < 0.05:  # repeated abscissae: pairs with dx = 0 are left out
            x = np.sort(np.round(x, 1))
        with np.errstate(all="ignore"):
            want = ref.theil_sen(x, y)
            assert _bits(theil_sen(x, y)) == _bits(want), (n, x, y)
            assert _bits(theil_sen_line(x, y)) == _bits(want[:2])
            whole, half = theil_sen_with_half(x, y)
            assert _bits(whole) == _bits(want)
            if half is not None:  # the first half's line from the whole's slopes
                assert _bits(half) == _bits(ref.theil_sen(x[: n // 2], y[: n // 2])[:2])


def test_fast_path_is_taken_on_log_windows() -> None:
    """The fast path is what a log's trend window gets (not only the plain fallback)."""
    rng = np.random.default_rng(3)
    x = log_steps(np.arange(5000, 5300))
    assert order_stats.plain_for_slopes(x, np.log(2.0 + rng.random(300)))
    assert order_stats.plain_for_slopes(x, np.log(np.round(1.0 + rng.random(300), 2)))  # +0.0
    assert not order_stats.plain_for_slopes(x, np.where(np.arange(300) == 7, -0.0, 1.0))
    assert not order_stats.plain_for_slopes(x[::-1], np.ones(300))


def test_median_equals_numpy() -> None:
    rng = np.random.default_rng(5)
    for _ in range(2000):
        n = int(rng.integers(1, 40))
        a = _series(rng, n, int(rng.integers(0, 8)))
        with np.errstate(all="ignore"):
            assert _bits(order_stats.median(a)) == _bits(np.median(a)), a
        inc = np.unique(a[np.isfinite(a)])
        if len(inc):
            assert _bits(order_stats.median_of_increasing(inc)) == _bits(np.median(inc))


def test_select_equals_partition() -> None:
    """Bracketed selection returns np.partition's values, ties and sample misses included
    (the sign of a zero aside: order statistics do not define it, see order_stats)."""
    rng = np.random.default_rng(9)
    for _ in range(60):
        n = int(rng.choice([100, 2500, 11175, 44850]))
        a = np.round(rng.standard_normal(n) * rng.choice([1.0, 1e-3]), int(rng.integers(1, 4)))
        if rng.random() < 0.3:  # a sorted or periodic layout: the strided sample is biased
            a = np.sort(a) if rng.random() < 0.5 else np.tile(a[:7], n // 7 + 1)[:n]
        mid = n // 2
        ks = sorted({int(rng.integers(0, mid)), mid - 1, mid, int(rng.integers(mid, n))})
        got = order_stats.select(a, ks) + 0.0
        assert _bits(got) == _bits(np.partition(a, ks)[ks] + 0.0)


def test_fit_trend_equals_the_straightforward_fit() -> None:
    rng = np.random.default_rng(11)
    p = ShapeParams.of(SpikesParams())
    for _ in range(150):
        n = int(rng.integers(2, 420))
        steps = np.cumsum(rng.integers(1, 4, size=n)) + int(rng.integers(0, 10**5))
        kind = int(rng.choice([0, 1, 2, 4]))
        y = _series(rng, n, kind)
        onset = int(rng.integers(0, n))
        got = fit_trend(steps, y, onset, 0.5, 0.01, p)
        assert _bits(vars(got)) == _bits(vars(ref.fit_trend(steps, y, onset, 0.5, 0.01, p)))


def _compare_runs(run: Any) -> int:
    """Every metric's spikes from the evidence (fast path) equal the reference's; how many."""
    ev = Evidence(run, Config().params)
    total = 0
    for metric in run.metrics():
        fast = ev.spikes(metric)
        assert _spikes(fast) == _spikes(ref.find_spikes(ev, metric)), metric
        total += len(fast)
    return total


REAL = [
    "llmc-gpt2-124M-hectorfcardenas/gpt2_train.11685414.log",
    "llmc-gpt2-124M-siddanthemani/main.log",
    "modded-nanogpt/2024-10-10_Muon/eb5659d0-fb6a-49e5-a311-f1f89412f726.txt",
    "modded-nanogpt/2024-10-13_llmc/main.log",
    "hf-trainer-baize-tcm-lora/trainer_state.json",
    "llamafactory-mistral7b-translator-lora/trainer_state.json",
    "bigscience-megatron-experiments/meg_gpt2_base_n16_dp1_tp4_pp16-1809577.out",
]


def test_real_logs_spikes_equal_the_reference() -> None:
    total = sum(_compare_runs(read_run(shared_path("real_runs", *rel.split("/")))) for rel in REAL)
    assert total >= 80  # the logs' grad-norm outliers and loss spikes are all compared


def test_generated_run_spikes_equal_the_reference(tmp_path: Any) -> None:
    """The bench generator's run (the 1M-step benchmark's shape, 20k steps): thousands of
    grad-norm outliers measured on 300-point trend windows."""
    from benchmarks.generate import series, write_jsonl

    write_jsonl(tmp_path / "run", series(20_000))
    assert _compare_runs(read_run(tmp_path / "run")) >= 50


@pytest.mark.parametrize("seed", range(6))
def test_random_series_spikes_equal_the_reference(seed: int) -> None:
    """Random positive (log-scale) and signed series with injected spikes, ties, NaN and
    sparse steps."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(30, 3000))
    steps = np.cumsum(rng.integers(1, 3 if seed % 2 else 12, size=n))
    level = np.exp(-np.linspace(0, 1, n)) * 3.0
    loss = level * np.exp(rng.standard_normal(n) * 0.02)
    gn = np.abs(rng.standard_normal(n)) * 0.1 + 1.0
    signed = np.round(rng.standard_normal(n), 1 + seed % 3)
    for arr in (loss, gn, signed):
        hits = rng.integers(1, n, size=max(1, n // 150))
        arr[hits] = arr[hits] * rng.choice([3.0, 8.0]) + (arr is signed) * 8.0
    loss[rng.integers(0, n, size=2)] = np.nan
    if seed % 3 == 0:
        gn = np.round(gn, 2)  # a printed grad norm: exact ties, log 1.0 = 0.0
    tags = {"loss": (steps, loss), "grad_norm": (steps, gn), "custom/x": (steps, signed)}
    frame = long_frame(tags)
    assert _compare_runs(run_from_frame(frame)) >= 1


def test_measure_without_series_arrays_is_the_same() -> None:
    """``measure`` called alone (no precomputed xs / ys) gives what find_spikes' call gives."""
    rng = np.random.default_rng(2)
    steps = np.arange(1, 2001)
    values = np.exp(rng.standard_normal(2000) * 0.05)
    values[1000] *= 6.0
    kw: dict[str, Any] = dict(
        onset=1000, peak=1000, log_scale=True, sigma=0.05, baseline_at_peak=1.0, alarm=0.7,
        p=ShapeParams.of(SpikesParams()), barriers=[1500],
    )  # fmt: skip
    alone = measure(steps, values, **kw)
    shared = measure(steps, values, xs=log_steps(steps), ys=np.log(values), **kw)
    assert _bits(alone) == _bits(shared) == _bits(ref.measure(steps, values, **kw))
    assert not math.isnan(float(alone["excess_area"]))


def test_row_order_statistics_equal_the_one_dimensional_ones() -> None:
    """The row functions the batch fits with give, row by row, the 1-D functions' numbers."""
    rng = np.random.default_rng(23)
    for _ in range(300):
        n = int(rng.choice([2, 3, 80, 81, 150, 300, 301]))
        k = int(rng.integers(1, 6))
        steps = np.sort(rng.choice(np.arange(1, 10**6), (k, n)), axis=1) + np.arange(n)
        x = log_steps(steps)
        if rng.random() < 0.1:  # a repeated abscissa
            x[:, n // 2] = x[:, n // 2 - 1]
        y = np.stack([_series(rng, n, int(rng.integers(0, 8))) for _ in range(k)])
        flags = order_stats.plain_for_slopes_rows(x, y)
        inc = order_stats.median_of_increasing_rows(x)
        finite = np.isfinite(y).all(axis=1)
        med = order_stats.median_rows(np.where(finite[:, None], y, 0.0))
        for r in range(k):
            assert flags[r] == order_stats.plain_for_slopes(x[r], y[r])
            if (x[r, 1:] > x[r, :-1]).all():
                assert _bits(inc[r]) == _bits(order_stats.median_of_increasing(x[r]))
            if finite[r]:
                assert _bits(med[r]) == _bits(np.median(y[r]))


def _spiky(rng: np.random.Generator, n: int, log: bool) -> tuple[np.ndarray, np.ndarray]:
    steps = np.cumsum(rng.integers(1, 3, size=n)) + int(rng.integers(0, 10**5))
    level = np.exp(-np.linspace(0, 2, n)) * 3.0 + 0.5
    v = level * np.exp(rng.standard_normal(n) * rng.choice([0.01, 0.05]))
    if rng.random() < 0.3:
        v = np.round(v, 2)  # printed: ties
    if not log:
        v = v - 1.5  # a signed series
    return steps, v


def test_measure_many_equals_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    """``measure_many`` gives each spike the reference's measures: batched spikes (back within
    the first points) and the ones it hands to ``measure`` (slow recoveries, the end of the
    log, short trend windows, steps beyond a barrier), log-scale and signed series."""
    from forensics.evidence import shape_batch

    handed: list[int] = []
    one = shape_batch.measure

    def counted(*a: Any, **kw: Any) -> Any:
        handed.append(kw["peak"])
        return one(*a, **kw)

    monkeypatch.setattr(shape_batch, "measure", counted)
    p = ShapeParams.of(SpikesParams())
    rng = np.random.default_rng(29)
    batched = total = 0
    for trial in range(24):
        log = trial % 3 != 2
        n = int(rng.integers(400, 3000))
        steps, values = _spiky(rng, n, log)
        peaks = np.unique(rng.integers(1, n, size=int(rng.integers(5, 40))))
        spikes = []
        for pk in peaks:
            values[pk] = values[pk] * 4.0 if log else values[pk] + 3.0
            onset = int(pk)
            if rng.random() < 0.2 and pk > 2:  # a spike that builds over two points
                onset = int(pk) - 1
                values[onset] = values[onset] * 2.0 if log else values[onset] + 1.5
            if rng.random() < 0.15:  # a slow decay back (recovery beyond the batch's reach)
                tail = np.arange(pk + 1, min(n, pk + 40))
                values[tail] = values[tail] * (1.0 + np.linspace(2, 0, len(tail)) if log else 1)
            sig = float(rng.choice([0.01, 0.05, 0.2]))
            base = float(np.median(values[max(0, pk - 20) : pk])) if pk > 0 else 1.0
            spikes.append(shape_batch.SpikeInput(onset, int(pk), sig, base, 0.5 * (trial % 2)))
        barriers = [int(steps[n // 2])] if trial % 4 == 0 else None
        interval = float(np.median(np.diff(steps)))
        xs = log_steps(steps)
        ys = np.log(values) if log else values.astype(float)
        handed.clear()
        got = shape_batch.measure_many(
            steps, values, spikes, log_scale=log, p=p, barriers=barriers, interval=interval,
            xs=xs, ys=ys,
        )  # fmt: skip
        for s, m in zip(spikes, got, strict=True):
            want = ref.measure(
                steps, values, onset=s.onset, peak=s.peak, log_scale=log, sigma=s.sigma,
                baseline_at_peak=s.baseline_at_peak, alarm=s.alarm, p=p, barriers=barriers,
                interval=interval,
            )  # fmt: skip
            assert _bits(m) == _bits(want), (trial, s)
        total += len(spikes)
        batched += len(spikes) - len(handed)
    assert batched >= total // 2 and total - batched >= 20  # both paths are compared


def test_resolution_of_a_long_series_equals_the_distinct_values_one() -> None:
    """``robust.resolution`` sorts the values with their repeats and reads the positive
    neighbour differences: the same number as from np.unique's distinct values (ties, both
    signs of zero, fewer than three distinct values, NaN and Inf left out), long or short."""
    from forensics.evidence import robust

    def by_unique(values: np.ndarray) -> float:
        u = np.unique(values[np.isfinite(values)])
        if len(u) < 3:
            return 0.0
        d = np.diff(u)
        d = d[d > 0]
        return float(np.percentile(d, 5)) if len(d) else 0.0

    rng = np.random.default_rng(41)
    n = 100_000
    cases = [
        np.round(np.exp(rng.standard_normal(n)), 3),
        rng.standard_normal(n + 17),
        np.round(rng.standard_normal(n), 1) * np.where(rng.random(n) < 0.5, -1.0, 1.0),
        np.tile([0.0, -0.0, 1.0], n // 3 + 1),
        np.tile([2.0, 2.0, 5.0], n // 3 + 1),
        np.where(rng.random(n) < 0.01, np.nan, np.round(rng.random(n), 2)),
        np.where(rng.random(n) < 0.01, np.inf, rng.random(n)),
    ]
    for v in cases + [c[:1000] for c in cases] + [c[:3] for c in cases]:
        assert _bits(robust.resolution(v)) == _bits(by_unique(v))
    shifted = cases[0].copy()
    shifted[: n // 2] += 0.0004  # a finer spacing appears: the number moves
    assert robust.resolution(shifted) != robust.resolution(cases[0])


def test_median_of_ints_equals_numpy() -> None:
    """``order_stats.median_of_ints`` is ``float(np.median(a))``, bit for bit: step
    differences with runs of equal values (where numpy's partition is slow), odd and even
    lengths, negative and large values; other dtypes go through np.median."""
    rng = np.random.default_rng(43)
    cases = [np.ones(1001, dtype=np.int64), np.array([3], dtype=np.int64)]
    for _ in range(300):
        n = int(rng.integers(1, 3000))
        a = rng.choice([1, 1, 1, 2, 5, -3, 2**40 + 1], size=n).astype(np.int64)
        cases.append(a)
        cases.append(a.astype(np.int32))
    cases.append(np.array([2**53 + 1, 2**53 + 3], dtype=np.int64))  # np.median's own path
    cases.append(np.array([0.5, 1.5, -0.0]))
    for a in cases:
        assert _bits(order_stats.median_of_ints(a)) == _bits(float(np.median(a))), a
    assert order_stats.median_of_ints(np.array([1, 2, 2, 9])) == 2.0
    assert order_stats.median_of_ints(np.array([1, 2, 3, 9])) == 2.5  # the two middle ones


def _events_one_by_one(sc: Any, **kw: Any) -> list:
    """``robust.find_events`` as it was written before its groups were found at once (the
    reference for the test below): flagged points grouped one by one, each group's peak and
    onset walked in Python."""
    from forensics.evidence.robust import Event

    z_min, min_ratio, z_onset = kw["z_min"], kw["min_ratio"], kw.get("z_onset", 2.0)
    merge_gap, log_scale = kw.get("merge_gap", 2), kw["log_scale"]
    gross_ratio, z_gross, onset_frac = kw.get("gross_ratio"), kw.get("z_gross", 3.0), 0.2
    z = sc.get_column("z").fill_null(np.nan).to_numpy()
    r = sc.get_column("ratio").fill_null(np.nan).to_numpy()
    with np.errstate(invalid="ignore"):
        hit = (z >= z_min) & (r >= min_ratio if log_scale else r >= 0)
        if gross_ratio is not None and log_scale:
            hit |= (z >= z_gross) & (r >= gross_ratio)
        flagged = np.flatnonzero(hit)
    if len(flagged) == 0:
        return []
    groups: list[list[int]] = [[int(flagged[0])]]
    for i in flagged[1:]:
        if i - groups[-1][-1] <= merge_gap + 1:
            groups[-1].append(int(i))
        else:
            groups.append([int(i)])
    with np.errstate(invalid="ignore", divide="ignore"):
        excess = np.log(np.where(r > 0, r, np.nan)) if log_scale else r
    events = []
    for g in groups:
        seg = r[g[0] : g[-1] + 1]
        if not np.isfinite(seg).any():
            peak = g[0]
        else:
            peak = g[0] + int(np.nanargmax(seg) if np.isnan(seg).any() else seg.argmax())
        onset = g[0]
        while (
            onset - 1 >= 0
            and np.isfinite(z[onset - 1])
            and z[onset - 1] >= z_onset
            and excess[onset - 1] >= onset_frac * excess[peak]
        ):
            onset -= 1
        events.append(Event(onset=onset, peak=peak, last=g[-1], n_flagged=len(g)))
    return events


def test_find_events_equals_the_one_by_one_search() -> None:
    """``robust.find_events`` (groups, peaks and the first step of each onset walk found for
    all groups at once) gives the events of the group-by-group search: runs of flagged
    points, gaps at the merge limit, NaN ratios and scores, builds over several points,
    signed series and gross jumps; a changed merge gap changes them."""
    import polars as pl

    from forensics.evidence import robust

    rng = np.random.default_rng(47)
    for trial in range(200):
        n = int(rng.integers(1, 400))
        z = rng.standard_normal(n) * 3.0
        z[rng.random(n) < 0.05] = np.nan
        z[rng.random(n) < 0.1] += 8.0  # flagged points, some in runs
        ratio = np.exp(rng.standard_normal(n) * 0.3)
        ratio[rng.random(n) < 0.05] = np.nan
        if trial % 4 == 0:  # a signed series: ratio is value - baseline
            ratio = np.log(ratio)
        sc = pl.DataFrame({"z": z, "ratio": ratio})
        sc = sc.with_columns(pl.col("z", "ratio").fill_nan(None))
        kw: dict[str, Any] = dict(
            z_min=float(rng.choice([4.0, 6.0])),
            min_ratio=float(rng.choice([1.0, 1.15])),
            merge_gap=int(rng.integers(0, 4)),
            log_scale=trial % 4 != 0,
            gross_ratio=float(rng.choice([1.5, 3.0])) if trial % 3 else None,
            z_onset=float(rng.choice([1.0, 2.0])),
        )
        got = robust.find_events(sc, **kw)
        assert got == _events_one_by_one(sc, **kw), (trial, kw)
        if len(got) > 1 and kw["merge_gap"] < 3:
            merged = robust.find_events(sc, **{**kw, "merge_gap": n})
            assert len(merged) == 1 and merged != got
