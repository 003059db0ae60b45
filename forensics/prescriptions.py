"""Symptom -> likely causes -> prescription, as data: one entry per finding kind.

The table follows the seven rows of the article's "symptom to prescription" table
(section 7.1), re-worded, and extends it to every finding kind the detectors produce.
Two rows have no finding kind of their own (all vitals fine but poor generations;
persistently low throughput without a drop); they are :data:`STANDING_GUIDANCE`, shown in
every report.

Each entry also lists what to check, tagged with an *area*. The report asks the user to
check data first, then the optimizer, then the layers (the article's order of
investigation, section 3.5): external causes are the cheapest to rule out and the most
often to blame.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from forensics.findings import Finding, FindingKind

if TYPE_CHECKING:
    from forensics.causes import Cause

# The order in which the report asks the user to look (article 3.5), then the rest.
AREAS: tuple[str, ...] = ("data", "optimizer", "layers", "numerics", "infrastructure", "evaluation")
AREA_TITLES: dict[str, str] = {
    "data": "Data",
    "optimizer": "Optimizer and learning-rate schedule",
    "layers": "Layers",
    "numerics": "Numerics (precision, loss scale)",
    "infrastructure": "Infrastructure",
    "evaluation": "Evaluation set",
}

# Article row numbers (1-based, section 7.1) for cross-reference in tests and the report.
ROW_GRAD_DRIFT, ROW_SPIKE, ROW_NAN, ROW_VAL, ROW_PARAM, ROW_QUALITY, ROW_THROUGHPUT = range(1, 8)


@dataclass(frozen=True)
class Check:
    """One thing to look at, in one area."""

    area: str
    text: str


@dataclass(frozen=True)
class Prescription:
    """What a finding kind means and what to do about it."""

    kind: FindingKind | None  # None for standing guidance
    symptom: str
    causes: tuple[str, ...]
    treatment: str
    checks: tuple[Check, ...] = ()
    article_row: int | None = None  # row of the article's table (7.1) this follows
    # Alternative treatments keyed by measures["classification"] (loss spikes) or severity.
    variants: dict[str, str] = field(default_factory=dict)


def _c(area: str, text: str) -> Check:
    return Check(area, text)


_ROLLBACK_SPIKE = (
    "Roll back to the last checkpoint before the onset and resume with the learning rate "
    "cut by 20-50%; restore model and optimizer state only, keep the data position."
)

LOSS_MOVED = "loss_moved"  # the grad-norm spike variant for a transient the loss followed
EARLY_EPOCHS = "early_epochs"  # the overfitting variant for a val loss turning up in epoch 1-2
NAN_HARMLESS = "loss_back"  # isolated NaN steps after which the loss came back to its level
# Non-finite grad norms at the first logged steps that the loss did not follow (an fp16 loss
# scaler finding its scale, no loss scale logged)
NAN_AT_START = "skipped_at_start"
# The blow-up variant (NaN, divergence) whose supported cause is a grad-norm climb going on
# since before it: the climb is the disease, the NaN its end (article 2.4 and 3.5).
AFTER_CLIMB = "after_climb"
# The spike variant for one that follows an LR-schedule event (a restart, the warm-up's end)
# and came back: the schedule's doing, not a batch's (article 4.4).
SCHEDULE_SPIKE = "schedule_induced"
# the grad-norm spike variant for one the schedule set off that is more than a note (its
# lr_schedule cause supported: a warm-up's end or a restart's warm-up at its onset)
SCHEDULE_SURGE = "schedule_surge"
# The grad-norm spike variant for a step to a level it held (judged by that level): a lasting
# change to find, not a batch.
LEVEL_STEP = "level_step"
# The layer-shift variant for layers whose grad norms were all 0 before (frozen, then trained).
UNFROZEN = "unfrozen"
# The throughput-drop variant for one of several short dips at one fixed interval.
RECURRING = "recurring"
PAUSES = "pauses"  # the stall variant for repeated short pauses that add up (time lost)
HOUSEKEEPING = "housekeeping"  # the stall variant for slow steps at the log's evals or saves
HANGS = "hangs"  # the stall variant for recurring stalls or hangs (measures' stalls, events_at)
# The spike variant for one that came back and came with an fp16 overflow (the loss scale
# fell in its steps) and no bad batch the log shows: the overflow is the cause shown.
OVERFLOW_SPIKE = "numeric_overflow"
# The restart variant for a resumed job whose LR does not match the earlier attempt's at the
# steps both logged: its scheduler did not continue (forensics.importers.restarts).
LR_OFF = "lr_off"

TABLE: dict[FindingKind, Prescription] = {
    FindingKind.GRAD_NORM_DRIFT: Prescription(
        FindingKind.GRAD_NORM_DRIFT,
        "Gradient norm keeps climbing while the loss still falls.",
        (
            "Shallow layers learn too fast for the rest of the network.",
            "Embedding and output head share the trunk's learning rate although their "
            "gradients run an order of magnitude larger.",
            "Adam's second-moment estimate is dominated by a few outsized channels (low beta2).",
        ),
        "First aid: bring the learning rate down to a third until the climb stops. Then give "
        "the embedding and output head their own parameter group at about half the trunk's "
        "rate and use layer-wise learning-rate decay (start near 0.95 per layer); a beta2 "
        "closer to 0.98 makes Adam less jumpy.",
        (
            _c(
                "data",
                "Rule out a bad batch: a drift is a trend, while a bad batch gives a spike "
                "that falls back. A model memorizing a small or repeated part of its data "
                "climbs too: look for a train/validation gap widening at the same time.",
            ),
            _c(
                "optimizer",
                "Inspect Adam's exp_avg_sq spread and the parameter groups' learning rates.",
            ),
            _c(
                "layers",
                "Log per-layer gradient norms and see whether the shallow layers' share grows.",
            ),
        ),
        ROW_GRAD_DRIFT,
        variants={
            "info": "No action: the grad norm's level now is under the warning line the "
            "decaying learning rate sets (with weight decay the grad norm grows about as "
            "sqrt(lr_baseline / lr)); earlier points may have crossed that line. If a flat grad "
            "norm matters, scale the weight decay with the learning rate (AdamC).",
        },
    ),
    FindingKind.LAYER_GRAD_SHIFT: Prescription(
        FindingKind.LAYER_GRAD_SHIFT,
        "One group of layers takes a growing share of the gradient.",
        (
            "Those layers keep re-adapting to features that deeper layers moved under them.",
            "Their learning rate (or the embedding's) is too high relative to the rest.",
        ),
        "Slow the affected layers down: layer-wise learning-rate decay, or a separate group "
        "with a lower rate for the embedding, output head and shallow blocks.",
        (
            _c(
                "optimizer",
                "Compare parameter-group learning rates with the layers whose share grows.",
            ),
            _c(
                "layers",
                "Check the same layers' parameter norms: a faster-growing norm confirms it.",
            ),
        ),
        ROW_GRAD_DRIFT,
        variants={
            UNFROZEN: "No action if the layers were unfrozen on purpose at that step (a staged "
            "fine-tune); if they were meant to train from the start, check that their "
            "parameters were in the optimizer and required gradients.",
        },
    ),
    FindingKind.LOSS_SPIKE: Prescription(
        FindingKind.LOSS_SPIKE,
        "The loss jumps and does not come back to its trend.",
        (
            "The learning rate carried the weights beyond the stable part of the loss landscape.",
            "A batch of outliers (extreme lengths, malformed samples) hit the model.",
            "Activations of some layer blew up and took the gradients with them.",
        ),
        _ROLLBACK_SPIKE,
        (
            _c(
                "data",
                "Look at the batches logged at the spike steps: lengths, sources, malformed "
                "records.",
            ),
            _c(
                "optimizer",
                "Compare the learning rate at the spike with the schedule (warm-up end, restarts).",
            ),
            _c(
                "layers",
                "Pull per-layer activation maxima around the spike to find the layer that blew up.",
            ),
        ),
        ROW_SPIKE,
        variants={
            "physiological": "No action: the loss came back to its trend quickly (the article "
            "calls 100-300 steps normal), a reaction to a hard batch.",
            "beneficial": "No action: the loss settled below its level before the spike; the "
            "jump helped the model over a barrier.",
            "pathological": _ROLLBACK_SPIKE,
            "diverged": "Part of the divergence it lies in: follow that card's rollback; this "
            "spike needs no treatment of its own.",
            "unresolved": "The log ends before the loss recovered. If it has not recovered "
            "within about 500 steps: " + _ROLLBACK_SPIKE,
            OVERFLOW_SPIKE: "No action for the loss itself: it came back to its trend "
            "quickly. The loss scale fell in the same steps (an fp16 overflow, see its causes): "
            "the loss-scale drop's card says what to check.",
            SCHEDULE_SPIKE: "No action for one: it follows the LR schedule (a restart or the "
            "warm-up's end) and came back, the schedule's doing rather than a disease. If one "
            "comes with every restart, the LR climbs too fast there: lengthen the warm-up at "
            "each restart.",
        },
    ),
    FindingKind.DIVERGENCE: Prescription(
        FindingKind.DIVERGENCE,
        "Loss (and gradient norm) rise together and do not come back: the run diverges.",
        ("The learning rate is above the stable region for the current state of the weights.",),
        "Roll back to the last healthy checkpoint and restart with the learning "
        "rate 10% lower (cut more if it diverges again); keep the data position.",
        (
            _c("data", "Check whether the onset coincides with a new data shard or source."),
            _c(
                "optimizer",
                "Compare the learning rate at the onset with the schedule; look for a missing "
                "warm-up after a resume.",
            ),
            _c("layers", "Find the first layer whose activations or gradients left their range."),
        ),
        ROW_SPIKE,
        variants={
            AFTER_CLIMB: "Roll back to before the grad-norm climb the log shows from before the "
            "divergence (see its causes), not only before the divergence, and treat the climb "
            "as the article does for a grad norm that keeps rising: a lower learning rate for "
            "the shallow layers, the embedding and the output head (layer-wise decay); keep "
            "the data position.",
        },
    ),
    FindingKind.LOSS_CLIMB: Prescription(
        FindingKind.LOSS_CLIMB,
        "The training loss climbed and stayed up while the grad norm did not climb with it.",
        (
            "A learning rate too high for this stage of training.",
            "A change in the data: a new shard, source or mix, or a stretch of bad data.",
            "A change in the job: a resume that restored the wrong state, or a new setting.",
        ),
        "Find what changed at the onset (the data order and sources, the LR, the job's "
        "settings); if nothing did, roll back to the last checkpoint before the onset and "
        "resume with the learning rate 20-50% lower, keeping the data position.",
        (
            _c("data", "Check whether the onset coincides with a new data shard or source."),
            _c(
                "optimizer",
                "Compare the learning rate at the onset with the schedule; look for a restart "
                "or a resume there.",
            ),
        ),
        ROW_SPIKE,
    ),
    FindingKind.NAN_INF: Prescription(
        FindingKind.NAN_INF,
        "The loss or the gradient norm became NaN or infinite.",
        (
            "A gradient overflowed.",
            "The fp16 loss scale misbehaved (too high, or stuck at its floor).",
        ),
        "Stop and look before resuming. Check the loss scale around the step, "
        "consider training in bf16, and find the layer with extreme activation values.",
        (
            _c(
                "data",
                "Check the batch at the first non-finite step for extreme lengths or weights.",
            ),
            _c("numerics", "Plot the loss scale around the step; check the precision mode."),
            _c(
                "layers",
                "Capture activation max/min per layer just before the step; a layer past about "
                "1e4 is the suspect.",
            ),
        ),
        ROW_NAN,
        variants={
            AFTER_CLIMB: "The non-finite values ended a grad-norm climb the log shows from "
            "before them (see its causes): roll back to before the climb, not only before "
            "the NaN, and treat the climb as the article does for a grad norm that keeps rising: "
            "a lower learning rate for the shallow layers, the embedding and the output head "
            "(layer-wise decay), then watch the grad norm against its baseline.",
            NAN_HARMLESS: "Look, but do not roll back: the loss came back to its level after "
            "the non-finite steps, so their updates were skipped (or only the logged value was "
            "bad). Find what made them non-finite (the batch at that step, the loss scale "
            "there) before it recurs and stays.",
            NAN_AT_START: "Nothing to do if the run trains in fp16: its loss scaler skips the "
            "first steps while it lowers its scale. Log the loss scale (or the overflow "
            "count) so the next report can show it; non-finite grad norms that go on after "
            "the first steps need the batch and the scale at those steps looked at.",
        },
    ),
    FindingKind.LOSS_SCALE_DROP: Prescription(
        FindingKind.LOSS_SCALE_DROP,
        "The mixed-precision loss scale fell sharply: gradients overflowed.",
        (
            "Part of the gradient left the fp16 range.",
            "Some layer's activations (often attention) grew far too large.",
        ),
        "Check the loss scale history and the activation extremes at that step; if drops "
        "repeat, move to bf16 or tame the offending layer.",
        (
            _c(
                "data",
                "Check the batch at the drop for unusually long sequences or extreme weights.",
            ),
            _c(
                "numerics",
                "See whether the scale recovers or keeps falling over the following steps.",
            ),
            _c("layers", "Capture per-layer activation max/min around the drop to find the layer."),
        ),
        ROW_NAN,
        variants={
            "info": "No action: a dynamic loss scale starts high and halves until the gradients "
            "fit fp16 (its calibration at the start), and an isolated halving or two later is "
            "how it keeps them there. Act if drops repeat or the scale keeps falling.",
        },
    ),
    FindingKind.OVERFITTING: Prescription(
        FindingKind.OVERFITTING,
        "Validation loss rises while the training loss still falls.",
        (
            "Overfitting, when it appears after a few epochs.",
            "A shift of the validation set's distribution, when it appears suddenly or late.",
        ),
        "Stop early (keep the checkpoint with the best validation loss), add dropout or "
        "weight decay, and make sure the validation set is the version you think it is.",
        (
            _c(
                "data",
                "Confirm the validation set did not change (version, preprocessing) and shares no "
                "documents with training.",
            ),
            _c("optimizer", "Consider a lower learning rate for the remaining epochs."),
            _c(
                "evaluation",
                "Check the validation set is large enough (thousands of samples) for a stable "
                "estimate.",
            ),
        ),
        ROW_VAL,
        # by the epoch it turned up in (the article grades epochs 1-2, 3-4, and 5 on)
        variants={
            EARLY_EPOCHS: "Keep the checkpoint with the best validation loss. Turning up in "
            "the first two epochs means the model is large for this data (the article's "
            "reading): more data or more varied data (augmentation), or fewer trainable "
            "parameters, before any schedule tuning; and check the validation set is the "
            "version you think it is.",
            "critical": "Stop now from the checkpoint with the best validation loss: from the "
            "fifth epoch on with the gap still accelerating, the overfitting is well under way. "
            "For any further epochs lower the learning rate and add dropout or weight decay.",
        },
    ),
    FindingKind.GAP_ACCELERATION: Prescription(
        FindingKind.GAP_ACCELERATION,
        "The gap between validation and training loss widens faster than before.",
        ("The model starts to memorise the training data: an early sign of overfitting.",),
        "Act before the validation loss turns. Plan an early stop, add "
        "regularisation, or lower the learning rate; keep the checkpoint before the onset.",
        (
            _c(
                "data",
                "Check for duplicates between training and validation and for repeated epochs.",
            ),
            _c("evaluation", "Confirm the validation set is unchanged across the run."),
        ),
        ROW_VAL,
    ),
    FindingKind.VAL_SHIFT: Prescription(
        FindingKind.VAL_SHIFT,
        "Validation loss stepped to a new level while training loss was flat.",
        ("The validation data or its preprocessing changed; the model did not.",),
        "Check the validation set's version and preprocessing before touching the training recipe.",
        (
            _c(
                "data",
                "Diff the validation data and its preprocessing between the two sides of the step.",
            ),
            _c("evaluation", "Re-evaluate an older checkpoint on today's validation set."),
        ),
        ROW_VAL,
    ),
    FindingKind.PARAM_NORM_JUMP: Prescription(
        FindingKind.PARAM_NORM_JUMP,
        "The parameter norm jumped instead of growing slowly.",
        ("Weight updates were too large, or abnormal gradients got through.",),
        "Check the gradient-clipping configuration and whether gradient accumulation "
        "bypasses the clip (clipping per micro-batch instead of on the summed gradient).",
        (
            _c("data", "Check the batch at the jump."),
            _c(
                "optimizer",
                "Verify where clipping happens relative to accumulation, and the clip threshold.",
            ),
            _c("layers", "See which layers' parameter norms jumped."),
        ),
        ROW_PARAM,
    ),
    FindingKind.THROUGHPUT_DROP: Prescription(
        FindingKind.THROUGHPUT_DROP,
        "Training throughput fell and stayed low.",
        (
            "The data loader became the bottleneck.",
            "GPUs throttled their clocks (heat, power).",
            "Communication between devices slowed down.",
        ),
        "Profile a few steps, add data-loader workers, and check GPU clocks and NVLink / "
        "network utilisation around the drop.",
        (
            _c("data", "Check data-loader wait time per step; more workers or prefetching."),
            _c(
                "infrastructure", "Check GPU clocks and temperatures, and interconnect utilisation."
            ),
        ),
        ROW_THROUGHPUT,
        variants={
            RECURRING: "No action for the run's health: a pause on a schedule. If the time it "
            "costs matters, save checkpoints asynchronously or less often, or evaluate on "
            "fewer batches.",
        },
    ),
    FindingKind.GRAD_NORM_SPIKE: Prescription(
        FindingKind.GRAD_NORM_SPIKE,
        "The gradient norm spiked and fell back.",
        ("An unusual batch (outlier samples, extreme length mix) produced large gradients.",),
        "Usually no action; if spikes recur, find the batches behind them and fix the "
        "sampler or the data.",
        (
            _c(
                "data",
                "Match the spike steps to batch contents: extreme length mixes, noisy samples.",
            ),
            _c("optimizer", "Check the clip threshold relative to the baseline gradient norm."),
        ),
        variants={
            "critical": "Over 3x the baseline: pause and look at the batch and the clip "
            "threshold before going on.",
            "diverged": "Part of the divergence it lies in: follow that card's rollback; this "
            "spike needs no treatment of its own.",
            "unresolved": "The log ends before the gradient norm could come back: judge it "
            "again on a longer log; if it stays up, it is a climb (see the drift checks).",
            LOSS_MOVED: "Look at the batch behind it: the loss moved with the gradient, so the "
            "optimizer did not simply absorb it; if such spikes recur, find their batches and "
            "fix the sampler or the data.",
            SCHEDULE_SPIKE: "It follows the LR schedule (a restart or the warm-up's end), not "
            "a batch, and came back: no action for one. If one comes with every restart, the "
            "LR climbs too fast there: lengthen the warm-up at each restart.",
            SCHEDULE_SURGE: "The LR schedule set it off (see its causes): the gradient norm "
            "rose past the lines as the LR got back to its peak, not one batch. Lengthen the "
            "warm-up at each restart, or restart to a lower peak LR, and check the clip "
            "threshold against the baseline gradient norm before the next restart.",
            LEVEL_STEP: "A lasting step, not one batch: find what changed at that step (the "
            "data mix or sequence length, a resumed job's optimizer state, the LR, the clip "
            "threshold, a frozen or unfrozen layer). At 2x the baseline or more, watch the loss "
            "and the evals for the damage the article's drift case shows; roll back to before "
            "the step if they turn.",
        },
    ),
    FindingKind.GRAD_NORM_OUTLIERS: Prescription(
        FindingKind.GRAD_NORM_OUTLIERS,
        "Single-batch gradient-norm outliers, each back at once with the loss unmoved.",
        ("Unusual batches (outlier samples, extreme length mixes) the optimizer absorbed.",),
        "No action: a long run has such batches and the optimizer absorbed these. If they "
        "grow more frequent or higher, match their steps to the batches and fix the sampler "
        "or the data.",
        (
            _c(
                "data",
                "Match the highest outliers' steps to batch contents: extreme length mixes, "
                "noisy samples.",
            ),
            _c("optimizer", "Check the clip threshold relative to the baseline gradient norm."),
        ),
    ),
    FindingKind.PERIODIC_SPIKES: Prescription(
        FindingKind.PERIODIC_SPIKES,
        "Loss spikes recur at a regular interval.",
        (
            "A data source refreshed on a schedule brings in samples unlike the rest.",
            "Learning-rate restarts or non-smooth points in the schedule.",
        ),
        "Match the period to the data pipeline and the LR schedule; mix refreshed data in "
        "gradually, or lengthen the warm-up at each restart.",
        (
            _c("data", "Look for a data subset that updates at the spike period."),
            _c("optimizer", "Compare spike steps with the LR schedule's restarts and kinks."),
        ),
    ),
    FindingKind.ACTIVATION_OUTLIER: Prescription(
        FindingKind.ACTIVATION_OUTLIER,
        "A layer's activations left their usual range.",
        (
            "That layer updates too aggressively.",
            "Attention scores concentrate on a few tokens, inflating the outputs.",
        ),
        "Treat it as an early warning of NaNs: lower that layer's learning rate, check the "
        "clip threshold, and inspect the inputs that produce the outliers.",
        (
            _c("data", "Find the sequences that produce the outliers."),
            _c(
                "layers",
                "Watch the layer's activation std and max across steps; a jump precedes NaNs.",
            ),
        ),
    ),
    FindingKind.EVAL_REGRESSION: Prescription(
        FindingKind.EVAL_REGRESSION,
        "An evaluation score fell although the training loss did not.",
        (
            "Hidden instability (a climbing gradient norm, layers reorganising).",
            "The model over-specialises on the training domain.",
        ),
        "Compare with the gradient norm and per-layer panels before reaching for weight "
        "decay; fall back to the best checkpoint if the score keeps falling.",
        (
            _c("data", "Check the training data mix against what the benchmark measures."),
            _c("optimizer", "Look for a gradient-norm climb starting before the regression."),
            _c("evaluation", "Make sure the evaluation itself did not change."),
        ),
    ),
    FindingKind.PLATEAU: Prescription(
        FindingKind.PLATEAU,
        "The loss stopped falling.",
        (
            "The learning rate is too low (or decayed too early) for further progress.",
            "The data is exhausted or repeated.",
        ),
        "Check that the loss's slowdown matches the LR schedule; if not, review the schedule "
        "and the data position.",
        (
            _c("data", "Check for the end of an epoch or a repeated shard."),
            _c("optimizer", "Compare the plateau's start with the LR schedule."),
        ),
    ),
    FindingKind.NO_LEARNING: Prescription(
        FindingKind.NO_LEARNING,
        "The loss never fell: the run has not learned anything.",
        (
            "The learning rate is zero (a schedule that starts or stays at 0).",
            "The learning rate never reaches the optimizer (a scheduler or parameter-group "
            "bug), or is far too low to move the weights.",
            "The gradients never reach the weights (frozen parameters, a detached graph, "
            "an optimizer built before the model was moved or wrapped).",
            "The labels do not match the inputs (shifted, shuffled apart, or padding only).",
        ),
        "Stop the run: its compute is spent on nothing. Check the learning rate the optimizer "
        "actually applies and that the weights change between two steps, then overfit a "
        "single batch before relaunching.",
        (
            _c("data", "Decode a batch: inputs and labels must line up."),
            _c(
                "optimizer",
                "Print the optimizer's parameter groups and learning rates; count the "
                "parameters with requires_grad.",
            ),
        ),
    ),
    FindingKind.STALL: Prescription(
        FindingKind.STALL,
        "The run stopped making steps for a while.",
        ("A hung collective, a stalled data loader, preemption or slow storage.",),
        "Check the cluster's and scheduler's logs for that time; look for communication "
        "timeouts and data-loader deadlocks.",
        (
            _c("data", "Check the data loader and storage at that time."),
            _c("infrastructure", "Check node health, preemptions and collective timeouts."),
        ),
        variants={
            HOUSEKEEPING: "No action for the run's health: the job's own evaluation or "
            "checkpoint pauses. If the time they cost matters, evaluate on fewer batches or "
            "save checkpoints asynchronously or less often.",
            HANGS: "Match the hangs' steps against the cluster's and scheduler's logs: "
            "hangs that recur usually share one cause (a collective that times out and "
            "retries, a data worker that dies and is restarted, a node that is pre-empted); "
            "look for communication timeouts and data-loader deadlocks.",
            PAUSES: "Profile a few steps around one of the pauses: a data loader that cannot "
            "keep up (more workers, prefetching), synchronous checkpoint or logging writes "
            "(make them asynchronous) and waits on the network or storage are the usual "
            "sources; match the pauses' times against the cluster's logs.",
        },
    ),
    FindingKind.MEMORY_GROWTH: Prescription(
        FindingKind.MEMORY_GROWTH,
        "Memory keeps growing and does not fall back.",
        ("Allocator fragmentation, or tensors kept alive across steps (a leak).",),
        "Look for tensors accumulated across steps (losses kept without .item()), and try "
        "the allocator's expandable segments.",
        (
            _c(
                "infrastructure",
                "Compare allocated and reserved memory to tell fragmentation from a leak.",
            ),
        ),
    ),
    FindingKind.RESTART: Prescription(
        FindingKind.RESTART,
        "The job restarted and logged some steps again.",
        ("A crash, preemption or manual resume.",),
        "Check that the resume loaded the intended checkpoint and restored the data "
        "position; the analysis keeps the later segment.",
        (
            _c(
                "data",
                "Confirm the data loader resumed where it stopped rather than from the start.",
            ),
        ),
        variants={
            LR_OFF: "Restore the LR scheduler's state with the checkpoint (save and load "
            "scheduler.state_dict() beside the optimizer's; the HF Trainer's "
            "resume_from_checkpoint loads it from the checkpoint folder), or start the "
            "schedule at the resumed step, so the LR continues where it left off; check the "
            "data position too. Judge the steps since the resume against the LR they had.",
        },
    ),
    FindingKind.REPLACED_ATTEMPT: Prescription(
        FindingKind.REPLACED_ATTEMPT,
        "An attempt went wrong in steps that a resume from an earlier checkpoint logged again.",
        (
            "The attempt blew up or stalled and was rolled back; what made it fail may still "
            "be there in the resumed job.",
        ),
        "Check what the resumed job changed (learning rate, data order, precision, the "
        "batches skipped) and watch it through the steps where the attempt went wrong; the "
        "charts show the resumed job there, not the attempt.",
        (
            _c("optimizer", "Compare the LR and the grad norm of both attempts at those steps."),
            _c("data", "Check whether the resumed job reads the same batches there."),
        ),
    ),
    FindingKind.RESUME_REGRESSION: Prescription(
        FindingKind.RESUME_REGRESSION,
        "After the job resumed, the training loss drifted up instead of on down.",
        (
            "The resume did not restore the whole training state (optimizer moments, LR "
            "schedule position, data position).",
            "The training itself degrades from here on; the resume only marks where.",
        ),
        "Check that the resume restored the optimizer state, the LR schedule's step and the "
        "data loader's position; roll back to the best checkpoint before the regression.",
        (
            _c("optimizer", "Compare the LR and optimizer state logged just before and after."),
            _c("data", "Confirm the data loader resumed where it stopped."),
        ),
    ),
    FindingKind.RESUME_DROP: Prescription(
        FindingKind.RESUME_DROP,
        "After the job resumed, its loss ran below the earlier job's on the steps both logged "
        "from the same checkpoint.",
        (
            "The resumed job's data loader started over instead of resuming at its saved "
            "position: it re-reads batches the checkpoint has already trained on, and the "
            "lower loss is memorization.",
            "The resumed job reads another, easier data mix (a changed dataset or sampling "
            "weights).",
        ),
        "Check that the checkpoint holds the data loader's or sampler's position (consumed "
        "samples, the epoch and the shuffling seed) and that resuming loads it; if it did "
        "not, go back to the checkpoint and resume with the position restored, or count the "
        "replayed steps as seen twice.",
        (
            _c(
                "data",
                "Compare the first batches the resumed job read with the ones the earlier job "
                "read after the same checkpoint.",
            ),
            _c("data", "Check the resumed job's data config against the earlier job's."),
        ),
    ),
    FindingKind.RESUME_SETBACK: Prescription(
        FindingKind.RESUME_SETBACK,
        "After the job resumed, its loss ran above the earlier job's on the steps both logged "
        "from the same checkpoint, or stepped up at the seam and stayed up.",
        (
            "The resume did not restore the whole training state: the optimizer's moments, "
            "the loss scaler or part of the weights started afresh.",
            "The job resumed from an older checkpoint than the step it went on counting from.",
            "The resumed job reads another, harder data mix (a changed dataset or sampling "
            "weights).",
        ),
        "Check that resuming loads the model and the optimizer state (with the loss scaler and "
        "the LR scheduler) from the latest checkpoint; if it did not, go back to that "
        "checkpoint and resume with the whole state restored.",
        (
            _c(
                "optimizer",
                "Compare the LR, grad norm and loss scale logged just before and just after "
                "the resume.",
            ),
            _c(
                "data",
                "Check which checkpoint the resumed job loaded, and its data config, against "
                "the earlier job's last save.",
            ),
        ),
    ),
    FindingKind.LR_RESTART: Prescription(
        FindingKind.LR_RESTART,
        "The LR schedule started over mid-run: the LR fell back and warmed up again.",
        (
            "The scheduler's state was not restored when the job resumed, or a changed config "
            "rebuilt it from its first step.",
            "A schedule with warm restarts, as configured; a bump in the loss at each restart "
            "means the LR climbs back too fast (article 4.4).",
        ),
        "If the restarts are planned and the loss jumps at each, lengthen each restart's "
        "warm-up; otherwise nothing to do.",
        (
            _c("optimizer", "Compare the LR logged around the restart with the planned schedule."),
            _c(
                "optimizer",
                "Check that checkpoints hold the LR scheduler's state and that resuming loads it.",
            ),
        ),
        variants={
            "warning": "Unless this second warm-up was planned, find why the schedule started "
            "over: check that checkpoints hold the LR scheduler's state and that resuming loads "
            "it, and that the config did not reset its steps. The loss gave back progress it had "
            "made; a planned re-warm-up (continued pre-training) pays this cost by design.",
        },
    ),
    FindingKind.TRUNCATED_LOG: Prescription(
        FindingKind.TRUNCATED_LOG,
        "The log ends in the middle of a record.",
        ("The job was killed or the disk filled up while writing.",),
        "Check the job's exit status and free disk space; the last steps may be missing.",
        (_c("infrastructure", "Check the scheduler's record of how the job ended."),),
    ),
    FindingKind.CRASH: Prescription(
        FindingKind.CRASH,
        "The job ended before it finished: an error, or the scheduler or a person stopped it.",
        (
            "See the error in the log; the vitals just before it often point to the cause.",
            "A time limit or a cancel: the log's last lines name it; the training did not fail.",
        ),
        "Read how it ended. After an error, check the vitals in the last steps before it and "
        "resume from the last healthy checkpoint once fixed; after a time limit or a cancel, "
        "resume from the last healthy checkpoint.",
        (_c("infrastructure", "Read the traceback and the scheduler's exit record."),),
        # by the reason the log gives (measures["reason"]); "traceback" keeps the general text
        variants={
            "out_of_memory": "Out of device memory: lower the micro-batch size (keep the global "
            "batch with gradient accumulation), turn on activation checkpointing or shard the "
            "optimizer state; if memory climbed before it, look for tensors kept across steps.",
            "nccl": "A collective (NCCL) failed: find the first rank that failed in the ranks' "
            "logs (one rank's crash or OOM often shows as a timeout on the others), check the "
            "network, and resume from the last checkpoint once the nodes are healthy.",
            "cuda": "A CUDA error: rerun with CUDA_LAUNCH_BLOCKING=1 to find the kernel; an "
            "illegal memory access often comes from a custom kernel, an index out of range or "
            "a faulty GPU (check its Xid / ECC errors).",
            "assertion": "A failed assertion: its message names the check; usually a setting or "
            "a shape to correct before relaunching.",
            "time_limit": "Not a training failure: resume from the last checkpoint, and save more "
            "often or ask for a longer limit so less work is lost.",
            "cancelled": "Not a training failure: resume from the last checkpoint if the run "
            "should go on.",
            "killed": "Killed from outside, often the host's out-of-memory killer (CPU memory: "
            "data loader workers, pinned buffers): check the node's kernel log, then resume "
            "from the last checkpoint.",
        },
    ),
}

# What to do about an incident's supported root cause where it says more than its finding's
# row (a bad batch behind a loss-scale drop: find the batch, not "move to bf16").
CAUSE_ADVICE: dict[str, str] = {
    "bad_batch": "find that batch (the data loader's position at that step) and fix or drop "
    "the sample; the loss came back at once, so there is nothing to roll back. If bad batches "
    "recur, filter the data (lengths, encodings, empty documents).",
    "grad_norm_climb": "treat the grad-norm climb that came first, as the article does for a "
    "grad norm that keeps rising under a falling loss: give the embedding and output head "
    "their own parameter group at about half the trunk's rate and use layer-wise "
    "learning-rate decay; fall back to the best checkpoint if the scores keep falling.",
    "lr_change": "put the learning rate back on its schedule first (a typo in the config, or "
    "the scheduler state a resumed job loaded, set it off); the signs after it followed that "
    "change. Roll back to a checkpoint from before it if the evals have already suffered; "
    "other remedies only if the signs go on once the LR is back.",
}

# Added to an incident's advice where an abnormal gradient moved the weights (a param-norm
# jump in the step of a grad-norm spike: causes "large_gradient").
LARGE_GRADIENT_ADVICE = (
    "The parameter norm jumped in the same update and held: that gradient reached the weights "
    "unbounded, so check the gradient-clipping threshold and that gradient accumulation does "
    "not bypass the clip (clipping each micro-batch instead of the summed gradient)."
)

STANDING_GUIDANCE: tuple[Prescription, ...] = (
    Prescription(
        None,
        "Every vital sign looks normal, but generations are poor.",
        (
            "The evaluation does not measure what the model is for.",
            "The training data mix does not match the deployment's needs.",
            "Tasks in a multi-task mix pull the gradients in opposite directions.",
        ),
        "Step outside training monitoring: revisit the benchmarks against the goal, compare "
        "the data mix with real usage, and check for conflicting gradients between tasks.",
        (
            _c(
                "data",
                "Compare the training data's mix (languages, domains, tasks) with the "
                "deployment's.",
            ),
            _c("evaluation", "Check that the benchmarks measure what the model is meant to do."),
        ),
        ROW_QUALITY,
    ),
    Prescription(
        None,
        "Throughput is low throughout the run.",
        (
            "The data loader cannot keep up.",
            "GPUs run below their clocks.",
            "Communication between devices is the bottleneck.",
        ),
        "Profile the data loader and the interconnect: add loader workers, check GPU clocks "
        "and NVLink / network utilisation.",
        (
            _c("data", "Measure the time each step waits for data."),
            _c("infrastructure", "Check GPU clocks and interconnect utilisation with a profiler."),
        ),
        ROW_THROUGHPUT,
    ),
)


def entry(kind: FindingKind | str) -> Prescription:
    """The table entry for a finding kind."""
    return TABLE[FindingKind(kind)]


# The checks for a grad-norm step to a level it held: what changed at that step, not the
# batch behind one spike.
_LEVEL_STEP_CHECKS = (
    _c(
        "data",
        "Look for what changed in the data at the step the level moved: a new mix, source or "
        "sequence length.",
    ),
    _c(
        "optimizer",
        "Compare the LR, the clip threshold and the optimizer state (a resumed job's) before "
        "and after that step.",
    ),
)


def checks_for(finding: Finding) -> tuple[Check, ...]:
    """The checks a finding calls for: its row's, or its variant's where the row's do not fit
    (a grad-norm level step is not a batch to find)."""
    if finding.kind is FindingKind.GRAD_NORM_SPIKE and finding.measures.get("judged_by") == "level":
        return _LEVEL_STEP_CHECKS
    return TABLE[finding.kind].checks


def prescribe(finding: Finding, causes: Sequence[Cause] = ()) -> str:
    """The prescription for one finding, adjusted to its classification or severity, and to
    its causes where one the log supports changes the treatment (``causes``: the finding's
    tested causes, :func:`forensics.causes.causes_of`).

    One rule for the light: the table's texts name none; a finding that calls for action gets
    its own severity's light in front ("Red light: ..." for a fatal one), so the colour a text
    names always follows the severity (:data:`forensics.findings.LOOKS`).
    """
    p = TABLE.get(finding.kind)
    if p is None:  # a kind added without a table entry: the test suite catches this
        return ""
    cls = finding.measures.get("classification")
    reason = finding.measures.get("reason")
    climb = any(c.cause == "grad_norm_climb" and c.status == "supported" for c in causes)
    lr_moved = _supported(causes, "lr_change")
    if finding.kind is FindingKind.NAN_INF and finding.measures.get("skipped_at_start") is True:
        text = p.variants[NAN_AT_START]
    elif finding.kind is FindingKind.NAN_INF and finding.measures.get("loss_back") is True:
        text = p.variants[NAN_HARMLESS]
    elif lr_moved is not None and finding.kind is not FindingKind.CRASH:
        # The log shows the LR leaving its schedule at the onset: the sign's own row (clip
        # settings, the batch, the sampler) treats what the LR change set off.
        text = _after_lr_change(lr_moved.steps[0] if lr_moved.steps else finding.start_step)
    elif climb and AFTER_CLIMB in p.variants:
        text = p.variants[AFTER_CLIMB]
    elif (
        finding.kind is FindingKind.LOSS_SCALE_DROP
        and finding.severity.value != "info"  # (a note: its own row's words)
        and (bad := _supported(causes, "bad_batch")) is not None
    ):
        # One batch overflowed fp16 (its loss spiked and came back at once): the batch is the
        # thing to find; the row's "move to bf16" is for drops that come without one.
        text = _after_bad_batch(bad.steps[0] if bad.steps else finding.start_step)
    elif finding.kind is FindingKind.RESTART and finding.measures.get("lr_reshaped") is True:
        text = p.variants[LR_OFF]
    elif finding.kind is FindingKind.CRASH and isinstance(reason, str) and reason in p.variants:
        text = p.variants[reason]
    elif finding.kind is FindingKind.OVERFITTING and _early_epoch(finding):
        text = p.variants[EARLY_EPOCHS]
    elif _schedule_surge(p, finding, causes) and finding.severity.value == "critical":
        # (the orange light's pause first: "no action for one" under it read as a contradiction)
        text = "Over 3x the baseline: pause before going on. " + p.variants[SCHEDULE_SURGE]
    elif _after_schedule(finding) and SCHEDULE_SPIKE in p.variants:
        text = p.variants[SCHEDULE_SPIKE]
    elif _schedule_surge(p, finding, causes):
        text = p.variants[SCHEDULE_SURGE]
    elif (
        _after_overflow(finding)
        and OVERFLOW_SPIKE in p.variants
        and not reads_as_hard_batch(finding, causes)
    ):
        text = p.variants[OVERFLOW_SPIKE]
    elif _loss_moved(finding):
        text = p.variants[LOSS_MOVED]
    elif finding.measures.get("frozen_before") is True and UNFROZEN in p.variants:
        text = p.variants[UNFROZEN]
    elif finding.measures.get("recurs_every") is not None and RECURRING in p.variants:
        text = p.variants[RECURRING]
    elif finding.measures.get("stalls") is not None and HANGS in p.variants:
        text = p.variants[HANGS]
    elif finding.measures.get("pauses") is not None and PAUSES in p.variants:
        text = p.variants[PAUSES]
    elif finding.measures.get("housekeeping") is not None and HOUSEKEEPING in p.variants:
        text = p.variants[HOUSEKEEPING]
    elif finding.measures.get("judged_by") == "level" and LEVEL_STEP in p.variants:
        text = p.variants[LEVEL_STEP]
    elif isinstance(cls, str) and cls in p.variants:
        text = p.variants[cls]
    elif finding.severity.value in p.variants:
        text = p.variants[finding.severity.value]
    else:
        text = p.treatment
    prefix = light_prefix(finding)
    first = text.split(" ", 1)[0]
    if prefix and (first == "A" or (len(first) > 1 and first[0].isupper() and first[1:].islower())):
        text = text[0].lower() + text[1:]  # "Red light: roll back ...", not "Red light: Roll"
    return prefix + text


def _after_lr_change(step: int) -> str:
    """The treatment of a sign whose supported cause is an LR change no schedule explains
    (still off at the end of the log, or back on schedule since: the text holds for both)."""
    return (
        f"The learning rate left its schedule at step {step:,} (see its causes): find what "
        "set it off (a typo in the config, the scheduler state a resumed job loaded, a manual "
        "change) and keep the LR on its schedule from there. Roll back to a checkpoint from "
        "before that step if the run has suffered; treat this sign on its own only if it "
        "comes back with the LR on schedule."
    )


def _supported(causes: Sequence[Cause], cause: str) -> Cause | None:
    """The first of ``causes`` with that id that the log supports (None if none)."""
    return next((c for c in causes if c.cause == cause and c.status == "supported"), None)


def _after_bad_batch(step: int) -> str:
    """The treatment of a loss-scale drop whose supported cause is a bad batch."""
    return (
        f"The overflow came with a bad batch at step {step:,} (see its causes): find that "
        "batch (the data loader's position at that step) and fix or drop the sample. Move to "
        "bf16 or tame the offending layer only if the scale keeps falling at steps without "
        "such a batch."
    )


def reads_as_hard_batch(finding: Finding, causes: Sequence[Cause]) -> bool:
    """Is a loss spike that came back read as a hard batch (the article's physiological
    spike)? Yes unless its measured cause is another the log shows (an fp16 overflow, the
    LR schedule) and no bad batch is supported beside it. The prescription and the report's
    card both ask this."""
    if _supported(causes, "bad_batch") is not None:
        return True
    return finding.measures.get("cause") not in ("numeric_overflow", "schedule_induced")


def _after_overflow(finding: Finding) -> bool:
    """A spike that came with a loss-scale overflow (its measured cause) and came back."""
    m = finding.measures
    return m.get("cause") == "numeric_overflow" and m.get("classification") == "physiological"


def _schedule_surge(p: Prescription, finding: Finding, causes: Sequence[Cause]) -> bool:
    """A grad-norm spike judged by the lines (a warning or worse) whose LR-schedule cause the
    log supports: the schedule set it off, not one batch."""
    return (
        SCHEDULE_SURGE in p.variants
        and finding.severity.value in ("warning", "critical")
        and finding.measures.get("judged_by") == "band"
        and _supported(causes, "lr_schedule") is not None
    )


def _after_schedule(finding: Finding) -> bool:
    """A spike that follows an LR-schedule event (its measured cause) and came back."""
    m = finding.measures
    return m.get("cause") == "schedule_induced" and m.get("classification") in (
        "physiological",
        "beneficial",
    )


def _early_epoch(finding: Finding) -> bool:
    """An overfitting finding whose val loss turned up in the first or second epoch."""
    epoch = finding.measures.get("epoch")
    return isinstance(epoch, int) and epoch <= 2


def light_prefix(finding: Finding) -> str:
    """``"Orange light: "`` for a critical finding that calls for action, '' otherwise."""
    if not needs_action(finding):
        return ""
    return f"{finding.severity.light.capitalize()} light: "


def needs_action(finding: Finding) -> bool:
    """False for findings the table says to leave alone (a recovered or helpful spike, notes).
    A grad-norm spike that came back at once but moved the loss with it is a warning whose
    sentence says to check that batch: it calls for that look. A grad-norm spike or level
    step above a note was judged by the 2x / 3x lines: it calls for the look its light asks."""
    if finding.severity.value == "info":
        return False
    if _loss_moved(finding):
        return True
    if finding.kind is FindingKind.GRAD_NORM_SPIKE and finding.measures.get("judged_by") in (
        "band",
        "level",
    ):
        # Its severity is the 2x / 3x lines' (the article's yellow and orange lights), which
        # its shape's class does not lift: an orange light that recovered still says pause
        # and look (its prescription), and its incident must say so too.
        return True
    return finding.measures.get("classification") not in ("physiological", "beneficial")


def _loss_moved(finding: Finding) -> bool:
    """A grad-norm spike judged by its quick recovery whose loss moved with it."""
    m = finding.measures
    return (
        finding.kind is FindingKind.GRAD_NORM_SPIKE
        and m.get("judged_by") == "recovery"
        and m.get("loss_response") is True
        and finding.severity.value != "info"
    )
