"""Diagnosis: verdict, findings document, timeline, order of investigation, rollback, checklists."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from synthetic import healthy_grad_norm, healthy_loss, long_frame, run_from_frame

from forensics.checklists import FAIL, NA, PASS
from forensics.diagnosis import diagnose, rollback_advice, verdict_of
from forensics.findings import Finding
from forensics.run import Run

SCHEMA = Path(__file__).resolve().parents[1] / "forensics" / "schemas" / "findings.schema.json"


def _run(n: int = 3000, every: int = 1, lr: float | None = 3e-4, extra: dict | None = None) -> Run:
    s, loss = healthy_loss(n, every=every)
    gs, gn = healthy_grad_norm(n, every=every)
    series = {"train/loss": (s, loss), "grad_norm": (gs, gn)}
    if lr is not None:
        series["lr"] = (s, np.full(len(s), lr))
    series.update(extra or {})
    return run_from_frame(long_frame(series))


def _spike(step: int, cls: str = "pathological", sev: str = "critical") -> Finding:
    return Finding(
        "loss_spike",
        sev,
        "loss",
        step,
        f"spike at {step}",
        peak_step=step + 2,
        end_step=step + 20,
        measures={"classification": cls, "height": 2.5},
    )


@pytest.mark.parametrize(
    "severities, verdict",
    [
        ([], "healthy"),
        (["info"], "healthy"),
        (["info", "warning"], "warning"),
        (["warning", "critical"], "critical"),
        (["critical", "fatal", "info"], "fatal"),
    ],
)
def test_verdict_is_the_worst_light(severities: list[str], verdict: str) -> None:
    """The verdict is the highest severity, healthy when nothing is above info."""
    fs = [Finding("plateau", s, "loss", i, "x") for i, s in enumerate(severities)]
    assert verdict_of(fs) == verdict
    assert diagnose(_run(300), fs).verdict == verdict


def test_document_follows_schema_version_2() -> None:
    """to_document has the contract's keys in order (version 1's plus causes and incidents),
    keeps step order, and is strict JSON."""
    run = _run()
    fs = [
        Finding("grad_norm_drift", "warning", "grad_norm", 500, "climb"),
        _spike(1200, "physiological", "info"),
        _spike(2000),
    ]
    doc = diagnose(run, fs).to_document()
    assert list(doc) == ["schema_version", "run", "verdict", "findings", "incidents"]
    assert doc["schema_version"] == 2
    assert all(list(f)[-2:] == ["prescription", "causes"] for f in doc["findings"])
    assert list(doc["run"]) == [
        "name",
        "path",
        "format",
        "first_step",
        "last_step",
        "metrics",
        "unjudged",  # (added in version 2, after the others: what the verdict does not cover)
        "x_unit",  # (added later in version 2: what the steps count)
    ]
    assert doc["run"]["x_unit"] == "step"
    assert doc["run"]["unjudged"] is None  # (the run logs a training loss)
    assert doc["run"]["metrics"] == {"grad_norm": "grad_norm", "loss": "train/loss", "lr": "lr"}
    assert (doc["run"]["first_step"], doc["run"]["last_step"]) == (0, 2999)
    assert [f["start_step"] for f in doc["findings"]] == [500, 1200, 2000]
    assert doc["verdict"] == "critical"
    assert all(f["prescription"] for f in doc["findings"])
    assert "No action" in doc["findings"][1]["prescription"]
    json.dumps(doc, allow_nan=False)
    if SCHEMA.is_file():
        import jsonschema

        jsonschema.validate(doc, json.loads(SCHEMA.read_text()))


def test_ranked_puts_the_worst_first() -> None:
    """The report's order: severity first, then onset."""
    fs = [
        Finding("plateau", "warning", "loss", 10, "a"),
        Finding("nan_inf", "fatal", "loss", 900, "b"),
        Finding("stall", "critical", None, 50, "c"),
    ]
    assert [f.summary for f in diagnose(_run(1000), fs).ranked()] == ["b", "c", "a"]


def test_timeline_names_the_first_mover_and_the_lag() -> None:
    """Grad norm climbing at 6500, loss spiking at 8000: the grad norm moved first, 1500 steps
    earlier."""
    fs = [
        _spike(1000, "physiological", "info"),  # a recovered spike is not part of the story
        Finding("grad_norm_drift", "warning", "grad_norm", 6500, "climb", end_step=9000),
        _spike(8000),
        Finding("eval_regression", "warning", "eval/mmlu", 8000, "mmlu fell"),
    ]
    tl = diagnose(_run(10_000), fs).timeline  # (the series cover the onsets)
    assert tl is not None
    assert [(m.metric, m.step, m.lag) for m in tl.movers] == [
        ("grad_norm", 6500, 0),
        ("loss", 8000, 1500),
        ("eval/mmlu", 8000, 1500),
    ]
    assert "gradient norm moved first" in tl.sentence()
    assert "1,500 steps later" in tl.sentence()
    assert tl.sentence(limit=1).endswith("and 1 more.")


def test_timeline_puts_a_restart_first_at_its_step() -> None:
    """A resume is what the trainer did: at the same step it comes before the loss that moved
    after it (it came second on the Lightning chain)."""
    from forensics.timeline import build_timeline

    fs = [
        Finding("resume_regression", "warning", "loss", 8000, "loss up after the resume"),
        Finding("restart", "info", None, 8000, "resumed"),
    ]
    tl = build_timeline(fs, include_info=True)
    assert [(m.metric, m.step) for m in tl.movers] == [(None, 8000), ("loss", 8000)]


def test_timeline_without_findings() -> None:
    """No actionable finding: the timeline says nothing moved."""
    tl = diagnose(_run(300), []).timeline
    assert tl is not None and tl.movers == [] and "No vital sign" in tl.sentence()


def test_investigation_goes_data_optimizer_layers() -> None:
    """The order of investigation puts data first, then the optimizer, then the layers."""
    fs = [Finding("grad_norm_drift", "warning", "grad_norm", 500, "climb"), _spike(900)]
    areas = [inv.area for inv in diagnose(_run(), fs).investigation]
    assert areas[:3] == ["data", "optimizer", "layers"]


def test_rollback_uses_saved_checkpoints() -> None:
    """With checkpoint folders beside the log, advise the latest one before the last healthy
    step."""
    run = _run()
    run.metadata["checkpoints"] = [500, 1000, 1500, 2000, 2500]
    (rb,) = rollback_advice(run, [_spike(1700)])
    assert rb.rollback and rb.last_healthy_step == 1699 and rb.checkpoint_step == 1500
    assert rb.lr_cut == (0.2, 0.5)
    assert rb.new_lr == pytest.approx((1.5e-4, 2.4e-4))
    assert "checkpoints found beside the log" in rb.checkpoint_source


def test_rollback_with_no_checkpoint_before_onset() -> None:
    """Saved checkpoints all after the onset: no checkpoint to advise, and the advice says so."""
    run = _run()
    run.metadata["checkpoints"] = [2500]
    (rb,) = rollback_advice(run, [_spike(1700)])
    assert rb.checkpoint_step is None and "no saved checkpoint" in rb.checkpoint_source


@pytest.mark.parametrize(
    "config, every, expected, source",
    [
        ({"save_steps": 200}, None, 1600, "save_steps = 200"),
        ({"checkpoint": {"interval": 300}}, None, 1500, "checkpoint.interval"),
        # keys from the periodicity analysis' list, now the one list (evidence/checkpoints.py)
        ({"callbacks": {"every_n_train_steps": 400}}, None, 1600, "every_n_train_steps = 400"),
        ({"save_freq": 700}, None, 1400, "save_freq = 700"),
        ({"logging": {"interval": 10}, "save_every": 600}, None, 1200, "save_every = 600"),
        ({}, 250, 1500, "--checkpoint-every 250"),
        ({}, None, 1500, "every 500 steps"),
    ],
)
def test_rollback_interval_sources(
    config: dict, every: int | None, expected: int, source: str
) -> None:
    """Interval from the log's config, else --checkpoint-every, else the article's 500."""
    run = _run()
    run.config.update(config)
    (rb,) = diagnose(run, [_spike(1700)], checkpoint_every=every).rollbacks
    assert rb.checkpoint_step == expected
    assert source in rb.checkpoint_source


def test_last_healthy_step_is_a_logged_step() -> None:
    """With a point every 10 steps, the last healthy step is the last logged one before the
    onset."""
    (rb,) = rollback_advice(_run(3000, every=10), [_spike(1705)])
    assert rb.last_healthy_step == 1700


def test_episode_onset_reaches_back_to_an_ongoing_drift() -> None:
    """A spike during an ongoing grad-norm climb rolls back to before the climb."""
    fs = [
        Finding("grad_norm_drift", "warning", "grad_norm", 1100, "climb", end_step=2999),
        _spike(2000),
    ]
    rbs = {rb.finding.kind.value: rb for rb in diagnose(_run(), fs).rollbacks}
    assert rbs["loss_spike"].onset_step == 1100 and rbs["loss_spike"].checkpoint_step == 1000
    drift = rbs["grad_norm_drift"]
    assert drift.rollback is False and drift.new_lr == pytest.approx((1e-4, 1e-4))


@pytest.mark.parametrize(
    "finding, cut",
    [
        (Finding("divergence", "fatal", "loss", 2000, "d"), (0.1, 0.1)),
        (Finding("nan_inf", "critical", "loss", 2000, "n"), (0.1, 0.1)),
        (_spike(2000, "unresolved", "warning"), (0.2, 0.5)),
    ],
)
def test_lr_cut_per_event(finding: Finding, cut: tuple[float, float]) -> None:
    """Red-light rollback cuts 10%; an unresolved spike gets the spike's 20-50%."""
    (rb,) = rollback_advice(_run(), [finding])
    assert rb.lr_cut == cut


def test_overfitting_goes_back_to_the_best_validation_step() -> None:
    """Overfitting: keep the checkpoint at or before the lowest validation loss; no LR cut."""
    vs = np.arange(0, 3000, 250)
    val = 2.0 + ((vs - 1250) / 1000.0) ** 2  # lowest at step 1250
    run = _run(extra={"val/loss": (vs, val)})
    (rb,) = rollback_advice(
        run, [Finding("overfitting", "warning", "val_loss", 1500, "val up", end_step=2750)]
    )
    assert rb.last_healthy_step == 1250 and rb.checkpoint_step == 1000
    assert rb.lr_cut == (0.0, 0.0) and rb.new_lr is None and "stop early" in rb.lr_cut_text


def test_no_rollback_for_benign_findings() -> None:
    """Recovered spikes, plateaus and notes get no rollback advice."""
    fs = [
        _spike(500, "physiological", "info"),
        _spike(900, "beneficial", "warning"),
        Finding("plateau", "warning", "loss", 1000, "p"),
    ]
    assert rollback_advice(_run(), fs) == []


def _items(diag, phase: str) -> dict[str, tuple[str, str]]:
    ph = next(p for p in diag.phases if p.key == phase)
    return {i.question: (i.status, i.evidence) for i in ph.items}


def test_checklists_on_a_healthy_run() -> None:
    """A clean run passes the start-up items it can measure; the rest are not measurable."""
    items = _items(diagnose(_run(6000), []), "startup")
    status = {q.split("?")[0]: s for q, (s, _) in items.items()}
    assert status["Does the gradient norm settle into a stable range (not keep diverging)"] == PASS
    assert status["Is the loss falling at the expected pace"] == PASS
    assert status["Any NaN or Inf at some step"] == PASS
    assert status["Are per-layer activation ranges reasonable"] == NA
    assert status["Does data-loading throughput reach the expected level"] == NA
    assert len(items) == 5
    diag = diagnose(_run(6000), [])
    assert [len(p.items) for p in diag.phases] == [5, 6, 4]


def test_checklist_nan_item_fails_with_evidence() -> None:
    """A NaN in the start-up phase fails the NaN item and names the step."""
    s, loss = healthy_loss(3000)
    loss[400] = np.nan
    gs, gn = healthy_grad_norm(3000)
    run = run_from_frame(long_frame({"loss": (s, loss), "grad_norm": (gs, gn)}))
    status, evidence = _items(diagnose(run, []), "startup")["Any NaN or Inf at some step?"]
    assert status == FAIL and "400" in evidence


def test_checklist_reads_findings() -> None:
    """A grad-norm drift in the middle phase fails the 'falls with the loss' item, quoting the
    finding."""
    diag = diagnose(
        _run(6000),
        [Finding("grad_norm_drift", "warning", "grad_norm", 1500, "grad norm climbing 3x")],
    )
    status, evidence = _items(diag, "middle")["Does the gradient norm fall along with the loss?"]
    assert status == FAIL and "1,500" in evidence


def test_short_run_phases_are_proportional_and_ordered() -> None:
    """A run under 2,000 steps (issue 12: "Middle (steps 1,000-500)", overlapping phases) is
    split in proportion: the first quarter, the second quarter, the second half; the phases are
    ordered, do not overlap, cover the run, and their titles state their own steps."""
    diag = diagnose(_run(1500), [])
    bounds = [(p.start, p.end) for p in diag.phases]
    assert [p.key for p in diag.phases] == ["startup", "middle", "late"]
    first, last = bounds[0][0], bounds[-1][1]
    assert all(lo <= hi for lo, hi in bounds)
    assert all(a[1] + 1 == b[0] for a, b in zip(bounds, bounds[1:], strict=False))
    assert (last - first) // 4 - 1 <= bounds[0][1] - first <= (last - first) // 4 + 1
    for p in diag.phases:
        assert f"{p.start:,}-{p.end:,}" in p.title, p.title
    middle = _items(diag, "middle")
    assert not all(s == NA for s, _ in middle.values())


def test_coverage_against_the_cadence_table() -> None:
    """Missing vital signs are named; a validation loss every 5000 steps is sparser than the
    article's 2000."""
    vs = np.arange(0, 30000, 5000)
    run = _run(30000, every=50, extra={"val/loss": (vs, np.linspace(3, 2, len(vs)))})
    rows = {c.signs: c for c in diagnose(run, []).coverage}
    assert rows["per-layer grad norm"].logged is False
    assert rows["validation loss"].logged and rows["validation loss"].sparse
    core = rows["loss, grad norm, param norm"]
    assert core.logged and not core.sparse and "missing: param_norm" in core.observed


def test_overfitting_rollback_is_not_after_the_onset() -> None:
    """A noisy val dip after the onset the finding names must not become the rollback point (found
    in review)."""
    import numpy as np
    from synthetic import long_frame, run_from_frame

    from forensics.diagnosis import diagnose
    from forensics.findings import Finding

    s = np.arange(0, 30_000, 100)
    vs = s[::5]
    val = 2.0 + np.where(vs > 25_500, 1e-9 * (vs - 25_500) ** 2, 0.0)
    val[list(vs).index(27_000)] = 1.9  # a noisy dip after the onset
    run = run_from_frame(long_frame({"loss": (s, 2 - s / 1e5), "val_loss": (vs, val)}))
    f = Finding("overfitting", "warning", "val_loss", 25_500, "val turned up", end_step=29_500)
    (rb,) = [r for r in diagnose(run, [f]).rollbacks if r.finding is f]
    assert rb.last_healthy_step is not None and rb.last_healthy_step <= 25_500


def test_checklists_read_the_evidence() -> None:
    """The activation item uses the configured limit, the start-up grad-norm item is judged
    after the evidence's warm-up end, the checkpoint item states the configured interval."""
    from forensics.evidence import Evidence
    from forensics.params import resolve

    s, _ = healthy_loss(3000)
    lr = 3e-4 * np.minimum(1.0, (s + 1) / 200)
    act = {f"activations/absmax/layers.{i}": (s[::50], np.full(60, 6000.0)) for i in range(2)}
    run = _run(3000, extra={"lr": (s, lr), **act})
    run.config["save_steps"] = 250

    def startup(ev: Evidence) -> dict[str, tuple[str, str]]:
        return _items(diagnose(ev, []), "startup")

    q_act = "Are per-layer activation ranges reasonable?"
    q_gn = "Does the gradient norm settle into a stable range (not keep diverging)?"
    default = Evidence(run)
    wu = default.warmup_end
    assert wu is not None and 150 < wu < 200  # the LR's first peak (98% of it)
    assert startup(default)[q_act][0] == PASS
    assert f"after the LR warm-up, which ends at step {wu}" in startup(default)[q_gn][1]
    assert f"first third of steps {wu}-1,000" in startup(default)[q_gn][1]
    strict = Evidence(run, resolve({"activations": {"absmax_limit": 5000}}))
    status, text = startup(strict)[q_act]
    assert status == FAIL and "limit of 5000" in text
    middle = _items(diagnose(default, []), "middle")
    assert "save_steps" in middle["Were checkpoints saved as planned?"][1]


def test_diagnosis_keeps_the_evidence_it_was_given() -> None:
    """analyze builds one Evidence with the configured parameters; the diagnosis keeps it."""
    from forensics.config import Config
    from forensics.pipeline import analyze_run

    run = _run(3000)
    cfg = Config(detectors={"grad_norm_drift": {"warn_ratio": 1.7}})
    diag = analyze_run(run, cfg)
    assert diag.evidence is not None and diag.evidence.run is run
    assert diag.ev.grad_norm_band is not None and diag.ev.grad_norm_band.warn_ratio == 1.7


@pytest.mark.parametrize(
    "job, grad_norm",
    [("hf-trainer-baize-tcm-lora", True), ("hf-trainer-whisper-large-v2-ja", False)],
)
def test_nan_check_of_an_hf_trainer_log_says_what_the_loss_cannot_show(
    job: str, grad_norm: bool
) -> None:
    """The HF Trainer logs an average in place of a NaN step loss (logging_nan_inf_filter):
    a finite loss there proves nothing; the item says so and names the grad norm when logged."""
    from conftest import shared_path

    from forensics import analyze

    d = analyze(shared_path("real_runs", job))
    items = [i for p in d.phases for i in p.items if i.question == "Any NaN or Inf at some step?"]
    passed = [i for i in items if i.status == PASS]
    assert passed
    for i in passed:
        assert "logging_nan_inf_filter" in i.evidence
        want = "the grad norm is the check" if grad_norm else "the loss alone cannot show one"
        assert want in i.evidence


def test_logging_interval_from_the_count_of_differences_is_the_plain_median() -> None:
    """The coverage's logging interval of a series in step order comes from the shared count
    of step differences: the median of the positive differences, as read from a float copy,
    on irregular intervals, repeated steps, one step logged twice only, and none apart."""
    from synthetic import long_frame, run_from_frame

    from forensics.checklists import _interval
    from forensics.evidence import Evidence

    def plain(steps: np.ndarray) -> float | None:
        d = np.diff(np.sort(steps.astype(float)))
        d = d[d > 0]
        return float(np.median(d)) if len(d) else None

    rng = np.random.default_rng(11)
    cases = [np.array([5, 5]), np.array([3, 3, 3, 9]), np.array([0, 10, 10, 30, 31])]
    for _ in range(40):
        gaps = rng.choice([0, 1, 2, 7, 50, 51], size=int(rng.integers(1, 300)))
        cases.append(np.cumsum(gaps) + int(rng.integers(0, 1000)))
    for steps in cases:
        run = run_from_frame(long_frame({"loss": (steps, np.linspace(3, 2, len(steps)))}))
        assert _interval(Evidence(run), "loss", "steps") == plain(steps), steps


def test_the_document_says_what_the_verdict_does_not_cover() -> None:
    """A log without a training loss (llm.c job 11672072 died of OOM before its first step;
    DeepSpeed-Chat's reward model logs no loss) gets a verdict that covers only what it logged.
    The terminal and the report said so; the JSON, which CI gates read, did not."""
    from conftest import shared_path

    from forensics import analyze

    doc = analyze(shared_path("real_runs", "deepspeed-chat-logs", "step2_reward")).to_document()
    assert doc["run"]["unjudged"].startswith("No training loss in the log: its checks")
    # (memory and throughput: DeepSpeed's timer line, MemAllocated and CurrSamplesPerSec;
    # skipped_iters: its step lines' running count of skipped steps, per interval)
    assert (
        "(loss_scale, lr, memory, overflow, skipped_iters, throughput)" in (doc["run"]["unjudged"])
    )
    import jsonschema

    jsonschema.validate(json.loads(json.dumps(doc)), json.loads(SCHEMA.read_text()))
    root = Path(__file__).resolve().parents[1] / "sample_runs"
    assert analyze(root / "healthy").to_document()["run"]["unjudged"] is None


def _amp_run(path, n: int = 3000):  # noqa: ANN001, ANN202
    """A JSONL fp16 run: the grad norm is inf at the seven steps whose gradients overflowed
    (every 400th), where the logged loss scale halves; the loss stays finite."""
    import json

    rng = np.random.default_rng(0)
    path.mkdir(parents=True, exist_ok=True)
    scale, good = 65536.0, 0
    with (path / "metrics.jsonl").open("w") as fh:
        for s in range(1, n + 1):
            gn = abs(0.5 + 0.05 * rng.standard_normal())
            if s % 400 == 0:
                scale, good, gn = scale / 2, 0, float("inf")
            else:
                good += 1
                if good == 300:
                    scale, good = scale * 2, 0
            loss = 2 + 3 * np.exp(-s / 800) + 0.03 * rng.standard_normal()
            row = {"step": s, "loss": loss, "lr": 3e-4, "grad_norm": gn, "loss_scale": scale}
            fh.write(json.dumps(row) + "\n")
    return path


def test_the_nan_item_agrees_with_the_nan_check_on_overflow_steps(tmp_path) -> None:  # noqa: ANN001
    """fp16 overflow steps log an inf grad norm and are skipped by the scaler: the NaN/Inf
    check sets them aside (a note) and the run is HEALTHY. The start-up item still read
    "fail: non-finite values at step 400, 800" beside the green light. It now passes, names
    the steps and says why they were set aside."""
    from forensics import analyze

    d = analyze(_amp_run(tmp_path / "amp"))
    assert d.verdict == "healthy"
    assert not [f for f in d.findings if f.kind.value == "nan_inf"]
    items = [i for p in d.phases for i in p.items if i.question == "Any NaN or Inf at some step?"]
    assert items and all(i.status == PASS for i in items), [(i.status, i.evidence) for i in items]
    start = next(i for i in d.phases[0].items if i.question == "Any NaN or Inf at some step?")
    assert start.evidence.startswith(
        "loss finite throughout the phase; grad norm non-finite at 2 steps (400, 800), set aside "
        "by the NaN/Inf check: the grad norm is non-finite at 7 step(s) where the loss scale "
        "dropped"
    ), start.evidence


def test_the_nan_item_still_fails_when_no_check_set_the_points_aside() -> None:
    """The same non-finite grad norms diagnosed without the detectors' notes (no check ran):
    the item fails, naming them."""
    s, loss = healthy_loss(3000)
    gs, gn = healthy_grad_norm(3000)
    gn[400] = np.inf
    run = run_from_frame(long_frame({"loss": (s, loss), "grad_norm": (gs, gn)}))
    status, evidence = _items(diagnose(run, []), "startup")["Any NaN or Inf at some step?"]
    assert status == FAIL and "non-finite values at step" in evidence


def test_the_no_loss_sentence_names_the_series_that_look_like_a_loss(tmp_path: Path) -> None:
    """DeepSpeed-Chat's RLHF step logs act_loss, cri_loss and unsuper_loss, none of them read
    as the training loss: the verdict's limit names them and the alias that would judge one
    (it had listed only loss_scale, lr, memory, overflow and throughput, as if nothing like a
    loss were logged). Counters and scores near the name are not offered."""
    from conftest import shared_path

    from forensics import analyze

    said = analyze(shared_path("real_runs", "deepspeed-chat-logs", "step3_rlhf")).to_document()
    assert said["run"]["unjudged"].endswith(
        " Logged under names near a loss's, and not read as one: act_loss, cri_loss, "
        "unsuper_loss; `--alias act_loss=loss` judges act_loss as the training loss."
    )
    log = tmp_path / "rl" / "metrics.jsonl"
    log.parent.mkdir()
    rows = [
        {"step": s, "lr": 1e-3, "policy_loss": 0.3 - s / 1e3, "num_tokens": 512 * s}
        for s in range(50)
    ]
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    unjudged = analyze(log.parent).to_document()["run"]["unjudged"]
    assert unjudged.endswith(
        "not read as one: policy_loss; `--alias policy_loss=loss` judges policy_loss as the "
        "training loss."
    )
    assert "num_tokens" not in unjudged
    rows = [{"step": s, "lr": 1e-3, "reward": 0.1 * s} for s in range(50)]
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert "near a loss's" not in analyze(log.parent).to_document()["run"]["unjudged"]
