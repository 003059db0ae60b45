"""Every line a chart draws is the number a finding states (issue 11).

For every sample run, with every detector's parameters changed from the defaults, the report's
figures (the plotly dicts :func:`forensics.report.charts.build_panels` returns, not the HTML)
draw baselines, alarm lines, limits, the warm-up end and the train/val gap exactly as the
run's :class:`~forensics.evidence.Evidence` holds them and as the findings' ``judged_against``
states them, in both directions: no finding states a level the chart does not draw, and no
chart draws a level no finding or evidence states.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import pytest

from forensics.config import Config
from forensics.detectors import REGISTRY
from forensics.evidence import Band, Evidence
from forensics.findings import Severity
from forensics.params import PARAMS
from forensics.pipeline import analyze
from forensics.report.charts import Panel, build_panels, is_level_key, most_severe
from forensics.schema import ACT_ABSMAX, GRAD_NORM, PARAM_NORM, VAL_LOSS

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = sorted(
    p.name for p in (ROOT / "sample_runs").iterdir() if p.is_dir() and p.name != "generator"
)

# Every detector gets parameters off its defaults; the levels drawn must follow them.
CHANGED: dict[str, dict[str, Any]] = {
    "spikes": {"z_threshold": 5.5, "loss_min_ratio": 1.2, "grad_norm_min_ratio": 2.2},
    "periodic": {"max_spread": 0.25, "shrink_ratio": 0.75},
    "nan_inf": {"persist_points": 4},
    "divergence": {"loss_rise": 0.12, "grad_rise": 2.2},
    "loss_scale": {"cascade_gap": 60},
    "grad_norm_drift": {"baseline_window": 300, "warn_ratio": 1.7, "crit_ratio": 2.6},
    "eval_regression": {"noise_k": 2.5},
    "resume_regression": {"noise_k": 2.5},
    "lr_restart": {"noise_k": 2.5, "slow_recovery": 400},
    "param_norm": {"baseline_window": 300, "ratio_limit": 1.3},
    "layers": {"group_ratio": 1.8},
    "activations": {"absmax_limit": 5000.0, "std_jump_ratio": 2.5},
    "train_val": {"accel_ratio": 1.4, "noise_k": 1.8},
    "plateau": {"flat_rel": 0.006},
    "no_learning": {"min_fall": 0.06},
    "throughput": {"drop": 0.25, "baseline_points": 80},
    "stall": {"factor": 15.0},
    "memory": {"min_growth": 0.04},
}


def test_the_changed_configuration_covers_every_detector() -> None:
    """A new detector must join the table above (and really change something)."""
    assert set(CHANGED) == set(REGISTRY) == set(PARAMS)
    for name, changes in CHANGED.items():
        defaults = PARAMS[name]()
        assert all(getattr(defaults, k) != v for k, v in changes.items()), name


def _evidence_lines(panel: Panel) -> dict[str, float]:
    """The panel's evidence levels by the key they draw (``baseline``, ``warn_at``...)."""
    out: dict[str, float] = {}
    for t in panel.figure["data"]:
        meta = t.get("meta")
        if isinstance(meta, dict) and meta.get("source") == "evidence" and "value" in meta:
            assert t["y"] == [meta["value"], meta["value"]], t["name"]  # drawn as stated
            out[meta["judged"]] = meta["value"]
    return out


def _segments(panel: Panel) -> list[tuple[str, str, int, int, float]]:
    """The findings' own levels on the panel: (key, kind, start, end, value)."""
    out = []
    for t in panel.figure["data"]:
        meta = t.get("meta")
        if isinstance(meta, dict) and "segments" in meta:
            xs = [x for x in t["x"] if x is not None]
            ys = [y for y in t["y"] if y is not None]
            assert xs == [x for x0, x1, _ in meta["segments"] for x in (x0, x1)]
            assert ys == [v for *_, v in meta["segments"] for _ in (0, 1)]
            out += [(meta["judged"], meta["source"], x0, x1, v) for x0, x1, v in meta["segments"]]
    return out


def _shapes(panel: Panel, name: str) -> list[dict[str, Any]]:
    return [s for s in panel.figure["layout"].get("shapes", []) if s.get("name") == name]


def _check_band(panel: Panel, band: Band | None, ratios: tuple[float, float | None]) -> None:
    """The panel draws the evidence's band exactly, labelled with the configured ratios."""
    lines = _evidence_lines(panel)
    if band is None:
        assert not lines
        return
    assert (band.warn_ratio, band.critical_ratio) == ratios  # the evidence used the config
    want = {k: v for k, v in band.judged().items() if v is not None}
    assert lines == want
    names = {t["name"] for t in panel.figure["data"]}
    assert any(n.startswith(f"{band.warn_ratio:g}x baseline") for n in names)
    if band.critical_ratio is not None:
        assert any(n.startswith(f"{band.critical_ratio:g}x baseline") for n in names)
    (window,) = _shapes(panel, "baseline window")
    assert (window["x0"], window["x1"]) == (band.baseline.start_step, band.baseline.end_step)
    for f in panel.findings:  # a finding judged against this band states the same numbers
        ja = f.judged_against
        for key in ("baseline", "warn_at", "critical_at"):
            if key in ja and f.metric == panel.key:
                assert ja[key] == lines[key], (f.kind, key)
        if f.metric == panel.key and "baseline_start_step" in ja:
            assert (ja["baseline_start_step"], ja["baseline_end_step"]) == (
                band.baseline.start_step,
                band.baseline.end_step,
            ), f.kind


def _check_levels(panel: Panel) -> int:
    """Each level a finding on this panel states is drawn over it; each drawn level is stated."""
    lines = _evidence_lines(panel)
    segs = _segments(panel)
    stated = 0
    own = [f for f in panel.findings if f.metric == panel.key]  # not run-level ones
    if panel.key == "eval":
        own = [f for f in panel.findings if f.metric and f.metric.startswith("eval/")]
    for f in own if panel.key == "eval" else most_severe(own):  # the findings it marks
        for key, v in f.judged_against.items():
            if not is_level_key(key) or not isinstance(v, (int, float)) or isinstance(v, bool):
                continue
            if not math.isfinite(v):
                continue
            stated += 1
            drawn = lines.get(key) == v or any(
                (k, kind, x0, v2) == (key, f.kind.value, f.start_step, v)
                for k, kind, x0, _, v2 in segs
            )
            assert drawn, (panel.key, f.kind, key, v)
    for key, kind, x0, _, v in segs:  # nothing drawn that no finding states
        assert any(
            f.kind.value == kind and f.start_step == x0 and f.judged_against.get(key) == v
            for f in panel.findings
        ), (panel.key, key, kind, x0)
    return stated


@pytest.fixture(scope="module", params=SAMPLES)
def analysed(request: pytest.FixtureRequest) -> tuple[str, Evidence, list[Panel], Any]:
    cfg = Config(detectors=CHANGED)
    diag = analyze(ROOT / "sample_runs" / request.param, cfg)
    assert diag.evidence is not None
    return request.param, diag.evidence, build_panels(diag.evidence, diag.findings), diag


def test_bands_are_the_evidence_and_the_findings(analysed) -> None:
    """Grad-norm and param-norm panels draw the evidence's bands with the configured ratios,
    and every finding judged against a band states the same baseline and lines."""
    _, ev, panels, _ = analysed
    by_key = {p.key: p for p in panels}
    gp = ev.params.grad_norm_drift
    if GRAD_NORM in by_key:
        _check_band(by_key[GRAD_NORM], ev.grad_norm_band, (gp.warn_ratio, gp.crit_ratio))
    if PARAM_NORM in by_key:
        _check_band(
            by_key[PARAM_NORM], ev.param_norm_band, (ev.params.param_norm.ratio_limit, None)
        )


def test_every_stated_level_is_drawn(analysed) -> None:
    """Baselines and alarm lines the findings state are the lines the charts draw."""
    name, _, panels, diag = analysed
    for p in panels:
        if p.figure["data"] and p.figure["data"][0].get("type") == "heatmap":
            continue
        _check_levels(p)


def test_activation_limit(analysed) -> None:
    """The activation panel's limit is the configured one, as the findings state it."""
    _, ev, panels, diag = analysed
    assert ev.activation_limit == CHANGED["activations"]["absmax_limit"]
    act = next((p for p in panels if p.key == ACT_ABSMAX), None)
    if act is None:
        return
    heat = act.figure["data"][0]
    assert heat["meta"] == {
        "judged": "absmax_limit",
        "value": ev.activation_limit,
        "source": "evidence",
    }
    assert heat["colorbar"]["tickvals"] == [math.log10(ev.activation_limit)]
    for f in diag.findings:
        if f.metric == ACT_ABSMAX and "limit" in f.judged_against:
            assert f.judged_against["limit"] == ev.activation_limit


def test_gap_and_warmup(analysed) -> None:
    """The train/val panel's gap is the evidence's; the warm-up line is the evidence's, as the
    findings that judged from the warm-up state it."""
    _, ev, panels, diag = analysed
    tv = next((p for p in panels if p.key == VAL_LOSS), None)
    if tv is not None:
        gaps = [t for t in tv.figure["data"] if t.get("name") == "gap"]
        if ev.gap is None or len(ev.gap.steps) == 0:
            assert gaps == []
        else:
            (g,) = gaps
            assert g["x"] == [int(s) for s in ev.gap.steps]
            assert g["y"] == [float(v) for v in ev.gap.gap]
    for p in panels:
        for line in _shapes(p, "warm-up end"):
            assert line["x0"] == line["x1"] == ev.warmup_end
    for f in diag.findings:
        if "warmup_end" in f.judged_against:
            assert f.judged_against["warmup_end"] == ev.warmup_end, f.kind


def test_issue_11_reproduction() -> None:
    """The reproduction in issue 11: a 60-step baseline window and a 1.5x warning line. The
    chart draws the configured window's baseline (1.119, not the default window's 0.802) and
    its lines. The grad norm goes on falling after that short window, so the finding is
    judged from where it settled (0.669, steps 90-149): the chart draws that level and its
    1.5x line too, dotted over the finding, and its caption says so."""
    cfg = Config(detectors={"grad_norm_drift": {"baseline_window": 60, "warn_ratio": 1.5}})
    diag = analyze(ROOT / "sample_runs" / "grad_norm_drift", cfg)
    (drift,) = [f for f in diag.findings if f.kind.value == "grad_norm_drift"]
    (gn,) = [p for p in build_panels(diag.ev, diag.findings) if p.key == GRAD_NORM]
    lines = _evidence_lines(gn)
    assert lines["baseline"] == drift.measures["early_baseline"]
    assert lines["baseline"] == pytest.approx(1.119, abs=1e-3)
    assert lines["warn_at"] == 1.5 * lines["baseline"]
    names = {t["name"] for t in gn.figure["data"]}
    assert {"baseline", "1.5x baseline (yellow)", "3x baseline (orange)"} <= names
    assert "2x" not in gn.caption.split("(the article")[0]
    assert drift.measures["baseline_kind"] == "settled"
    level = drift.measures["baseline"]
    assert level == drift.judged_against["baseline"] == pytest.approx(0.669, abs=1e-3)
    assert drift.judged_against["warn_at"] == 1.5 * level
    judged = {
        t["meta"]["judged"]: t["meta"]["segments"]
        for t in gn.figure["data"]
        if isinstance(t.get("meta"), dict)
        and t["meta"].get("source") == "grad_norm_drift"
        and "segments" in t["meta"]
    }
    span = [drift.start_step, drift.end_step]
    assert judged["baseline"] == [[*span, level]]
    assert judged["warn_at"] == [[*span, 1.5 * level]]
    assert f"judged from where it settled, {level:.4g}" in gn.caption


def test_one_table_of_lights(analysed) -> None:
    """Finding marks, the page's colours and its banner all come from findings.LOOKS."""
    from forensics.findings import LOOKS, look
    from forensics.report import render_html

    name, _, panels, diag = analysed
    colours = {lk.colour for lk in LOOKS.values()}
    for p in panels:
        for t in p.figure["data"]:
            if t.get("name") in ("findings", "run-level findings"):
                assert set(t["marker"]["color"]) <= colours
        marks = [s for s in p.figure["layout"]["shapes"] if "name" not in s]
        assert all(s.get("fillcolor", s.get("line", {}).get("color")) in colours for s in marks)
    if name != "healthy":
        return
    page = render_html(diag, plotlyjs="cdn")
    for key, lk in LOOKS.items():
        assert f"--{key}:{lk.colour};" in page
    assert f"--light: {look(diag.verdict).colour}" in page
    assert look(diag.verdict).label in page


def test_axis_titles_carry_the_logged_unit() -> None:
    """Throughput, step time and memory charts plot the values as logged: the y axis says in
    which unit the log named them, or that it named none (never a guessed "tokens/s")."""
    titles = {}
    for sample in ("healthy", "loss_scale_collapse"):
        diag = analyze(ROOT / "sample_runs" / sample, Config())
        for p in build_panels(diag.ev, diag.findings):
            titles[(sample, p.key)] = p.figure["layout"]["yaxis"]["title"]["text"]
    assert titles[("healthy", "throughput")] == "throughput (tokens/s)"  # train/tokens_per_sec
    assert titles[("healthy", "memory")] == "memory (MB)"  # memory/rss_mb
    assert titles[("healthy", "step_time")] == "time per step (unit not in the log)"
    # Megatron: "elapsed time per iteration (ms)"; its "consumed samples" is a counter and
    # gives no throughput chart
    assert titles[("loss_scale_collapse", "step_time")] == "time per step (ms)"
    assert ("loss_scale_collapse", "throughput") not in titles


def _schedule_trace(panel: Panel) -> dict[str, Any] | None:
    got = [
        t
        for t in panel.figure["data"]
        if isinstance(t.get("meta"), dict) and t["meta"].get("judged") == "warn_line"
    ]
    assert len(got) <= 1
    return got[0] if got else None


def test_the_drift_judged_under_the_lr_schedule_shows_its_moving_line() -> None:
    """The grad_norm_drift sample's climb passes the plain 2x line but is a note: the schedule
    explains it. The chart draws the line it was judged against: the baseline times
    max(2, margin x min(cap, sqrt(LR at the baseline / LR))), recomputed here from the logged
    LR, ending at the finding's warn_line_now."""
    import numpy as np

    from forensics.schema import LR

    diag = analyze(ROOT / "sample_runs" / "grad_norm_drift")
    (drift,) = [f for f in diag.findings if f.kind.value == "grad_norm_drift"]
    assert drift.severity.value == "info" and drift.measures["schedule_explained"]
    (gn,) = [p for p in build_panels(diag.ev, diag.findings) if p.key == GRAD_NORM]
    trace = _schedule_trace(gn)
    assert trace is not None
    ja = drift.judged_against
    lr = diag.ev.series(LR)
    in_base = (lr.steps >= ja["baseline_start_step"]) & (lr.steps <= ja["baseline_end_step"])
    ref = float(np.median(lr.values[in_base]))
    x = np.asarray(trace["x"], dtype=float)
    rise = np.clip(np.sqrt(ref / np.interp(x, lr.steps, lr.values)), 1.0, ja["envelope_max"])
    want = ja["baseline"] * np.maximum(ja["warn_ratio"], ja["envelope_margin"] * rise)
    assert np.allclose(trace["y"], want, rtol=1e-12)
    assert x[0] >= ja["baseline_start_step"] and trace["y"][-1] == pytest.approx(
        ja["warn_line_now"], rel=0.02
    )
    assert drift.measures["current"] < trace["y"][-1]  # the level now under it: a note
    assert f"{ja['warn_line_now']:.4g} at the end of the log" in gn.caption


def test_no_schedule_line_without_a_logged_lr() -> None:
    """Without an LR the drift is judged on the plain 2x / 3x lines: no moving line drawn."""
    from forensics.importers import read_run
    from forensics.pipeline import analyze_run
    from forensics.schema import LR

    run = read_run(ROOT / "sample_runs" / "grad_norm_drift")
    lr_tag = run.metrics()[LR]
    run.frame = run.frame.filter(run.frame.get_column("tag").cast(str) != lr_tag)
    diag = analyze_run(run)
    (gn,) = [p for p in build_panels(diag.ev, diag.findings) if p.key == GRAD_NORM]
    assert LR not in run.metrics() and _schedule_trace(gn) is None
    assert "dash-dotted" not in gn.caption


def test_a_short_loss_is_drawn_as_logged_and_a_lone_eval_spans_the_run() -> None:
    """The real HF Trainer event file of japanese-gpt2-medium logs the loss 6 times (every 500
    steps) and evaluates once, at step 3,100. A moving average of 6 points drew the loss at
    0.19 at step 1,000 where the log says 0.03: the loss is drawn as logged (no smoothed
    line, here or against the val loss); and the lone evaluation's chart spans the run's
    steps instead of 3,099 to 3,101."""
    from conftest import shared_path

    from forensics.importers import read_run
    from forensics.schema import LOSS

    ev = Evidence(read_run(shared_path("real_runs", "tfevents-hf-trainer-japanese-gpt2-medium")))
    panels = {p.key: p for p in build_panels(ev, [])}
    x, y = ev.logged(LOSS).steps, ev.logged(LOSS).values
    assert len(x) == 6
    (loss,) = panels[LOSS].figure["data"]
    assert loss["x"] == [int(v) for v in x] and loss["y"] == pytest.approx(list(y))
    assert "smoothed" not in loss["name"] and "too few for a moving average" in panels[LOSS].caption
    train = [t for t in panels[VAL_LOSS].figure["data"] if t["name"].startswith("train")]
    assert [t["name"] for t in train] == ["train"] and train[0]["y"] == pytest.approx(list(y))
    ev_fig = panels["eval"].figure
    assert {v for t in ev_fig["data"] for v in t["x"]} == {3100}
    lo, hi = ev_fig["layout"]["xaxis"]["range"]
    assert lo < ev.run.first_step == 500 and hi > ev.run.last_step == 3100
    # A loss of many points keeps its smoothed line beside the raw one (the healthy sample:
    # 1,000 steps), and a chart whose points span steps keeps plotly's own range.
    healthy = Evidence(read_run(ROOT / "sample_runs" / "healthy"))
    hp = {p.key: p for p in build_panels(healthy, [])}
    assert [t["name"] for t in hp[LOSS].figure["data"]][:2] == ["raw", "smoothed"]
    assert "range" not in hp[LOSS].figure["layout"]["xaxis"]


def test_a_constant_series_is_drawn_in_the_middle_of_its_axis(tmp_path) -> None:
    """A constant LR of 1.5e-4 and a loss scale of 1 (a bf16 Megatron log): plotly spans a
    flat line by +-1, which drew the LR at "0" on an axis from -1 to 1. The range is now half
    the value each side (a decade each side on the log axis); a varying series keeps plotly's
    own."""
    from forensics.importers import read_run
    from forensics.schema import LOSS_SCALE, LR

    lines = [
        f" iteration {it:8d}/    3000 | learning rate: 1.500E-04 | lm loss: {8 - it / 1000:.6E} "
        f"| loss scale: 1.0 | grad norm: {1 + it / 3000:.3f} |"
        for it in range(10, 3001, 10)
    ]
    (tmp_path / "train.log").write_text("\n".join(lines) + "\n")
    panels = {p.key: p for p in build_panels(Evidence(read_run(tmp_path / "train.log")), [])}
    assert panels[LR].figure["layout"]["yaxis"]["range"] == pytest.approx([0.75e-4, 2.25e-4])
    assert panels[LOSS_SCALE].figure["layout"]["yaxis"]["range"] == pytest.approx([-1.0, 1.0])
    assert "range" not in panels[GRAD_NORM].figure["layout"]["yaxis"]


def test_points_over_the_critical_line_without_a_finding_are_named(analysed) -> None:
    """The grad-norm caption names every point after the warm-up drawn over the critical line
    that no grad-norm finding, spike or divergence covers (counted here from the chart's own
    series and the evidence), splits them by whether another vital sign's finding (warning
    or worse) spans them, and states the spike rule with the configured numbers."""
    name, ev, panels, diag = analysed
    panel = next((p for p in panels if p.key == GRAD_NORM), None)
    band = ev.grad_norm_band
    if panel is None or band is None or band.critical_at is None:
        return
    s = ev.logged(GRAD_NORM)
    start = ev.warmup_end if ev.warmup_end is not None else int(s.steps[0]) - 1
    covered = [(sp.start_step, sp.end_step) for sp in ev.spikes(GRAD_NORM)]
    covered += [
        (f.start_step, f.end_step if f.end_step is not None else f.peak_step or f.start_step)
        for f in diag.findings
        if f.metric == GRAD_NORM and f.events_at is None  # (a note of outliers: each a spike)
    ]
    want = [
        int(t)
        for t, v in zip(s.steps, s.values, strict=True)
        if t > start
        and math.isfinite(v)  # (an Inf is a break in the line, not a point above it)
        and v >= band.critical_at
        and not any(a <= t <= b for a, b in covered)
    ]
    said = re.search(
        r" ([\d,]+) points? after the warm-up stands? above the (\S+)x line", panel.caption
    )
    if not want:
        assert said is None, (name, panel.caption)
        return
    assert said is not None, (name, panel.caption)
    assert int(said.group(1).replace(",", "")) == len(want), (name, panel.caption)
    assert float(said.group(2)) == band.critical_ratio
    others = [
        f
        for f in diag.findings
        if f.metric != GRAD_NORM and f.severity.rank >= Severity.WARNING.rank
    ]
    spans = list(ev.diverged) + [
        (f.start_step, f.end_step if f.end_step is not None else f.peak_step or f.start_step)
        for f in others
    ]
    inside = [t for t in want if any(a <= t <= b for a, b in spans)]
    alone = [t for t in want if t not in inside]
    named = re.findall(r"\(steps? ([\d, ]+|[\d,]+ to [\d,]+)\)", panel.caption)
    shown = [_named(n) for n in named]
    for group in (inside, alone):
        if group:
            expect = (group[0], group[-1]) if len(group) > 6 else tuple(group)
            assert expect in shown, (name, group, panel.caption)
    p = ev.params.spikes
    if alone:
        assert (
            f"{p.grad_norm_min_ratio:g}x its local baseline and z >= {p.z_threshold:g}"
            in panel.caption
        )
    else:
        assert "local noise" not in panel.caption


def _named(text: str) -> tuple[int, ...]:
    if " to " in text:
        a, b = text.split(" to ")
        return (int(a.replace(",", "")), int(b.replace(",", "")))
    return tuple(int(t.replace(",", "")) for t in text.split(", "))


def _grad_norm_caption(sample: str, config: Config | None = None) -> str:
    diag = analyze(ROOT / "sample_runs" / sample, config)
    assert diag.evidence is not None
    return next(p for p in build_panels(diag.evidence, diag.findings) if p.key == GRAD_NORM).caption


def test_the_bad_batch_and_nan_captions_say_why_points_over_the_red_line_have_no_finding() -> None:
    cap = _grad_norm_caption("bad_batch")
    assert (
        "4 points after the warm-up stand above the 3x line with no grad-norm finding (steps "
        "32, 59, 60, 201): a single point is a spike only where it stands out of the grad "
        "norm's local noise (2x its local baseline and z >= 6, or 4x and z >= 3), and these "
        "do not."
    ) in cap
    # The nan sample's climb into its NaN is inside its divergence (on the loss chart).
    cap = _grad_norm_caption("nan")
    assert (
        "25 points after the warm-up stand above the 3x line with no grad-norm finding: 23 "
        "(steps 594 to 641) in the steps that findings on other vital signs report "
        "(divergence, param_norm_jump, activation_outlier and 2 more); 2 (steps 240, 257) "
        "where a single point is a spike only if"
    ) in cap
    # Points inside another vital sign's finding are told apart (the lines at 2.6x here).
    cap = _grad_norm_caption("periodic_spikes", Config(detectors=CHANGED))
    assert (
        "4 points after the warm-up stand above the 2.6x line with no grad-norm finding: 2 "
        "(steps 204, 231) in the steps that findings on other vital signs report "
        "(periodic_spikes); 2 (steps 32, 45) where a single point is a spike only if it stands "
        "out of the grad norm's local noise (2.2x its local baseline and z >= 5.5, or 4x and "
        "z >= 3), and these do not."
    ) in cap


def test_overflow_steps_are_breaks_in_the_line_not_points_above_it(tmp_path) -> None:
    """An fp16 run whose scaler skipped six overflowing steps (grad norm inf, the loss scale
    halved there) is healthy, and the NaN/Inf check notes those steps. The caption had
    counted the six Infs as points "above the 3x line" that "do not stand out of the grad
    norm's local noise"; it now says the line breaks there and where the reason is."""
    import json

    import numpy as np

    rng = np.random.default_rng(0)
    n = 4000
    loss = 2 + 3 / (1 + np.arange(n) / 500) + rng.normal(0, 0.02, n)
    gn = 1.0 + 0.05 * rng.standard_normal(n)
    overflow = {900, 1700, 2600, 3300}
    scale, clean, rows = 65536.0, 0, []
    for i in range(n):
        r = {"step": i, "loss": float(loss[i]), "lr": 3e-4, "grad_norm": float(gn[i])}
        if i in overflow:
            scale, clean, r["grad_norm"] = scale / 2, 0, math.inf
        else:
            clean += 1
            if clean % 1000 == 0:
                scale = min(scale * 2, 65536.0)
        r["loss_scale"] = scale
        rows.append(json.dumps(r))
    (tmp_path / "metrics.jsonl").write_text("\n".join(rows) + "\n")
    diag = analyze(tmp_path)
    assert diag.verdict == "healthy"
    assert diag.evidence is not None
    assert any("overflowing steps the fp16 scaler skipped" in n for n in diag.run.notes)
    cap = next(p for p in build_panels(diag.evidence, diag.findings) if p.key == GRAD_NORM).caption
    assert "above the 3x line" not in cap, cap
    assert (
        "The line breaks at 4 non-finite points (steps 900, 1,700, 2,600, 3,300) that no "
        "finding reports: the NaN/Inf check's note under Data quality says why."
    ) in cap, cap
