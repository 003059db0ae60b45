"""Validation judged by shape (issue 13, article section 5): a step of the held-out loss is a
val_shift (up: the snapshot effect; down: a set that got easier), a ramp of the gap is
gap_acceleration reported before the val loss turns up, a rise from the minimum however small
is overfitting naming the best checkpoint, and every held-out loss (several eval sets) counts.

Synthetic series with a known shape, a real tiny training (torch, one thread) with the val set
swapped at a known step, and the real logs.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import SHARED
from synthetic import long_frame, run_from_frame

from forensics.detectors.eval_regression import EvalRegressionDetector
from forensics.detectors.train_val import TrainValDetector
from forensics.evidence import Evidence
from forensics.findings import Finding, FindingKind, Severity
from forensics.importers import read_run
from forensics.schema import canonicalize, held_out_set


def _detect(series: dict[str, tuple[np.ndarray, np.ndarray]]) -> list[Finding]:
    return TrainValDetector().detect(Evidence(run_from_frame(long_frame(series))))


def _kinds(found: list[Finding]) -> dict[FindingKind, list[Finding]]:
    out: dict[FindingKind, list[Finding]] = {}
    for f in found:
        out.setdefault(f.kind, []).append(f)
    return out


def _slow_run(
    seed: int,
    *,
    n: int = 20_000,
    step_at: int | None = None,
    step: float = 0.0,
    train_slope: float = -2e-5,
    val_every: int = 250,
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Past the early fall: train 2.0 falling slowly (train_slope per step) with 1% noise; val
    0.08 above it, 0.003 eval noise, plus ``step`` from ``step_at`` on (a swapped val set)."""
    rng = np.random.default_rng(seed)
    s = np.arange(0, n, 10)
    train = (2.0 + train_slope * s) * np.exp(rng.normal(0, 0.01, len(s)))
    vs = np.arange(val_every, n + 1, val_every)
    val = 2.08 + train_slope * vs + rng.normal(0, 0.003, len(vs))
    if step_at is not None:
        val = val + np.where(vs >= step_at, step, 0.0)
    return {"loss": (s, train), "val_loss": (vs, val)}


# -- val_shift ---------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("train_slope", [0.0, -2e-5])
@pytest.mark.parametrize("step", [0.12, -0.12])
def test_val_step_up_or_down_is_a_val_shift(seed: int, train_slope: float, step: float) -> None:
    """A step of +-0.12 between two evals at 12000 while train is flat or still falls slowly
    (val falling with it): one val_shift with the direction, nothing else."""
    found = _detect(_slow_run(seed, step_at=12_000, step=step, train_slope=train_slope))
    assert [f.kind for f in found] == [FindingKind.VAL_SHIFT], [f.summary for f in found]
    (f,) = found
    assert f.severity is Severity.WARNING
    assert 11_750 <= f.start_step <= 12_000 and f.peak_step is not None
    assert f.peak_step - f.start_step <= 500
    assert f.measures["direction"] == ("up" if step > 0 else "down")
    assert f.measures["shift"] == pytest.approx(step, abs=0.02)
    # the levels stated are the data's: old level at the last old eval, new at the first new
    assert f.measures["val_before"] == pytest.approx(2.08 + train_slope * f.start_step, abs=0.01)
    assert abs(f.measures["train_change"]) < 0.03
    assert "validation set changed" in f.summary
    assert ("rose" if step > 0 else "fell") in f.summary
    # the gap holds: its ramp is the same before and after
    assert abs(f.measures["gap_slope_after_per_1k"]) < 0.01


@pytest.mark.parametrize("seed", range(3))
def test_train_step_is_not_a_val_shift(seed: int) -> None:
    """Train and val step down together (an LR drop, a new epoch of a pass over better data):
    the val did not move alone, no val_shift."""
    d = _slow_run(seed, step_at=12_000, step=-0.15)
    s, t = d["loss"]
    d["loss"] = (s, t - np.where(s >= 12_000, 0.15, 0.0))
    assert _detect(d) == []


@pytest.mark.parametrize("seed", range(3))
def test_epoch_boundary_drop_of_train_is_not_a_val_shift(seed: int) -> None:
    """Multi-epoch fine-tuning: the train loss drops at each epoch boundary (memorisation),
    val does not. The gap steps, but train moved: not a val-set change."""
    rng = np.random.default_rng(seed)
    s = np.arange(0, 9000, 5)
    train = 1.2 - 0.15 * (s // 3000) - 1e-5 * (s % 3000)
    train = train * np.exp(rng.normal(0, 0.01, len(s)))
    vs = np.arange(150, 9001, 150)
    val = 1.3 - 2e-6 * vs + rng.normal(0, 0.002, len(vs))
    found = _detect({"loss": (s, train), "val_loss": (vs, val)})
    assert not [f for f in found if f.kind is FindingKind.VAL_SHIFT], [f.summary for f in found]


@pytest.mark.parametrize("seed", range(4))
def test_steady_ramp_is_not_a_val_shift(seed: int) -> None:
    """A gap widening steadily (val rising linearly while train falls) is not a step."""
    rng = np.random.default_rng(seed)
    s = np.arange(0, 20_000, 10)
    train = (2.0 - 2e-5 * s) * np.exp(rng.normal(0, 0.01, len(s)))
    vs = np.arange(250, 20_001, 250)
    val = 2.1 + np.where(vs > 8000, 1.5e-5 * (vs - 8000), -1e-5 * (vs - 8000))
    val = val + rng.normal(0, 0.003, len(vs))
    found = _kinds(_detect({"loss": (s, train), "val_loss": (vs, val)}))
    assert FindingKind.VAL_SHIFT not in found
    (o,) = found[FindingKind.OVERFITTING]
    assert abs(o.start_step - 8000) <= 750


# -- gap acceleration: the early warning -------------------------------------------------------
@pytest.mark.parametrize("seed", range(4))
def test_gap_ramp_is_reported_before_the_val_turns_up(seed: int) -> None:
    """Train starts memorising at 8000 (falls faster); val keeps falling until ~14000, then
    rises. gap_acceleration is detected (and dated at its onset) before the val minimum."""
    rng = np.random.default_rng(seed)
    s = np.arange(0, 24_000, 10)
    curve = 1.5 + 2.0 / (1 + s / 500) ** 0.6
    train = curve - np.where(s > 8000, 3e-9 * (s - 8000) ** 2, 0.0)
    vs = np.arange(250, 24_001, 250)
    vc = 1.55 + 2.0 / (1 + vs / 500) ** 0.6
    val = vc + np.where(vs > 14_000, 2e-9 * (vs - 14_000) ** 2 + 1e-5 * (vs - 14_000), 0.0)
    found = _kinds(
        _detect(
            {
                "loss": (s, train * np.exp(rng.normal(0, 0.01, len(s)))),
                "val_loss": (vs, val + rng.normal(0, 0.003, len(vs))),
            }
        )
    )
    assert FindingKind.VAL_SHIFT not in found
    a = found[FindingKind.GAP_ACCELERATION][0]
    assert 7000 <= a.start_step <= 11_000
    assert a.measures["detected_step"] < 14_000  # before the val minimum: the early warning
    assert a.measures["val_turned_up"] is False
    assert "has not turned up yet" in a.summary
    (o,) = found[FindingKind.OVERFITTING]
    assert a.start_step < o.start_step


# -- overfitting, however small ------------------------------------------------------------------
def _sft(seed: int, rise: float) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Three epochs of 1000 steps, eval every 200: train drops at each epoch boundary and falls
    slowly within; val falls for two epochs then rises by ``rise`` (relative) over the last."""
    rng = np.random.default_rng(seed)
    s = np.arange(1, 3001)
    train = 1.3 - 0.12 * ((s - 1) // 1000) - 3e-5 * ((s - 1) % 1000)
    train = train * np.exp(rng.normal(0, 0.03, len(s)))
    vs = np.arange(200, 3001, 200)
    val = np.where(vs <= 2000, 1.4 - 1e-4 * vs + 1.5e-8 * vs**2, 0.0)
    v_min = 1.4 - 1e-4 * 2000 + 1.5e-8 * 2000**2
    val = np.where(vs > 2000, v_min * (1 + rise * (vs - 2000) / 1000), val)
    val = val + rng.normal(0, 0.001, len(vs))
    epoch = (s, s / 1000)
    return {"loss": (s, train), "val_loss": (vs, val), "epoch": epoch}


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("rise", [0.015, 0.03])
def test_small_late_overfit_names_the_best_checkpoint(seed: int, rise: float) -> None:
    """A 1.5% (3%) rise of val over the last epoch's five evals while train falls: overfitting
    at the minimum (step 2000, the last step of epoch 2: 2.0 epochs done, as the HF Trainer
    logs it; the rise is the third epoch's), naming it as the best checkpoint."""
    found = _kinds(_detect(_sft(seed, rise)))
    (o,) = found[FindingKind.OVERFITTING]
    assert o.severity is Severity.WARNING
    assert 1800 <= o.start_step <= 2200
    assert o.measures["best_step"] == o.start_step
    assert o.measures["epoch"] == (2 if o.start_step <= 2000 else 3)
    # val_now is the median of the last three evals: the one 200 steps before the end
    assert o.measures["val_rise_pct"] == pytest.approx(100 * rise * 0.8, abs=0.4)
    assert o.measures["val_rise"] > o.judged_against["rise_floor"]
    assert o.measures["train_change_pct"] < 0
    assert f"best checkpoint is step {o.start_step:,}" in o.summary
    assert FindingKind.VAL_SHIFT not in found


@pytest.mark.parametrize("seed", range(4))
def test_flat_last_epoch_is_not_overfitting(seed: int) -> None:
    """The same run with the val flat over the last epoch: no overfitting."""
    assert FindingKind.OVERFITTING not in _kinds(_detect(_sft(seed, 0.0)))


# -- every held-out loss counts --------------------------------------------------------------
def test_eval_set_losses_are_held_out_losses() -> None:
    """eval_<set>_loss, val/<set>/loss ... are one eval set's held-out loss; scores are not."""
    for tag, metric, name in [
        ("eval_wiki_loss", "eval/wiki_loss", "wiki"),
        ("val/code/loss", "eval/code_loss", "code"),
        ("validation/hard_set_loss", "eval/hard_set_loss", "hard_set"),
        ("val_loss/wiki", "eval/loss_wiki", "wiki"),
        ("eval_loss", "val_loss", ""),
    ]:
        got, _ = canonicalize(tag)
        assert got == metric and held_out_set(metric) == name, tag
    for tag in [
        "eval_wiki_accuracy",
        "eval_wer",
        "eval_bleu",
        "eval_wiki_perplexity",
        "eval_train_loss",
        "val_loss_step",
        "eval_wiki_runtime",
    ]:
        got, _ = canonicalize(tag)
        assert got is not None and held_out_set(got) is None, tag


def _two_sets(seed: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """HF Trainer with two eval datasets (no plain eval_loss): wiki stays healthy, code turns
    up at 7000 while train falls; code's accuracy slips too."""
    rng = np.random.default_rng(seed)
    s = np.arange(0, 12_000, 10)
    train = (1.5 + 2.0 / (1 + s / 500) ** 0.6) * np.exp(rng.normal(0, 0.01, len(s)))
    vs = np.arange(250, 12_001, 250)
    base = 1.55 + 2.0 / (1 + vs / 500) ** 0.6
    o = 1.55 + 2.0 / (1 + 7000 / 500) ** 0.6
    code = np.where(vs > 7000, o + 6e-5 * (vs - 7000), base + 0.3)
    code = np.where(vs <= 7000, base + 0.3 - (1.55 + 2.0 / 15**0.6 - o), code)
    acc = np.where(vs > 7000, 0.6 - 2e-5 * (vs - 7000), 0.6 - 0.3 / (1 + vs / 500))
    return {
        "loss": (s, train),
        "eval_wiki_loss": (vs, base + rng.normal(0, 0.003, len(vs))),
        "eval_code_loss": (vs, code + 0.3 + rng.normal(0, 0.003, len(vs))),
        "eval_code_accuracy": (vs, acc + rng.normal(0, 0.002, len(vs))),
        "eval_wiki_runtime": (vs, 12 + rng.normal(0, 0.1, len(vs))),
    }


@pytest.mark.parametrize("seed", range(3))
def test_each_eval_set_is_judged(seed: int) -> None:
    """The code set overfits, the wiki set is healthy: overfitting on eval/code_loss only, its
    summary naming the set; the accuracy is eval_regression's, the losses are not."""
    ev = Evidence(run_from_frame(long_frame(_two_sets(seed))))
    found = _kinds(TrainValDetector().detect(ev))
    (o,) = found[FindingKind.OVERFITTING]
    assert o.metric == "eval/code_loss" and abs(o.start_step - 7000) <= 500
    assert o.summary.startswith("eval/code_loss turned up at step")
    assert all(f.metric == "eval/code_loss" for fs in found.values() for f in fs)
    assert not any("not run" in n and "train_val" in n for n in ev.run.notes), ev.run.notes
    regressions = EvalRegressionDetector().detect(ev)
    assert [f.metric for f in regressions] == ["eval/code_accuracy"]


def test_eval_set_perplexity_restating_its_loss_is_skipped() -> None:
    """eval/<set>_ppl is exp(eval/<set>_loss): noted, not judged twice."""
    d = _two_sets(0)
    vs, code = d["eval_code_loss"]
    d["eval_code_perplexity"] = (vs, np.exp(code))
    ev = Evidence(run_from_frame(long_frame(d)))
    assert [f.metric for f in EvalRegressionDetector().detect(ev)] == ["eval/code_accuracy"]
    assert any("eval/code_perplexity not checked" in n for n in ev.run.notes), ev.run.notes


# -- healthy: quiet ----------------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("cooldown", [False, True])
def test_healthy_with_a_cooldown_stays_quiet(seed: int, cooldown: bool) -> None:
    """Train and val falling together, with a WSD cooldown (both fall faster over the last
    20%) or without: no val_shift (up or down), no overfitting, no gap alarm."""
    rng = np.random.default_rng(seed)
    s = np.arange(0, 20_000, 10)
    curve = 2.0 + 8.0 / (1 + s / 150) ** 0.9
    extra = -0.2 * (np.clip(s - 16_000, 0, None) / 4000) ** 1.5 if cooldown else 0
    train = (curve + extra) * np.exp(rng.normal(0, 0.01, len(s)))
    vs = np.arange(200, 20_001, 200)
    vcurve = 2.05 + 8.0 / (1 + vs / 150) ** 0.9
    vextra = -0.2 * (np.clip(vs - 16_000, 0, None) / 4000) ** 1.5 if cooldown else 0
    val = vcurve + vextra + rng.normal(0, 0.003, len(vs))
    found = _detect({"loss": (s, train), "val_loss": (vs, val)})
    assert found == [], [f.summary for f in found]


# -- real tiny training ------------------------------------------------------------------------
def _mlp_run(
    swap_at: int | None = None,
    noise_after: float = 0.3,
    n_train: int = 2000,
    steps: int = 1500,
    seed: int = 0,
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """A tiny MLP regressing y = sin(3 x0) + x1^2 + label noise 0.3 on a train set, MSE; val
    every 25 steps on 1000 held-out points. From ``swap_at`` the val set is another one, with
    label noise ``noise_after`` (harder above 0.3, easier below): its MSE steps by the noise's
    variance change, the model unchanged. A small train set (64) makes it memorise."""
    torch = pytest.importorskip("torch")
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(seed)

    def data(n: int, noise: float) -> tuple:
        x = torch.rand(n, 2, generator=g) * 2 - 1
        y = torch.sin(3 * x[:, :1]) + x[:, 1:] ** 2 + noise * torch.randn(n, 1, generator=g)
        return x, y

    xt, yt = data(n_train, 0.3)
    val_a, val_b = data(1000, 0.3), data(1000, noise_after)
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(2, 64),
        torch.nn.Tanh(),
        torch.nn.Linear(64, 64),
        torch.nn.Tanh(),
        torch.nn.Linear(64, 1),
    )
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    loss_fn = torch.nn.MSELoss()
    tl, vl, vs_ = [], [], []
    for step in range(1, steps + 1):
        idx = torch.randint(0, n_train, (32,), generator=g)
        loss = loss_fn(model(xt[idx]), yt[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        tl.append(loss.item())
        if step % 25 == 0:
            xv, yv = val_b if swap_at is not None and step >= swap_at else val_a
            with torch.no_grad():
                vl.append(float(loss_fn(model(xv), yv)))
            vs_.append(step)
    return {
        "loss": (np.arange(1, steps + 1), np.array(tl)),
        "val_loss": (np.array(vs_), np.array(vl)),
    }


@pytest.mark.parametrize(("noise_after", "direction"), [(0.55, "up"), (0.05, "down")])
def test_real_training_val_set_swapped(noise_after: float, direction: str) -> None:
    """A real tiny training whose val set is swapped at step 1000 for a harder (easier) one,
    the train loss still falling slowly: a val_shift at the swap, the right way."""
    found = _detect(_mlp_run(swap_at=1000, noise_after=noise_after))
    shifts = [f for f in found if f.kind is FindingKind.VAL_SHIFT]
    assert len(shifts) == 1, [f.summary for f in found]
    (f,) = shifts
    assert 950 <= f.start_step < 1000 <= f.peak_step <= 1050
    assert f.measures["direction"] == direction
    expected = noise_after**2 - 0.3**2
    assert f.measures["shift"] == pytest.approx(expected, abs=0.05 + 0.25 * abs(expected))
    assert not [g for g in found if g.kind is not FindingKind.VAL_SHIFT], [g.summary for g in found]


def test_real_training_without_a_swap_is_quiet() -> None:
    """The same training without the swap: no validation finding."""
    found = _detect(_mlp_run())
    assert found == [], [f.summary for f in found]


def test_real_training_memorising_overfits() -> None:
    """64 training points, 2500 steps: the MLP memorises them, the held-out loss turns up while
    the train loss falls; overfitting names the best checkpoint (the minimum's eval step)."""
    d = _mlp_run(n_train=64, steps=2500)
    found = _kinds(_detect(d))
    (o,) = found[FindingKind.OVERFITTING]
    vs, vl = d["val_loss"]
    # the minimum of a noisy-flat bottom: the best eval within the eval noise of the lowest
    best = float(vl[list(vs).index(o.measures["best_step"])])
    assert best <= float(vl.min()) + 0.003 and o.start_step == o.measures["best_step"]
    assert o.measures["train_change_pct"] < 0 and o.measures["val_rise"] > 0
    assert FindingKind.VAL_SHIFT not in found


# -- real logs ---------------------------------------------------------------------------------
REAL = SHARED / "real_runs"
HEALTHY = [
    "llmc-gpt2-124M-siddanthemani/main.log",
    "llmc-gpt2-124M-hectorfcardenas/gpt2_train.11685414.log",
    "hf-trainer-tinyllama-sft",
    "modded-nanogpt/2024-10-13_llmc",
    "modded-nanogpt/2024-06-06_AdamW",
    "lightning-csv-slm-wikitext103/lightning_logs/version_0",
    "llamafactory-luojiu-7b-qlora-cpt",
    "tfevents-hf-trainer-japanese-gpt2-medium",
]


def _real(rel: str) -> Evidence:
    p = REAL / rel
    if not p.exists():
        pytest.skip(f"real log {rel} not available")
    return Evidence(read_run(p))


def test_whisper_overfitting_names_its_best_checkpoint() -> None:
    """Whisper fine-tuned ~38 epochs on a small set: val climbs from its first eval (step 1000)
    while train falls; that eval is the best checkpoint. Its WER is eval_regression's."""
    ev = _real("hf-trainer-whisper-large-v2-ja")
    (o,) = TrainValDetector().detect(ev)
    assert o.kind is FindingKind.OVERFITTING and o.metric == "val_loss"
    assert o.measures["best_step"] == o.start_step == 1000
    assert o.measures["evals_after_min"] == 4
    assert "best checkpoint is step 1,000" in o.summary
    # The numbers the log holds: 0.4123 is the median of the last three evals (0.3937,
    # 0.4123, 0.4200), and the sentence says so beside the last one.
    assert "0.321 to 0.4123 over 4 evals" in o.summary
    assert "(the median of the last 3; 0.42 at step 5,000)" in o.summary
    assert TrainValDetector().scores(ev)["val_loss"]["overfitting"] > 3
    # The trainer kept checkpoint-3000 (best_metric 0.74316 is eval_wer there): the WER kept
    # improving after the val loss turned up, and was worst at the val loss's best step.
    assert o.measures["trainer_best_step"] == 3000
    assert o.measures["trainer_best_metric"] == "eval/wer"
    assert (
        "; the trainer recorded checkpoint-3000 as its best, by eval/wer (0.7432 there, "
        "0.7888 at step 1,000)." in o.summary
    )


def test_whisper_rollback_names_the_trainers_own_best() -> None:
    """The stop-early advice keeps the lowest val loss (step 1,000) and names the checkpoint
    the trainer kept by its WER, with the condition under which that one is the better pick."""
    from conftest import shared_path

    from forensics import analyze

    d = analyze(shared_path("real_runs", "hf-trainer-whisper-large-v2-ja"))
    (plan,) = [i.rollback for i in d.incidents if i.rollback is not None]
    text = plan.sentence()
    assert "Stop early: keep the checkpoint at step 1,000" in text
    assert (
        "The trainer recorded checkpoint-3000 as its best, by eval/wer (0.7432 there, 0.7888 "
        "at step 1,000): keep that one if eval/wer is what the model is for." in text
    )
    assert "keep that one if eval/wer" in plan.why


@pytest.mark.parametrize("rel", HEALTHY)
def test_healthy_real_runs_no_validation_warning(rel: str) -> None:
    """Healthy real runs: no warning-or-worse from the train/val and eval-regression checks,
    and the overfitting and val_shift scores keep a margin below their alarm lines (the
    calibration record: README / report of issue 13)."""
    ev = _real(rel)
    found = [
        f
        for f in TrainValDetector().detect(ev) + EvalRegressionDetector().detect(ev)
        if f.severity is not Severity.INFO
    ]
    assert found == [], [f.summary for f in found]
    for scores in TrainValDetector().scores(ev).values():
        assert scores["overfitting"] < 0.5 and scores["val_shift"] < 0.8, scores
