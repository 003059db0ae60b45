"""Issue 13: judgement that reads the LR schedule and the shape of the infra series.

- grad-norm drift judged against the LR schedule's envelope (Defazio et al. 2025, arXiv
  2506.02285: with weight decay the grad norm grows about as sqrt(lr_baseline / lr_now)), on
  synthetic series and on small real CPU trainings (a tiny MLP with LayerNorm and AdamW);
- the loss falling faster in a decay or cooldown is expected, and a plateau at a steady LR
  that the cooldown then brings down is the WSD stable phase;
- throughput_drop only for a sustained fall, slow steps at the eval interval an info stall;
- units from the metric names in the infra findings' texts;
- divergence only when the loss does not come back within the log.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
from synthetic import healthy_grad_norm, healthy_loss, long_frame, run_from_frame, spike_factor

from forensics.detectors import load
from forensics.detectors.divergence import DivergenceDetector
from forensics.detectors.drift import GradNormDriftDetector
from forensics.detectors.memory import MemoryGrowthDetector
from forensics.detectors.plateau import PlateauDetector
from forensics.detectors.stall import StallDetector
from forensics.detectors.throughput import ThroughputDetector
from forensics.evidence import Evidence
from forensics.findings import FindingKind, Severity
from forensics.importers import read_run


def _run(**series):
    return run_from_frame(long_frame({k.replace("__", "/"): v for k, v in series.items()}))


# -- synthetic: the drift envelope -----------------------------------------------------------
N = 6000
WARM = 300


def _lr(kind: str, steps: np.ndarray, floor: float = 0.1) -> np.ndarray:
    peak = 1e-3
    warm = np.minimum(1.0, (steps + 1) / WARM)
    t = np.clip((steps - WARM) / (N - WARM), 0, 1)
    if kind == "cosine":
        f = floor + (1 - floor) * 0.5 * (1 + np.cos(np.pi * t))
    elif kind == "wsd":  # stable to 80%, then a linear cooldown to `floor`
        c = np.clip((steps - 0.8 * N) / (0.2 * N), 0, 1)
        f = 1 - (1 - floor) * c
    else:
        f = np.ones_like(t)
    return peak * np.where(steps < WARM, warm, f)


def _grad_norm_following(lr: np.ndarray, steps: np.ndarray, power: float = 0.5, seed: int = 0):
    """A grad norm that settles after the warm-up and then rises as (lr_peak / lr) ** power."""
    _, g = healthy_grad_norm(len(steps), seed=seed)
    rise = (np.max(lr) / np.maximum(lr, 1e-12)) ** power
    return g * np.where(steps < WARM, 1.0, rise)


def _drift_run(lr_kind: str | None, grad: np.ndarray, steps: np.ndarray, lr: np.ndarray):
    series = {"train__loss": healthy_loss(N, seed=3), "train__grad_norm": (steps, grad)}
    if lr_kind is not None:
        series["train__lr"] = (steps, lr)
    return _run(**series)


def test_rise_inside_the_cosine_envelope_is_info() -> None:
    """Cosine decay to 10%: the grad norm rises as sqrt(lr_peak / lr) (up to 3.2x), the rise
    the schedule explains: info, naming the schedule and the AdamC remedy."""
    steps = np.arange(N)
    lr = _lr("cosine", steps)
    (f,) = GradNormDriftDetector().detect(
        Evidence(_drift_run("cosine", _grad_norm_following(lr, steps), steps, lr))
    )
    assert f.kind is FindingKind.GRAD_NORM_DRIFT and f.severity is Severity.INFO
    m = f.measures
    assert m["ratio"] > 2.5 and m["schedule_explained"] is True
    assert m["expected_rise"] == pytest.approx(math.sqrt(m["lr_baseline"] / m["lr_now"]))
    assert m["expected_rise"] == pytest.approx(3.1, abs=0.1)
    assert m["envelope_score"] < 1.0 and m["lr_phase_at_warning"] == "decay"
    assert "schedule explains" in f.summary and "AdamC" in f.summary
    assert "Defazio" in f.summary
    # The sentence states what was compared: the level now under the moving warning line
    # (the explained rise times the margin), the line the report's chart draws.
    line = f.judged_against["warn_line_now"] / m["baseline"]
    assert line == pytest.approx(1.25 * m["expected_rise"])
    assert f"level now ({m['ratio']:.1f}x) is under the {line:.1f}x warning line" in f.summary
    assert f"the explained {m['expected_rise']:.1f}x plus a 25% margin" in f.summary


def test_same_rise_at_a_constant_lr_is_the_articles_warning() -> None:
    """The same grad norm over a constant LR: nothing explains it, the 2x / 3x lines apply."""
    steps = np.arange(N)
    grad = _grad_norm_following(_lr("cosine", steps), steps)
    lr = _lr("constant", steps)
    (f,) = GradNormDriftDetector().detect(Evidence(_drift_run("constant", grad, steps, lr)))
    assert f.severity in (Severity.WARNING, Severity.CRITICAL)
    assert f.measures["expected_rise"] == pytest.approx(1.0)
    assert f.measures["schedule_explained"] is False
    assert "did not decay" in f.summary


def test_rise_beyond_the_envelope_is_a_warning() -> None:
    """Cosine decay to 10% (envelope 3.2x, warning line 4x) but a grad norm rising as
    (lr_peak / lr) ** 0.8 (6.3x): beyond what the schedule explains."""
    steps = np.arange(N)
    lr = _lr("cosine", steps)
    (f,) = GradNormDriftDetector().detect(
        Evidence(_drift_run("cosine", _grad_norm_following(lr, steps, power=0.8), steps, lr))
    )
    assert f.severity in (Severity.WARNING, Severity.CRITICAL)
    assert f.measures["envelope_score"] > 1.0 and "beyond" in f.summary


def test_wsd_rise_in_the_stable_phase_is_a_drift() -> None:
    """A WSD run whose grad norm doubles during the stable phase, before the cooldown: the
    cooldown at the end cannot explain a climb that came first."""
    steps = np.arange(N)
    lr = _lr("wsd", steps)
    _, g = healthy_grad_norm(N, seed=4)
    grad = g * np.where(steps > 1500, 1 + 1.5 * np.clip((steps - 1500) / 2500, 0, 1), 1.0)
    (f,) = GradNormDriftDetector().detect(Evidence(_drift_run("wsd", grad, steps, lr)))
    assert f.severity in (Severity.WARNING, Severity.CRITICAL)
    assert f.measures["lr_phase_at_warning"] == "constant"


def test_wsd_rise_in_the_cooldown_is_info() -> None:
    """A WSD run whose grad norm rises only in the cooldown, as the LR falls to 10%."""
    steps = np.arange(N)
    lr = _lr("wsd", steps)
    (f,) = GradNormDriftDetector().detect(
        Evidence(_drift_run("wsd", _grad_norm_following(lr, steps), steps, lr))
    )
    assert f.severity is Severity.INFO and f.measures["lr_phase_at_warning"] == "cooldown"


def test_no_lr_logged_says_the_check_could_not_separate() -> None:
    """Without an LR the rise is judged on the plain lines and the finding and the notes say
    that a schedule-driven rise could not be told apart."""
    steps = np.arange(N)
    lr = _lr("cosine", steps)
    run = _drift_run(None, _grad_norm_following(lr, steps), steps, lr)
    (f,) = GradNormDriftDetector().detect(Evidence(run))
    assert f.severity in (Severity.WARNING, Severity.CRITICAL)
    assert f.measures["lr_logged"] is False and f.measures["expected_rise"] is None
    assert "No LR was logged" in f.summary and "could not tell" in f.summary
    assert any("no LR logged" in n for n in run.notes)


def test_schedule_explained_drift_does_not_make_eval_regression_critical() -> None:
    """The eval-regression detector escalates on a drift only when the drift is alarming."""
    steps = np.arange(N)
    lr = _lr("cosine", steps)
    ev = Evidence(_drift_run("cosine", _grad_norm_following(lr, steps), steps, lr))
    assert ev.drift is not None and ev.drift.flagged and not ev.drift.alarming


# -- real CPU training: a tiny MLP with LayerNorm, AdamW weight decay ----------------------
def _train_log(
    path: Path,
    *,
    schedule: str,
    steps: int = 1600,
    lr: float = 5e-3,
    wd: float = 3.0,
    warmup: int = 250,
    drift_from: int | None = None,
    drift_to: float = 1.0,
    seed: int = 0,
) -> Path:
    """Train a 2-hidden-layer MLP (LayerNorm after each hidden linear layer) on a noisy
    teacher task, one CPU thread, and write a JSONL log: loss, grad norm, lr per step. Weight
    decay acts on the normalized layers' weights only (the usual grouping), so their norm
    settles where wd and lr balance and the grad norm follows the LR. ``drift_from``: from
    that step the loss is multiplied by a factor growing linearly to ``drift_to`` before the
    backward pass: Adam's update ignores the scale, the logged grad norm does not (an injected
    drift the schedule does not explain)."""
    torch = pytest.importorskip("torch")
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    d, h, c, batch = 16, 48, 10, 32
    t1 = torch.randn(d, 64, generator=g) / d**0.5
    t2 = torch.randn(64, c, generator=g) * 2.0
    nn = torch.nn
    model = nn.Sequential(
        nn.Linear(d, h), nn.LayerNorm(h), nn.GELU(), nn.Linear(h, h), nn.LayerNorm(h), nn.GELU(),
        nn.Linear(h, c),
    )  # fmt: skip
    decayed = [model[0].weight, model[3].weight]
    rest = [p for p in model.parameters() if all(p is not q for q in decayed)]
    opt = torch.optim.AdamW(
        [{"params": decayed, "weight_decay": wd}, {"params": rest, "weight_decay": 0.0}],
        lr=lr,
        betas=(0.9, 0.95),
    )
    params = list(model.parameters())
    with path.open("w") as fh:
        for s in range(1, steps + 1):
            if s <= warmup:
                f = s / warmup
            elif schedule == "cosine":
                f = 0.5 * (1 + math.cos(math.pi * (s - warmup) / (steps - warmup)))
            else:
                f = 1.0
            for grp in opt.param_groups:
                grp["lr"] = lr * f
            x = torch.randn(batch, d, generator=g)
            noise = 0.5 * torch.randn(batch, c, generator=g)
            y = (torch.tanh(x @ t1 * 2.0) @ t2 + noise).argmax(1)
            loss = nn.functional.cross_entropy(model(x), y)
            scale = 1.0
            if drift_from is not None and s > drift_from:
                scale = 1 + (drift_to - 1) * (s - drift_from) / (steps - drift_from)
            opt.zero_grad()
            (loss * scale).backward()
            gn = float(torch.sqrt(sum((p.grad**2).sum() for p in params)))
            opt.step()
            rec = {"step": s, "loss": float(loss.detach()), "grad_norm": gn, "lr": lr * f}
            fh.write(json.dumps(rec) + "\n")
    return path


@pytest.fixture(scope="module")
def cpu_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Evidence]:
    """Two real trainings (about 10 s each on one core): a cosine decay to zero, and the same
    model at a constant LR with a drift injected from step 800."""
    d = tmp_path_factory.mktemp("cpu_runs")
    logs = {
        "cosine": _train_log(d / "cosine.jsonl", schedule="cosine"),
        "constant_drift": _train_log(
            d / "constant_drift.jsonl", schedule="constant", drift_from=800, drift_to=2.2
        ),
    }
    return {k: Evidence(read_run(p)) for k, p in logs.items()}


def test_real_cosine_run_grad_norm_rise_is_info(cpu_runs: dict[str, Evidence]) -> None:
    """Real training, cosine decay, weight decay: the grad norm more than doubles as the LR
    decays (the article's 2x line alone would warn); inside the envelope it is info."""
    ev = cpu_runs["cosine"]
    (f,) = GradNormDriftDetector().detect(ev)
    assert f.measures["ratio"] >= 2.0
    assert f.severity is Severity.INFO and f.measures["schedule_explained"] is True
    assert f.measures["lr_phase_at_warning"] == "decay"
    loud = [
        x
        for n in ("grad_norm_drift", "plateau", "divergence", "throughput", "memory")
        for x in load(n)().detect(ev)
        if x.severity is not Severity.INFO
    ]
    assert loud == [], [x.summary for x in loud]


def test_real_constant_lr_injected_drift_is_a_warning(cpu_runs: dict[str, Evidence]) -> None:
    """The same training at a constant LR with an injected grad-norm drift: the article's
    warning (nothing in the schedule explains it)."""
    (f,) = GradNormDriftDetector().detect(cpu_runs["constant_drift"])
    assert f.severity is Severity.WARNING
    assert f.measures["expected_rise"] == pytest.approx(1.0)
    assert f.measures["ratio"] >= 2.0 and f.measures["schedule_explained"] is False
    assert 700 <= f.start_step <= 1300


# -- plateau against the schedule ---------------------------------------------------------
def test_plateau_before_a_wsd_cooldown_is_the_stable_phase() -> None:
    """WSD: the loss holds flat at the steady LR, then falls fast in the cooldown. The flat
    stretch is the stable phase, which the schedule explains (and the fast fall is no
    finding of this detector's)."""
    steps = np.arange(0, 12000, 10)
    rng = np.random.default_rng(0)
    lr = np.where(steps < 200, steps / 200 * 1e-3, 1e-3)
    cd = steps >= 10000
    lr = np.where(cd, 1e-3 * (1 - (steps - 10000) / 2000) + 1e-6, lr)
    loss = 3.0 + 4.0 * np.exp(-steps / 300.0)
    loss = np.where(cd, loss - 0.4 * (steps - 10000) / 2000, loss)
    loss = loss * np.exp(rng.normal(0, 0.004, len(steps)))
    run = _run(train__loss=(steps, loss), train__lr=(steps, lr))
    (f,) = PlateauDetector().detect(Evidence(run))
    assert f.measures["lr_context"] == "stable_before_decay" and f.measures["expected"] is True
    assert f.measures["loss_after"] == pytest.approx(2.6, abs=0.05)
    assert "cooldown" in f.summary and "schedule explains" in f.summary


# -- throughput: sustained drops, slow steps at the eval interval, units -------------------
def _throughput_run(tps: np.ndarray, steps: np.ndarray, val_every: int | None = None, **extra):
    series = {"loss": healthy_loss(int(steps[-1]) + 1, seed=1, every=1), "tok/s": (steps, tps)}
    if val_every:
        vs = np.arange(val_every, int(steps[-1]) + 1, val_every)
        series["val_loss"] = (vs, 2.5 + 0.0 * vs)
    series.update(extra)
    return _run(**series)


def test_slow_steps_at_the_eval_interval_are_an_info_stall() -> None:
    """Throughput logged every step; every 100th step (the eval interval) runs 4x slower for
    three steps in a row (the eval timed inside the step). Not a throughput drop: one info
    stall naming the eval interval."""
    steps = np.arange(0, 3000)
    rng = np.random.default_rng(2)
    tps = 40000.0 * np.exp(rng.normal(0, 0.03, len(steps)))
    slow = (steps % 100 < 3) & (steps >= 100)
    tps = np.where(slow, tps / 4, tps)
    ev = Evidence(_throughput_run(tps, steps, val_every=100))
    assert ThroughputDetector().detect(ev) == []
    (f,) = StallDetector().detect(ev)
    assert f.severity is Severity.INFO and f.measures["housekeeping"] == "eval_interval"
    assert f.measures["slow_steps"] == int(slow.sum()) and f.measures["source"] == "throughput"
    assert f.measures["ratio"] == pytest.approx(4.0, rel=0.1)
    assert "evaluation interval" in f.summary
    first, last = int(steps[slow][0]), int(steps[slow][-1])
    assert f"from step {first:,} to {last:,}," in f.summary and last >= 1000  # digits grouped
    # The advice of a note about the job's own pauses: none for the run's health (it had
    # read "check the cluster's and scheduler's logs for that time").
    from forensics.prescriptions import prescribe

    assert prescribe(f).startswith("No action for the run's health: the job's own evaluation")


def test_the_same_slow_stretch_sustained_is_a_throughput_drop() -> None:
    """A 30%+ fall that lasts (steps 1500-2000): throughput_drop, in tokens/s."""
    steps = np.arange(0, 3000)
    rng = np.random.default_rng(3)
    tps = 40000.0 * np.exp(rng.normal(0, 0.03, len(steps)))
    tps = np.where((steps >= 1500) & (steps < 2000), tps * 0.55, tps)
    (f,) = ThroughputDetector().detect(Evidence(_throughput_run(tps, steps, val_every=100)))
    assert 1495 <= f.start_step <= 1510 and f.measures["unit"] == "tokens/s"
    assert "tokens/s" in f.summary and f.summary.startswith("Throughput fell 45%")


def test_step_time_in_ms_is_a_step_time_that_rose_in_seconds() -> None:
    """Only the step time is logged, in ms: the finding says the step time rose, in s/step."""
    steps = np.arange(0, 3000, 10)
    st = np.where((steps >= 1500) & (steps < 2200), 2000.0, 1000.0)  # ms
    run = _run(loss=healthy_loss(3000, seed=1, every=10), **{"step_time (ms)": (steps, st)})
    (f,) = ThroughputDetector().detect(Evidence(run))
    assert f.measures["source"] == "step_time" and f.measures["unit"] == "ms/step"
    assert f.measures["baseline"] == pytest.approx(1000.0) and f.measures["level"] == 2000.0
    assert f.summary.startswith("Step time rose from 1 s/step to 2 s/step")
    assert "50% below" in f.summary


def test_memory_summary_states_its_unit() -> None:
    """memory/rss_mb climbing: the summary says MB."""
    steps = np.arange(0, 3000, 10)
    mem = 250.0 + 0.3 * steps
    run = _run(loss=healthy_loss(3000, seed=1, every=10), **{"memory/rss_mb": (steps, mem)})
    (f,) = MemoryGrowthDetector().detect(Evidence(run))
    assert f.measures["unit"] == "MB"
    assert re.search(r"from [\d,.]+ MB at step [\d,]+ to [\d,.]+ MB at step", f.summary)
    assert "MB per 1k steps" in f.summary


def test_memory_levels_are_the_logged_ones() -> None:
    """Memory flat at ~368 MB, then climbing from step 300: the finding's levels are what the
    log shows at the onset and at the end, and the sentence's figures follow from them. The
    fitted line over the whole analysed part started at 257 MB, below every logged value (the
    memory_growth sample's report)."""
    from forensics.pipeline import analyze

    root = Path(__file__).resolve().parents[1]
    diag = analyze(root / "sample_runs" / "memory_growth")
    (f,) = [g for g in diag.findings if g.kind is FindingKind.MEMORY_GROWTH]
    mem = diag.run.series("memory")
    values = mem.get_column("value").to_list()
    at = dict(zip(mem.get_column("step").to_list(), values, strict=True))
    m = f.measures
    # 100 points: each bin is one point, so the levels are the logged values at those steps.
    assert (m["start_level_step"], m["end_level_step"]) == (f.start_step, f.end_step)
    assert m["start_level"] == at[f.start_step] and m["end_level"] == at[f.end_step]
    assert min(values) <= m["start_level"]
    assert m["growth_pct"] == pytest.approx(100 * (m["end_level"] / m["start_level"] - 1))
    assert m["duration_steps"] == f.end_step - f.start_step
    grew, rate = m["end_level"] - m["start_level"], 1000 * m["end_level"] - 1000 * m["start_level"]
    assert f"grew {grew:,.0f} MB over {m['duration_steps']:,} steps" in f.summary, f.summary
    assert f"from {m['start_level']:,.0f} MB at step {f.start_step:,}" in f.summary
    assert f"{rate / m['duration_steps']:,.0f} MB per 1k steps;" in f.summary, f.summary


# -- divergence: only when the loss does not come back -------------------------------------
def test_recovered_rise_in_a_short_excerpt_is_not_divergence() -> None:
    """A 600-step excerpt: loss and grad norm rise at step 200 and come back by ~450; the
    rise lasted less than the log but did come back: a spike, not a divergence."""
    s, v = healthy_loss(600, seed=5)
    gs, g = healthy_grad_norm(600, seed=6)
    bump = spike_factor(s, 200, 0.5, width=200, tau=60)
    run = _run(train__loss=(s, v * bump), train__grad_norm=(gs, g * bump**2))
    assert DivergenceDetector().detect(Evidence(run)) == []


def test_slow_return_after_the_window_is_not_divergence() -> None:
    """Both rise at 2000 and take ~900 steps to come back (longer than the 500-step window):
    the log shows them back, so not a divergence."""
    s, v = healthy_loss(5000, seed=7)
    gs, g = healthy_grad_norm(5000, seed=8)
    bump = spike_factor(s, 2000, 0.6, width=900, tau=200)
    run = _run(train__loss=(s, v * bump), train__grad_norm=(gs, g * bump**2))
    assert DivergenceDetector().detect(Evidence(run)) == []
