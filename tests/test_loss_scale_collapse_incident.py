"""A loss-scale collapse and the divergence it drove are one incident, rolled back before it.

A Megatron log (every 10 iterations): fp16 at a loss scale of 65,536 until iteration 3,000,
then overflow after overflow: the scale halves to 1 by 3,030 and sits there, skipped
iterations pile up, and the loss, stuck, climbs until it is judged a divergence at about
3,200. The divergence's supported mechanism is that collapse ("was still there at the
onset"), yet the two were separate incidents, and the divergence's rollback named step
3,200, in the middle of the overflows, its last healthy step.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from forensics.findings import FindingKind
from forensics.pipeline import analyze


def _megatron_log(folder: Path) -> Path:
    rng = np.random.default_rng(3)
    lines = []
    scale = 65536.0
    for it in range(10, 5001, 10):
        loss = 3 + 5 / (1 + it / 400) + rng.normal(0, 0.02)
        gn = 1.0 + abs(rng.normal(0, 0.05))
        skipped = 0
        if it >= 3000:
            skipped = 4 if scale > 1 else 2
            scale = max(1.0, scale / 2**4)
            loss = 3 + 5 / (1 + 3000 / 400) + (it - 3000) * 0.0004 + rng.normal(0, 0.02)
            gn = 1.0 + (it - 3000) / 400 + abs(rng.normal(0, 0.1))
        lines.append(
            f" iteration {it:8d}/    5000 | consumed samples: {it * 512:12d} | elapsed time per "
            "iteration (ms): 1234.5 | learning rate: 1.500000E-04 | global batch size:   512 | "
            f"lm loss: {loss:.6E} | loss scale: {scale:.1f} | grad norm: {gn:.3f} | number of "
            f"skipped iterations: {skipped:3d} | number of nan iterations:   0 |"
        )
    folder.mkdir()
    (folder / "train.log").write_text("\n".join(lines) + "\n")
    return folder


def test_collapse_and_divergence_are_one_incident(tmp_path: Path) -> None:
    diag = analyze(_megatron_log(tmp_path / "run"))
    kinds = {f.kind: f for f in diag.findings}
    drop, div = kinds[FindingKind.LOSS_SCALE_DROP], kinds[FindingKind.DIVERGENCE]
    assert drop.start_step == 3000 and drop.end_step == 3030
    assert div.start_step > 3100
    i = diag.findings.index(div)
    assert [c.status for c in diag.causes[i] if c.cause == "loss_scale_overflow"] == ["supported"]
    (inc,) = [inc for inc in diag.incidents if div in inc.findings]
    assert drop in inc.findings
    assert inc.timeline.first is not None and inc.timeline.first.metric == "loss_scale"
    plan = inc.rollback
    assert plan is not None
    assert plan.last_healthy_step == 2990  # before the first overflow, not inside them
    assert plan.checkpoint_step == 2500
    assert "before the loss_scale_drop at step 3,000" in plan.sentence()


def test_a_scale_that_climbed_back_does_not_hold_the_onset(tmp_path: Path) -> None:
    """The same fall, but the scaler grows back to 65,536 by iteration 3,100: a divergence
    later is not rolled back to before the fall by this rule."""
    from forensics.evidence import Evidence
    from forensics.importers import read_run
    from forensics.rollback import _scale_still_down

    run = tmp_path / "back"
    _megatron_log(run)
    text = (run / "train.log").read_text().splitlines()
    out = []
    for line in text:
        it = int(line.split("iteration")[1].split("/")[0])
        if it >= 3100:
            line = line.replace("loss scale: 1.0 |", "loss scale: 65536.0 |")
        out.append(line)
    (run / "train.log").write_text("\n".join(out) + "\n")
    ev = Evidence(read_run(run))
    diag = analyze(run)
    drop = next(f for f in diag.findings if f.kind is FindingKind.LOSS_SCALE_DROP)
    assert _scale_still_down(ev, drop, 3090) is True
    assert _scale_still_down(ev, drop, 3200) is False


def test_the_skipped_iterations_after_the_collapse_are_counted(tmp_path: Path) -> None:
    """Megatron prints how many iterations it skipped in each logging interval (an fp16
    overflow skips the update). At a loss scale of 1 the generator's trainer skips 2 of
    every 10: the drop's sentence counts them from the cascade's end to the end of the log
    (the count had been read as no vital sign)."""
    diag = analyze(_megatron_log(tmp_path / "run"))
    drop = next(f for f in diag.findings if f.kind is FindingKind.LOSS_SCALE_DROP)
    # lines 3,040 .. 5,000 at 2 each; their iterations run from 3,031 to 5,000
    assert drop.measures["skipped_after"] == 2 * 197
    assert drop.measures["iterations_after"] == 5000 - 3030
    assert drop.summary.endswith(
        "; after it the trainer skipped 394 of the 1,970 iterations to step 5,000 (20%, its "
        "own count): updates that never reached the weights."
    )
    assert diag.run.metrics()["skipped_iters"] == "number of skipped iterations"


def test_no_skip_after_a_calibration_says_nothing_more() -> None:
    """A real BigScience Megatron log: the scaler's calibration skips iterations 1-30, none
    after; the drop's sentence is unchanged and its count says 0."""
    from conftest import shared_path

    diag = analyze(
        shared_path(
            "real_runs",
            "bigscience-megatron-experiments",
            "meg_gpt2_base_n8_dp1_tp4_pp8-1809562.out",
        )
    )
    drop = next(f for f in diag.findings if f.kind is FindingKind.LOSS_SCALE_DROP)
    assert drop.measures["skipped_after"] == 0 and drop.measures["iterations_after"] == 170
    assert "skipped" not in drop.summary


def test_a_few_skipped_iterations_never_read_as_none() -> None:
    """The loss_scale_collapse sample: its trainer skipped 3 of 952 iterations after the
    calibration, which the sentence had written as "(0%, its own count)"."""
    from forensics.detectors.loss_scale import _share_text

    root = Path(__file__).resolve().parents[1]
    diag = analyze(root / "sample_runs" / "loss_scale_collapse")
    calibration = next(
        f
        for f in diag.findings
        if f.kind is FindingKind.LOSS_SCALE_DROP and f.measures["skipped_after"] == 3
    )
    assert calibration.measures["iterations_after"] == 952
    assert "skipped 3 of the 952 iterations to step 1,000 (0.3%, its own count)" in (
        calibration.summary
    )
    assert [_share_text(x) for x in (0.2, 0.0123, 0.0095, 0.00315, 0.0004)] == [
        "20%",
        "1%",
        "0.9%",
        "0.3%",
        "under 0.1%",
    ]
