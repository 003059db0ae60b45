"""The measures of every finding kind: key, type, whether it can be null, fixed values, meaning.

This table is the one declaration of what a finding's ``measures`` hold. From it come the
per-kind ``measures`` of the JSON Schema (``scripts/schema_gen.py``) and the README's measures
reference (``scripts/measures_reference.py``); ``Finding`` rejects a key its kind does not
declare, and the tests check that the schema, the README and the emitted values agree with it.

A finding need not carry every declared key (``truncated_log`` says only what its format
knows); a key it carries has the declared type. ``float`` accepts an int (JSON has one number
type); NaN and Inf are never emitted (they become null, see ``findings.clean_measure``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

MeasureType = type[float] | type[int] | type[str] | type[bool]


@dataclass(frozen=True, kw_only=True)
class Measure:
    """One declared measure of a finding kind."""

    key: str
    type: MeasureType
    meaning: str
    null: bool = False  # the value can be null
    values: tuple[str, ...] = ()  # the fixed set of values (str measures only)
    required: bool = False  # every finding of the kind carries it

    def accepts(self, value: object) -> bool:
        """Whether a (JSON-safe) value has this measure's type and one of its fixed values."""
        if value is None:
            return self.null
        if self.type is bool:
            return isinstance(value, bool)
        if isinstance(value, bool):
            return False
        if self.type is float:
            return isinstance(value, (int, float))
        if not isinstance(value, self.type):
            return False
        return not self.values or value in self.values


def _m(
    key: str,
    type_: MeasureType,
    meaning: str,
    *,
    null: bool = False,
    values: Iterable[str] = (),
    required: bool = False,
) -> Measure:
    return Measure(
        key=key, type=type_, meaning=meaning, null=null, values=tuple(values), required=required
    )


SPIKE_CLASSES = ("physiological", "pathological", "beneficial", "unresolved", "diverged")
LR_KINK_KINDS = ("warmup_end", "restart", "drop", "cooldown")  # spike_context.ScheduleEvent
SPIKE_CAUSES = ("numeric_overflow", "schedule_induced", "grad_norm_led")
CRASH_REASONS = (
    "out_of_memory",
    "nccl",
    "cuda",
    "assertion",
    "time_limit",
    "cancelled",
    "killed",
    "traceback",
)

# Shared by loss_spike and grad_norm_spike (spikes.py measures both the same way).
_SPIKE = (
    _m("peak_value", float, "the series at the peak"),
    _m("baseline", float, "local robust baseline at the peak (median of the preceding points)"),
    _m("height", float, "peak_value - baseline (series units)"),
    _m(
        "height_ratio",
        float,
        "peak_value / baseline (null when the series has non-positive values)",
        null=True,
    ),
    _m("z", float, "robust z-score of the peak (log units for positive series)"),
    _m(
        "two_sided",
        bool,
        "the baseline also used the following points (near the start of the log or in the warm-up)",
    ),
    _m("points", int, "logged points flagged in the spike"),
    _m("log_interval", float, "typical logging interval of the series (steps)"),
    _m("width_steps", int, "steps spent above the alarm line around the peak"),
    _m(
        "recovered",
        bool,
        "the series came back inside the band of the extrapolated pre-spike trend",
    ),
    _m(
        "recovery_steps",
        int,
        "steps from the peak to the first point back inside that band with the median of it"
        " and the next two there too (null if never)",
        null=True,
    ),
    _m("recovered_step", int, "step where it was back (null if never)", null=True),
    _m(
        "last_raised_step",
        int,
        "the last logged step before recovered_step, still raised: the return happened after "
        "it and by recovered_step (null if never back); pathological by recovery only when it "
        "is `recover_steps` or more after the peak",
        null=True,
    ),
    _m(
        "plateau_shift",
        float,
        "post-recovery steady level minus the extrapolated trend (series units); null with a "
        "level trend, or for a grad-norm outlier back within its transient limit (its "
        "recovery is its shape: the later level is not its doing)",
        null=True,
    ),
    _m("plateau_shift_rel", float, "the same, relative to the trend", null=True),
    _m(
        "settled",
        str,
        "higher or lower: the plateau lies clearly off the trend (beyond the tolerance plus "
        "the slope's uncertainty there); within: it does not; null where no plateau is "
        "measured",
        null=True,
    ),
    _m(
        "excess_area",
        float,
        "sum of (value - trend) x steps from onset to recovery (series units x steps)",
    ),
    _m("excess_area_rel", float, "the same with the excess relative to the trend (steps)"),
    _m(
        "trend",
        str,
        "trend: a robust line was fitted before the spike; level: too few points for one",
        values=("trend", "level"),
    ),
    _m("steps_logged_after_peak", int, "how far the log goes past the peak"),
    _m(
        "classification",
        str,
        "physiological: back on its trend (a transient grad-norm outlier: by its recovery "
        "alone); pathological: settled higher or came back too "
        "slowly; beneficial: settled lower; unresolved: still above its trend when the log ends; "
        "diverged: inside a diverged stretch, part of that divergence",
        values=SPIKE_CLASSES,
    ),
    _m(
        "divergence_from",
        int,
        "onset of the diverged stretch the spike lies in (null: none)",
        null=True,
    ),
    _m(
        "judged_by",
        str,
        "the rule that gave the severity: divergence (part of one: info), unresolved (at most "
        "warning), shape (loss: article 4.3), recovery (a transient grad-norm outlier), band "
        "(the grad-norm band's 2x / 3x lines against its peak), level (a grad-norm step to a "
        "level it held: the same lines against that level)",
        values=("divergence", "unresolved", "shape", "recovery", "band", "level"),
    ),
    _m(
        "loss_scale_drop",
        bool,
        "a loss-scale drop / fp16 overflow was logged at the spike (numeric overflow)",
    ),
    _m(
        "lr_kink_step",
        int,
        "step of the LR-schedule event the spike follows (schedule-induced: a warm-up end, "
        "restart, step drop or cooldown start up to its onset, within the causes' reach; for "
        "a grad-norm outlier the optimizer absorbed, at its onset or one logging interval "
        "before), else null",
        null=True,
    ),
    _m(
        "lr_kink_kind",
        str,
        "the kind of that event (null if none)",
        null=True,
        values=LR_KINK_KINDS,
    ),
    _m(
        "cause",
        str,
        "what the spike followed: an fp16 overflow, an LR-schedule kink or a grad-norm spike "
        "(null: none of these)",
        null=True,
        values=SPIKE_CAUSES,
    ),
)

_GAP_NOISE = _m(
    "val_noise", float, "noise of the val-train gap (robust sigma, at least the val noise)"
)


def _resume_gap(name: str, difference: str) -> tuple[Measure, ...]:
    """The measures of ``resume_drop`` (``name`` "drop") and ``resume_setback`` ("rise"): the
    resumed job's loss against the earlier job's, per step, as ``difference`` reads."""
    return (
        _m(
            "mode",
            str,
            "overlap: the steps both jobs logged, compared job against job; seam: no step "
            "logged twice, the points after the seam against the trend of those before",
            values=("overlap", "seam"),
        ),
        _m("seam_step", int, "first step the resumed job logged"),
        _m(
            "new_file",
            str,
            "the log file that begins at the seam when that file is what shows the resume "
            "(null: a restart the importer recorded)",
            null=True,
        ),
        _m(
            "points",
            int,
            "overlap: steps both jobs logged a loss at; seam: points on each side judged "
            "(drop_seam_points before, twice that after)",
        ),
        _m(
            "loss_earlier",
            float,
            "overlap: the earlier job's median loss on those steps; seam: the median the "
            "trend before the seam predicts for the first points after it",
        ),
        _m("loss_resumed", float, "the resumed job's median loss on the same steps"),
        _m(
            f"{name}_pct",
            float,
            f"median of the per-step differences ({difference}), % of the earlier level",
        ),
        _m(
            f"{name}_first_half_pct",
            float,
            "the same over the first half of those steps (seam: the first drop_seam_points)",
        ),
        _m(f"{name}_second_half_pct", float, "the same over the second half (seam: the next)"),
        _m(
            "noise_pct",
            float,
            f"standard error of {name}_pct (robust sigma of the differences / sqrt(points))",
        ),
        _m("lr_earlier", float, "the earlier job's median LR on those steps", null=True),
        _m("lr_resumed", float, "the resumed job's median LR there (null: no LR)", null=True),
    )


MEASURES: dict[str, tuple[Measure, ...]] = {
    "loss_spike": (
        # The schema has always required a loss spike's classification.
        *(replace(m, required=True) if m.key == "classification" else m for m in _SPIKE),
        _m(
            "grad_norm_lead_steps",
            int,
            "a grad-norm spike began this many steps before the loss spike (null if none)",
            null=True,
        ),
        _m(
            "rose_after_to",
            float,
            "a pathological spike the loss never came back from and went on rising after: "
            "its highest value after the peak (null otherwise)",
            null=True,
        ),
        _m("rose_after_step", int, "the step of that value (null otherwise)", null=True),
        _m(
            "rose_since_value",
            float,
            "where the climb such a spike is part of began: the loss's lowest value within "
            "100 logged points before the onset, below the local baseline, at least 3 points "
            "before it and rising on two thirds of the steps since (null otherwise)",
            null=True,
        ),
        _m("rose_since_step", int, "the step of that value (null otherwise)", null=True),
        _m(
            "climb_grad_norm_early",
            float,
            "median grad norm over the first third of the climb's logged points, from "
            "rose_since_step (or the onset) to rose_after_step (null: no such climb, or fewer "
            "than 3 grad-norm points in that third)",
            null=True,
        ),
        _m(
            "climb_grad_norm_late",
            float,
            "median grad norm over its last third (null as climb_grad_norm_early)",
            null=True,
        ),
        _m(
            "highest_value",
            float,
            "the highest loss logged from start_step to end_step: peak_value unless the loss "
            "stood furthest above its local baseline at a lower point (a falling baseline)",
        ),
        _m("highest_step", int, "the step of highest_value"),
    ),
    "grad_norm_spike": (
        *_SPIKE,
        _m(
            "transient",
            bool,
            "back inside the band within `transient_steps`, above the alarm line for at most "
            "`transient_points` logged points",
        ),
        _m("loss_response", bool, "a loss spike began within the lead window around it"),
        _m(
            "leads_loss_by_steps",
            int,
            "steps by which it preceded the loss spike (null if none)",
            null=True,
        ),
        _m(
            "run_baseline",
            float,
            "the run's grad-norm baseline (median after LR warm-up, article 6.1)",
            null=True,
        ),
        _m(
            "ratio_to_run_baseline",
            float,
            "peak_value / run_baseline (article: 2x yellow, 3x orange)",
            null=True,
        ),
        _m(
            "held_level",
            float,
            "a step to a level held to the spike's end (not back, its peak within that level's "
            "noise): the median from the peak on; null for a spike",
            null=True,
        ),
        _m(
            "held_ratio",
            float,
            "held_level / run_baseline (or / the local baseline without a band): the ratio a "
            "level step is judged by; null for a spike",
            null=True,
        ),
    ),
    "grad_norm_outliers": (
        _m(
            "count",
            int,
            "grad-norm spikes back within `transient_steps`, at most `transient_points` "
            "logged points above the alarm line, with the loss unmoved and no "
            "overflow or schedule event at them (each one's step in `events_at`)",
            required=True,
        ),
        _m(
            "per_1k_steps",
            float,
            "count per 1,000 steps of the grad norm's logged span (null: a span of one step)",
            null=True,
        ),
        _m("highest_ratio", float, "the highest peak / its local baseline among them"),
        _m("highest_step", int, "the step of that peak"),
        _m("highest_value", float, "the grad norm at that peak"),
        _m("highest_baseline", float, "its local baseline"),
        _m("median_ratio", float, "the median of their peak / local baseline ratios"),
        _m("longest_recovery_steps", int, "the most steps one took to come back"),
    ),
    "periodic_spikes": (
        _m("period_steps", float, "median interval between the periodic spikes"),
        _m("count", int, "spikes in the pattern"),
        _m("first_interval", float, "fitted interval at the first spike"),
        _m("last_interval", float, "fitted interval at the last spike"),
        _m(
            "interval_trend",
            float,
            "change of the interval per spike (steps; negative = shrinking)",
        ),
        _m("shrinking", bool, "last_interval <= `shrink_ratio` x first_interval"),
        _m(
            "spread",
            float,
            "robust spread of the intervals around their line, relative to the period",
        ),
        _m(
            "matches",
            str,
            "which revealed period it matches (null: none)",
            null=True,
            values=("epoch", "eval_interval", "checkpoint_interval", "lr_restart"),
        ),
        _m("matched_period_steps", float, "that period (steps)", null=True),
        _m("multiple", int, "period_steps / matched_period_steps, rounded", null=True),
        _m(
            "phase_steps",
            float,
            "for a match: median offset of the spikes from the matched period's grid",
            null=True,
        ),
        _m("spike_steps", str, "the onsets, comma-separated (first 20)"),
    ),
    "divergence": (
        _m(
            "loss_before",
            float,
            "median loss over the smoothing's width of points before the onset (the level the "
            "rise left)",
        ),
        _m(
            "loss_peak",
            float,
            "highest smoothed loss in the rise (null when it ended in NaN / Inf)",
            null=True,
        ),
        _m("loss_rise_rel", float, "loss_peak / loss_before - 1"),
        _m(
            "grad_norm_before",
            float,
            "median grad norm over the window before the onset",
            null=True,
        ),
        _m("grad_norm_during", float, "median grad norm over the rise", null=True),
        _m("grad_norm_ratio", float, "grad_norm_during / grad_norm_before", null=True),
        _m(
            "grad_norm_late",
            float,
            "median grad norm over the last third of the rise (null: fewer than 3 points)",
            null=True,
        ),
        _m(
            "grad_norm_late_ratio",
            float,
            "grad_norm_late / grad_norm_before (either ratio at `grad_rise` counts)",
            null=True,
        ),
        _m("steps_observed", int, "steps from the onset to the end of the rise (or of the log)"),
        _m(
            "returned_step",
            int,
            "step where the loss came back down (null if it never did)",
            null=True,
        ),
        _m("ended_nonfinite", bool, "the loss or grad norm turned NaN / Inf during the rise"),
        _m("confirmed", bool, "not back within `window` steps (or ended non-finite)"),
        _m("window", int, "the parameter: steps the rise must last"),
    ),
    "loss_climb": (
        _m(
            "loss_before",
            float,
            "median loss over the points before the onset (as many as the climb has, at most)",
        ),
        _m("loss_after", float, "median loss over the last third of the climb's points"),
        _m("rise_pct", float, "loss_after over loss_before, in %"),
        _m("points_before", int, "points in loss_before"),
        _m("points_after", int, "points in loss_after"),
        _m("steps_observed", int, "steps from the onset to the last logged step"),
        _m(
            "noise_sigma",
            float,
            "the log loss's noise (robust sigma from second differences); the rise must "
            "exceed climb_noise_k standard errors of the two medians",
        ),
        _m(
            "grad_norm_ratio",
            float,
            "median grad norm over the climb / before it (null: no grad norm logged)",
            null=True,
        ),
    ),
    "nan_inf": (
        _m("first_bad_step", int, "first step whose value is NaN or +-Inf"),
        _m("first_bad_value", str, "the first non-finite value", values=("nan", "inf", "-inf")),
        _m(
            "last_finite_step",
            int,
            "the last finite step before it (null when the series starts bad)",
            null=True,
        ),
        _m("last_finite_value", float, "the value there", null=True),
        _m(
            "bad_points",
            int,
            "non-finite points in the whole series (nan_iters: the iterations the trainer "
            "counted as having a NaN / Inf loss)",
        ),
        _m(
            "last_bad_step",
            int,
            "the finding's end: the last step of the last persistent stretch (or of the last "
            "stretch when none persists)",
        ),
        _m("bad_runs", int, "separate stretches of non-finite points"),
        _m(
            "first_run_points",
            int,
            "length of the first stretch (logged points; nan_iters: logging intervals)",
        ),
        _m(
            "recovered_step",
            int,
            "first finite step after the first stretch (null if none)",
            null=True,
        ),
        _m(
            "persistent",
            bool,
            "a stretch of at least `persist_points` points, or one at the end of the log "
            "(only the former where a loss scale is logged: an fp16 scaler skips such steps; "
            "nan_iters: at least `persist_points` intervals in a row with every iteration "
            "counted)",
        ),
        _m(
            "persistent_from",
            int,
            "step where the persistent stretch began (null if none)",
            null=True,
        ),
        _m("bad_fraction", float, "bad_points / all points"),
        _m(
            "loss_before",
            float,
            "isolated non-finite steps only: median of the 20 finite loss points before them "
            "(null when persistent or too few points)",
            null=True,
        ),
        _m("loss_after", float, "the same after the last non-finite step", null=True),
        _m(
            "loss_back",
            bool,
            "loss_after no higher than loss_before by 3x the noise of such a median (or 1%): "
            "the update was skipped, nothing to roll back (null when not measured)",
            null=True,
        ),
        _m(
            "skipped_at_start",
            bool,
            "true for a grad norm non-finite at the first logged steps (at most 16) that the "
            "loss did not follow, with no loss scale logged: updates skipped while an fp16 "
            "loss scaler finds its scale (a hypothesis), info; loss_before / loss_after are "
            "then the loss's median at those steps and over the next 5 points",
        ),
    ),
    "loss_scale_drop": (
        _m(
            "pattern",
            str,
            "cascade: halvings in quick succession; sustained_decline: separate drops that "
            "its growth never made up for (the level the scale held, its median over the "
            "trailing decline_steps, stays at least decline_halvings below its earlier highest; "
            "the fall takes decline_steps or the scale kept overflowing down there)",
            values=("cascade", "sustained_decline"),
        ),
        _m(
            "from_scale",
            float,
            "scale before the first halving (a decline: the highest level it held before; null "
            "when only overflow lines are known)",
            null=True,
        ),
        _m(
            "from_step",
            int,
            "step at which from_scale was logged (null when it was not: overflow lines, or a "
            "scale logged only where it was reduced); with sparse logging, steps before the "
            "finding's start",
            null=True,
        ),
        _m(
            "to_scale",
            float,
            "scale after the last halving (a decline: the lowest level it held; null likewise)",
            null=True,
        ),
        _m(
            "to_step",
            int,
            "step where a sustained decline's scale first fell to the lowest level it held "
            "(null for a cascade)",
            null=True,
        ),
        _m(
            "last_scale",
            float,
            "a sustained decline's scale at its last step, where it may have grown back part "
            "of the way (null for a cascade)",
            null=True,
        ),
        _m(
            "halvings",
            float,
            "number of halvings (log2 of from/to; one per overflow line otherwise)",
        ),
        _m(
            "steps",
            int,
            "steps the cascade spans, or the decline from the last point at its earlier level "
            "to to_step",
        ),
        _m(
            "overflow_steps",
            int,
            "overflow lines logged inside it (null for a sustained decline)",
            null=True,
        ),
        _m(
            "skipped_after",
            int,
            "iterations the trainer counted as skipped after the cascade, to the end of the "
            "log (Megatron's number of skipped iterations; null when not logged, or for a "
            "sustained decline)",
            null=True,
        ),
        _m(
            "iterations_after",
            int,
            "the iterations those counts cover (null with skipped_after)",
            null=True,
        ),
        _m("drops", int, "separate drop events (sustained_decline only; 1 for a cascade)"),
        _m(
            "calibration",
            bool,
            "it happened in the scaler's calibration: its first descent, within the first 200 "
            "steps and before the scale first grew back",
        ),
        _m(
            "coincides_with_spike",
            bool,
            "a loss spike began in the same step window",
        ),
        _m("spike_step", int, "onset of that spike (null if none)", null=True),
        _m(
            "source",
            str,
            "loss_scale: the logged scale; overflow: only the log's overflow lines",
            values=("loss_scale", "overflow"),
        ),
    ),
    "grad_norm_drift": (
        _m(
            "baseline",
            float,
            "grad-norm level the climb is judged from: the baseline after the LR warm-up, or "
            "where the grad norm settled when it went on falling below settled_below x that "
            "(baseline_kind)",
        ),
        _m("baseline_start_step", int, "first step of the baseline window"),
        _m("baseline_end_step", int, "last step of the baseline window"),
        _m(
            "baseline_kind",
            str,
            '"early" (the median after the LR warm-up, the chart\'s shaded band) or "settled" '
            "(the median of baseline_window steps around the lowest stretch after it)",
            values=("early", "settled"),
        ),
        _m("early_baseline", float, "grad-norm median after the LR warm-up (the chart's band)"),
        _m("early_ratio", float, "current / early_baseline"),
        _m("current", float, "grad-norm level now (median of the last 2% of points, >= 5)"),
        _m("current_points", int, "how many points current is the median of"),
        _m("ratio", float, "current / baseline"),
        _m("peak", float, "highest smoothed grad-norm level after the onset"),
        _m("peak_ratio", float, "peak / baseline"),
        _m("onset_value", float, "smoothed grad-norm level at the onset step"),
        _m(
            "slope_per_1k_steps",
            float,
            "Theil-Sen slope of the grad norm from the onset, per 1000 steps",
        ),
        _m(
            "loss_slope_per_1k_steps",
            float,
            "Theil-Sen slope of the loss over the same window (null: no loss)",
            null=True,
        ),
        _m(
            "loss_change_pct",
            float,
            "loss level change from the onset to the end, in % (medians of 5%)",
            null=True,
        ),
        _m(
            "loss_rises",
            bool,
            "the loss rose with the grad norm (a rising trend, or ended over 2% higher) and no "
            "divergence took it: the prelude to one, never explained by the LR schedule",
        ),
        _m(
            "warning_step",
            int,
            "first step where the smoothed level reached warn_ratio x baseline",
        ),
        _m("critical_step", int, "same for crit_ratio (null if never reached)", null=True),
        _m("spikes_excluded", int, "number of spike points left out of the fits"),
        _m("lr_logged", bool, "false when no LR was logged (the schedule could not be judged)"),
        _m("lr_baseline", float, "median LR over the baseline window (null: no LR)", null=True),
        _m("lr_now", float, "median LR over the recent points (null: no LR)", null=True),
        _m(
            "expected_rise",
            float,
            "the rise the LR decay explains now: min(envelope_max, (lr_baseline / lr_now) ** "
            "envelope_exponent), at least 1 (null: no LR)",
            null=True,
        ),
        _m("excess", float, "ratio / expected_rise (the part the schedule does not explain)"),
        _m(
            "envelope_score",
            float,
            "ratio / the moving warning line now, max(warn_ratio, envelope_margin x "
            "expected_rise) (>= 1: beyond what the schedule explains)",
        ),
        _m("lr_phase", str, "LR schedule phase at the last step (null: no LR)", null=True),
        _m(
            "divergence_step",
            int,
            "onset of a divergence after the baseline window: the climb is judged up to it, "
            "and what follows is the divergence's (null: none)",
            null=True,
        ),
        _m(
            "lr_phase_at_warning",
            str,
            "LR schedule phase where the climb passed warn_ratio (null: no LR)",
            null=True,
        ),
        _m(
            "schedule_explained",
            bool,
            "true when the climb stayed under the moving warning line: info, not a drift",
        ),
    ),
    "param_norm_jump": (
        _m(
            "abrupt",
            bool,
            "true for a jump; false for a crossing of 1.5x (surge or slow growth)",
        ),
        _m("before", float, "param norm just before the jump (jumps only)", null=True),
        _m(
            "after",
            float,
            "the level it settled at: median of up to `window` points from the jump's end",
            null=True,
        ),
        _m(
            "change_pct",
            float,
            "(after - before) / before in %, or growth over the run (info)",
        ),
        _m(
            "robust_z",
            float,
            "the jump's increment over the local increment scale; for a jump spread over m "
            "points, its move less m x the pace before, over sqrt(m) x that pace's noise "
            "(jumps only)",
            null=True,
        ),
        _m("persistent", bool, "true when the level stays changed (false: a one-off blip)"),
        _m("baseline", float, "param-norm baseline (median after the LR warm-up)"),
        _m("ratio", float, "after (or current) / baseline"),
        _m(
            "crossing_step",
            int,
            "first step at ratio_limit x baseline (crossings only)",
            null=True,
        ),
        _m(
            "growth_pct_per_1k_steps",
            float,
            "Theil-Sen growth rate up to the crossing, % of the baseline",
            null=True,
        ),
        _m(
            "pace_ratio",
            float,
            "recent growth pace / pace of the whole way (>= 3: a surge, warning)",
            null=True,
        ),
        _m(
            "source",
            str,
            "the series judged (param_norm_layer: the total rebuilt from the layers)",
            values=("param_norm", "param_norm_layer"),
        ),
    ),
    "layer_grad_shift": (
        _m("layer", int, "first layer index of the group"),
        _m("layers", str, 'the group, compact (`"0-3"`)'),
        _m("n_layers", int, "layers in the group"),
        _m("n_layers_logged", int, "layers with a grad-norm series"),
        _m(
            "share_definition",
            str,
            "a layer's share is norm^2 / sum of norm^2 over layers",
            values=("squared",),
        ),
        _m("share_before", float, "group share in the early window (0..1)"),
        _m(
            "share_after",
            float,
            "group share over the last stretch (0..1): its median, or its second half's where "
            "a group without the deepest layer is still rising through it",
        ),
        _m("share_ratio", float, "share_after / share_before (null: no early share)", null=True),
        _m("peak_share", float, "highest smoothed group share"),
        _m(
            "param_growth_group_pct_per_1k",
            float,
            "mean param-norm growth of the group, % per 1000 steps (null: not logged)",
            null=True,
        ),
        _m("param_growth_rest_pct_per_1k", float, "same for the other layers", null=True),
        _m(
            "param_growth_by_layer",
            str,
            '`"layer:pct"` list for every layer (null: not logged)',
            null=True,
        ),
        _m(
            "frozen_before",
            bool,
            "every grad norm the group logged in the early window was 0 (frozen layers "
            "trained since: an unfreezing, a note)",
        ),
    ),
    "activation_outlier": (
        _m("layer", int, "layer index (null: a model-wide series logged without one)", null=True),
        _m(
            "trigger",
            str,
            "absmax: above the limit; std_jump: the std jumped by the ratio limit; "
            "absmax_jump: the absmax jumped 100x its recent median under the limit (a note)",
            values=("absmax", "std_jump", "absmax_jump"),
        ),
        _m(
            "value",
            float,
            "absmax at the peak, or the std at the peak (null: non-finite)",
            null=True,
        ),
        _m("limit", float, "the absmax limit (absmax) or the std ratio limit (std_jump)"),
        _m(
            "before",
            float,
            "typical level before the onset (median of the preceding points)",
            null=True,
        ),
        _m("ratio", float, "peak / before", null=True),
        _m("points_over", int, "how many logged points were over the limit"),
    ),
    "overfitting": (
        _m("val_min", float, "val loss at the onset (its lowest point)"),
        _m("val_now", float, "val loss now (median of the last val points)"),
        _m("val_rise", float, "val_now - val_min"),
        _m(
            "train_change_pct",
            float,
            "smoothed train-loss change from the onset to the end, in %",
            null=True,
        ),
        _m("gap_at_onset", float, "gap at the onset"),
        _m("gap_now", float, "gap now"),
        _m(
            "epoch",
            int,
            "epoch (1-based) at the onset; null when no epoch series",
            null=True,
        ),
        _m(
            "epoch_now",
            int,
            "epoch (1-based) at the last val step; null when no epoch series",
            null=True,
        ),
        _m("gap_accelerating", bool, "true when the gap was still accelerating at the end"),
        _GAP_NOISE,
        _m("val_rise_pct", float, "val_rise in % of val_min", null=True),
        _m("evals_after_min", int, "number of evals after the minimum"),
        _m(
            "eval_noise",
            float,
            "the held-out loss's own eval noise (robust sigma), what the rise had to beat",
        ),
        _m("best_step", int, "eval step of the lowest held-out loss: the best checkpoint"),
        _m(
            "best_checkpoint",
            int,
            "saved (or configured-interval) checkpoint at or before best_step; null when "
            "the run states none",
            null=True,
        ),
        _m(
            "trainer_best_step",
            int,
            "step of the checkpoint the trainer recorded as its best (HF Trainer's "
            "best_model_checkpoint); null when the log names none",
            null=True,
        ),
        _m(
            "trainer_best_metric",
            str,
            "the eval series whose value at trainer_best_step is the trainer's best_metric "
            "(what it picked its best by); null when none matches or no best is named",
            null=True,
        ),
    ),
    "gap_acceleration": (
        _m("growth_last", float, "gap growth over the window ending at the detection step"),
        _m("growth_prev", float, "gap growth over the window before it"),
        _m(
            "accel_ratio",
            float,
            "growth_last / growth_prev (null when growth_prev <= 0)",
            null=True,
        ),
        _m("window_steps", float, "window length in steps"),
        _GAP_NOISE,
        _m("gap_at_onset", float, "gap at the onset step"),
        _m("gap_now", float, "gap at the last val step of the episode"),
        _m("detected_step", int, "first val step where the acceleration was confirmed"),
        _m("val_turned_up", bool, "true when val was rising over the last window at detection"),
        _m(
            "divergence_from",
            int,
            "onset of the train loss's divergence the acceleration was confirmed in (at or "
            "after it): part of that divergence, a note (null: none)",
            null=True,
        ),
    ),
    "val_shift": (
        _m("direction", str, "which way the held-out loss stepped", values=("up", "down")),
        _m(
            "val_before",
            float,
            "old val level at the last eval before the shift (line fitted over the window before)",
        ),
        _m(
            "val_after",
            float,
            "new val level at the first eval after the shift (line fitted over the window after)",
        ),
        _m("val_logged_before", float, "the val loss logged at the last eval before the shift"),
        _m("val_logged_after", float, "the val loss logged at the first eval after the shift"),
        _m("shift", float, "val_after - val_before"),
        _m("shift_pct", float, "shift in % of val_before", null=True),
        _m(
            "ramp_steps",
            int,
            "steps between the last old-level point and the first new-level point",
        ),
        _m("train_change", float, "train loss step across the same split (same line fits)"),
        _m(
            "gap_slope_after_per_1k",
            float,
            "gap slope after the shift, per 1000 steps (about 0: stopped widening)",
            null=True,
        ),
        _m(
            "gap_slope_before_per_1k",
            float,
            "gap slope before the shift, per 1000 steps (the ramp the slope after must match)",
            null=True,
        ),
        _GAP_NOISE,
    ),
    "eval_regression": (
        _m(
            "direction",
            str,
            "which way the eval metric improves",
            values=("higher_is_better", "lower_is_better"),
        ),
        _m("best", float, "best smoothed score (rolling median of 3 evals)"),
        _m("best_step", int, "step of that best score (the onset)"),
        _m("best_logged", float, "the score logged at best_step (best is a median of 3)"),
        _m(
            "turn_step",
            int,
            "where the score turned down: the knot of a two-piece line bending down, when it "
            "lies after best_step (a score that held flat); else best_step. The finding's onset",
        ),
        _m("current", float, "smoothed score now (median of the last evals)"),
        _m("current_evals", int, "how many of the last evals current is the median of (<= 3)"),
        _m("last_value", float, "the last logged score (at the finding's end step)"),
        _m("worst", float, "worst raw score after the best"),
        _m("worst_step", int, "its step"),
        _m("drop", float, "how much worse now is than the best, in the metric's units (> 0)"),
        _m("drop_pct", float, "drop in % of the magnitude of best", null=True),
        _m("noise", float, "eval noise (robust sigma of the eval series)"),
        _m("evals_after_best", int, "number of evals after the best one"),
        _m(
            "loss_change_pct",
            float,
            "train-loss change from best_step to the end, in % (null: no loss)",
            null=True,
        ),
        _m("grad_norm_drift", bool, "true when a grad-norm drift overlaps the regression"),
    ),
    "resume_regression": (
        _m("seam_step", int, "first step logged after the resume (the restart finding's step)"),
        _m(
            "rise_from_step",
            int,
            "where the rise began, the finding's onset: the seam, or the loss's low after it "
            "when the loss went on down below its level before the seam and turned up more "
            "than the causes' reach later",
        ),
        _m(
            "low_after",
            float,
            "the loss's level at that low (centred rolling median; null: the rise began at "
            "the seam)",
            null=True,
        ),
        _m(
            "level_before",
            float,
            "median train loss over the last `window` points before it (fewer: short stretch)",
        ),
        _m("level_end", float, "median train loss over the last `window` points after it"),
        _m("rise", float, "level_end - level_before, in loss units (> 0: worse)"),
        _m(
            "rise_rel",
            float,
            "rise / abs(level_before) (above warn_rel_rise, 10%: a warning; null: level 0)",
            null=True,
        ),
        _m(
            "level_noise",
            float,
            "noise of a level: robust sigma of the train loss / sqrt(window points)",
        ),
        _m("slope_per_1k", float, "Theil-Sen slope of the loss after the seam, per 1000 steps"),
        _m("slope_low_per_1k", float, "lower end of its 90% band (> 0: a rise, not noise)"),
        _m("slope_high_per_1k", float, "upper end of its 90% band"),
        _m("points_after", int, "train-loss points after the seam"),
        _m("val_best", float, "lowest val loss after the seam (null: no val loss)", null=True),
        _m("val_best_step", int, "its step", null=True),
        _m("val_end", float, "last val loss", null=True),
        _m("val_end_step", int, "its step", null=True),
        _m("val_noise", float, "eval noise (robust sigma of the val series)", null=True),
        _m(
            "val_worse",
            bool,
            "true when val_end - val_best exceeds noise_k x val_noise (the finding is a warning)",
        ),
    ),
    # The same comparison judged both ways: the resumed job's loss lower, or higher.
    "resume_drop": _resume_gap("drop", "earlier, or the trend, - resumed"),
    "resume_setback": _resume_gap("rise", "resumed - earlier, or the trend"),
    "lr_restart": (
        _m("restart_step", int, "first logged step of the restarted schedule (the onset)"),
        _m(
            "rewarm_end_step",
            int,
            "last step of its second warm-up (null: the LR jumped straight back up)",
            null=True,
        ),
        _m("lr_before", float, "the LR at the logged point before the restart"),
        _m("lr_from", float, "the LR the restart starts from"),
        _m("lr_to", float, "the LR it warms up (or jumps) back to"),
        _m("restarts", int, "restarts in the log (2 or more: a schedule with warm restarts)"),
        _m("at_resume", bool, "a resume of the job within the causes' reach of the restart"),
        _m(
            "level_before",
            float,
            "median train loss over the points of the last `window` steps before it (at "
            "least `level_points` points, within `window_steps`)",
        ),
        _m("level_noise", float, "noise of a level: robust sigma of the loss / sqrt(window)"),
        _m(
            "peak_level",
            float,
            "highest level of the loss's centred rolling median (as many points) after the "
            "restart, before the next one",
        ),
        _m("peak_level_step", int, "its step"),
        _m("rise_pct", float, "peak_level over level_before, in % (null: level 0)", null=True),
        _m("rise_visible", bool, "the rise exceeds noise_k times level_noise"),
        _m(
            "recovered_step",
            int,
            "first step after the peak where the level is back at or below level_before "
            "(null: not before the next restart or the end)",
            null=True,
        ),
        _m("recovery_steps", int, "recovered_step - restart_step (null: not back)", null=True),
    ),
    "plateau": (
        _m("level", float, "median loss over the plateau"),
        _m(
            "change_pct",
            float,
            "loss change across the plateau predicted by its Theil-Sen slope, in % (at most "
            "2 x flat_rel, else it is a slow trend, not a plateau)",
        ),
        _m("span_steps", float, "length of the plateau in steps"),
        _m("run_fraction", float, "span_steps / the run's length"),
        _m("lr_start", float, "LR at the start of the plateau (null: no LR series)", null=True),
        _m("lr_end", float, "LR at its end", null=True),
        _m("lr_peak", float, "highest LR of the run", null=True),
        _m("lr_ratio", float, "mean LR over the plateau / lr_peak", null=True),
        _m(
            "lr_context",
            str,
            "decayed: LR near the end of its decay; active: LR still high; "
            "stable_before_decay: a steady LR whose later decay or cooldown brought the loss "
            "down (a WSD stable phase); zero: the logged LR is 0 at every step (lr_ratio "
            "null); unknown: no LR logged",
            values=("decayed", "active", "stable_before_decay", "zero", "unknown"),
        ),
        _m(
            "expected",
            bool,
            "true when the schedule explains the plateau (`decayed`, `stable_before_decay`)",
        ),
        _m(
            "loss_after",
            float,
            "loss at the end of the decay that follows a plateau at a steady LR (null: none)",
            null=True,
        ),
        _m("from_start", bool, "true when the plateau begins within the first 10% of the log"),
    ),
    "no_learning": (
        _m(
            "loss_start",
            float,
            "median loss over the first `head_frac` of the logged points (at most head_max_points)",
        ),
        _m("loss_end", float, "median loss over the last `tail_frac` of the logged points"),
        _m("fall_pct", float, "(loss_start - loss_end) / loss_start in % (below `min_fall`)"),
        _m("start_points", int, "points in the start window"),
        _m("end_points", int, "points in the end window"),
        _m("span_steps", int, "steps from the first to the last logged loss"),
        _m(
            "second_half_trend_pct",
            float,
            "Theil-Sen change of the loss over the second half, % of its level",
        ),
        _m("second_half_trend_low_pct", float, "the low end of its 90% band (%)"),
        _m("second_half_trend_high_pct", float, "the high end of its 90% band (%)"),
    ),
    "throughput_drop": (
        _m(
            "source",
            str,
            "the series judged (step_time: inverted to steps/s)",
            values=("throughput", "step_time"),
        ),
        _m(
            "shape",
            str,
            "sudden: under 70% of the rolling baseline; gradual: the log's last tenth 30% or "
            "more below its early level (the tenth after start-up) with no drop that deep",
            values=("sudden", "gradual"),
        ),
        _m(
            "baseline",
            float,
            "level before the drop (in the source's units): the rolling median before it "
            "(sudden), the early tenth's median (gradual)",
        ),
        _m(
            "level",
            float,
            "median level during the drop (sudden) or over the log's last tenth (gradual)",
        ),
        _m("drop_pct", float, "how far throughput fell below the baseline, in %"),
        _m("window_steps", int, "steps from the drop's start to its end"),
        _m("n_points", int, "logged points in the drop"),
        _m("baseline_n", int, "logged points the baseline is the median of (at most 100)"),
        _m(
            "recovered",
            bool,
            "true when throughput came back to 85% of its baseline before the log ended",
        ),
        _m(
            "unit",
            str,
            "baseline and level's unit as the metric name states it (tokens/s; ms/step and "
            "s/step for step times); null when the name states none",
            null=True,
        ),
        _m(
            "recurs_every",
            int,
            "one of at least three short dips recurring at this fixed interval (steps): a pause "
            "on a schedule (evaluation, checkpoint save), a note; null otherwise",
            null=True,
        ),
        _m("recurrences", int, "how many dips recur at that interval (null: none)", null=True),
        _m(
            "time_lost_pct",
            float,
            "the share of the run's time the recurring dips cost, in % (each of their steps "
            "took baseline / level of a usual one); null: not recurring",
            null=True,
        ),
    ),
    "stall": (
        _m(
            "gap_seconds",
            float,
            "wall time between the two logged steps; for slow steps, their median step time "
            "(null when only a throughput in tokens/s was logged)",
            null=True,
        ),
        _m(
            "expected_seconds",
            float,
            "what those steps should have taken at the usual pace (null: unknown)",
            null=True,
        ),
        _m("usual_step_seconds", float, "median seconds per step (null: unknown)", null=True),
        _m("ratio", float, "gap_seconds / expected_seconds (slow steps: x the rolling median)"),
        _m("steps_between", int, "step difference between the two logged points"),
        _m(
            "usual_pause_seconds",
            float,
            "typical eval/checkpoint pause (null when none was seen)",
            null=True,
        ),
        _m(
            "source",
            str,
            "wall_time: a silence between logged steps; step_time / throughput: slow steps in "
            "that series; watch: no new step while `forensics watch` looked (the log stopped)",
            values=("wall_time", "step_time", "throughput", "watch"),
        ),
        _m("slow_steps", int, "how many slow logged steps the finding covers", null=True),
        _m(
            "housekeeping",
            str,
            "the interval the slow steps sit at (info: the job's own evals or saves); null "
            "when they sit at none",
            null=True,
            values=("eval_interval", "checkpoint_interval"),
        ),
        _m(
            "pauses",
            int,
            "repeated pauses (between logged steps, or isolated slow steps where the log has "
            "no wall clock), each shorter than a stall, the finding sums up (their gap, "
            "expected, ratio and steps_between are medians); null: one silence",
            null=True,
        ),
        _m(
            "stalls",
            int,
            "recurring stalls (silences between logged steps, or hangs inside single steps) "
            "the finding sums up, each at its step in `events_at` (their gap, expected, ratio "
            "and steps_between are medians); null: one stall, or pauses",
            null=True,
        ),
        _m(
            "time_lost_pct",
            float,
            "the share of the run's wall time (without a wall clock: of the logged steps' "
            "time) those pauses or recurring stalls cost beyond the usual pace, in %; null: "
            "one silence",
            null=True,
        ),
    ),
    "memory_growth": (
        _m(
            "start_level",
            float,
            "memory at the onset (median of the logged points there; where memory cycles, "
            "freed and filled again, the lowest such median of the first third)",
        ),
        _m(
            "end_level",
            float,
            "memory at the end (median of the last logged points; where it cycles, the lowest "
            "of the last third)",
        ),
        _m("start_level_step", int, "the median step of the points start_level is read from"),
        _m("end_level_step", int, "the median step of the points end_level is read from"),
        _m("growth_pct", float, "(end_level - start_level) / start_level in %"),
        _m("slope_per_1k_steps", float, "overall Theil-Sen slope, memory units per 1000 steps"),
        _m("late_slope_per_1k_steps", float, "the same over the last third"),
        _m("late_ratio", float, "late slope / overall slope (about 1: no levelling off)"),
        _m("duration_steps", int, "steps from the onset to the last logged step"),
        _m(
            "unit",
            str,
            "the levels' unit as the metric name states it (MB, GiB, bytes: the summary shows "
            "bytes in GB, or MB below a gigabyte); null when the name states none",
            null=True,
        ),
    ),
    "restart": (
        _m("resumed_from_step", int, "first step of the new segment"),
        _m("last_step_before", int, "last step logged before the restart"),
        _m(
            "steps_replayed",
            int,
            "steps logged twice (last_step_before - resumed_from_step + 1, at least 0)",
        ),
        _m("points_replayed", int, "logged points that the later segment pre-empts"),
        _m(
            "points_repeated",
            int,
            "of those, points whose (tag, step) the later segment logs again (0: interleaved "
            "writers, not a replay)",
        ),
        _m(
            "wall_clock_gap_s",
            float,
            "seconds between the last old record and the first new one (null without wall times)",
            null=True,
        ),
        _m("file", str, "the file where the new segment starts"),
        _m("segment", int, "the new segment's number"),
        _m(
            "counter",
            str,
            "what started again: step, or the counter that went back while the step went on "
            "(epoch, consumed samples or tokens, an elapsed-time field, 'elapsed time')",
        ),
        _m(
            "lr_step",
            int,
            "first step logged in both attempts where the LR differs by more than 10% "
            "(null: the LR matches, or no step has it in both)",
            null=True,
        ),
        _m("lr_before", float, "the earlier attempt's LR at lr_step", null=True),
        _m("lr_after", float, "the resumed job's LR at lr_step", null=True),
        _m(
            "lr_max_ratio",
            float,
            "the largest ratio of the two attempts' LRs at one step, either way (>= 1)",
            null=True,
        ),
        _m(
            "lr_reshaped",
            bool,
            "true: the ratio of the two LRs varies by more than 5% over the common steps "
            "(another schedule: a warning); false: one factor (a changed LR: info)",
            null=True,
        ),
        _m(
            "previous_job",
            str,
            "a seam between two jobs read as one run (a resume chain): the job resumed from",
        ),
        _m("job", str, "a seam between two jobs: the job that resumed"),
        _m(
            "seam",
            str,
            "how the job continues the one before: it re-does logged steps (overlap), goes on "
            "within two logging intervals (continuation), or after missing steps the loss "
            "bridges (gap)",
            values=("overlap", "continuation", "gap"),
        ),
    ),
    "replaced_attempt": (
        _m("resumed_from_step", int, "the resumed job's first step (the restart finding's)"),
        _m("attempt_last_step", int, "the last step the replaced attempt logged"),
        _m("segment", int, "the resumed job's segment number (the restart finding's)"),
        _m(
            "findings",
            int,
            "findings above info of the replaced attempt that reach its replaced steps and that "
            "the run as it stands does not hold",
        ),
        _m(
            "worst_severity",
            str,
            "the most severe of them, as that attempt was judged",
            values=("warning", "critical", "fatal"),
        ),
        _m("worst_kind", str, "its kind"),
        _m("worst_metric", str, "its vital sign (null: a job-level finding)", null=True),
        _m("worst_step", int, "its onset"),
        _m("first_kind", str, "the kind of the first of them"),
        _m("first_step", int, "the first one's onset (the finding's start_step)"),
        _m("kinds", str, "their kinds, comma-separated"),
        _m(
            "judged_from_step",
            int,
            "the first step of the attempt's rows judged (context before the resume, at most "
            "context_steps)",
        ),
        _m(
            "lr_attempt",
            float,
            "the LR the replaced attempt logged last at or before lr_step (null: no LR logged)",
            null=True,
        ),
        _m(
            "lr_resumed",
            float,
            "the LR the run as it stands (the resumed job) logged last at or before lr_step",
            null=True,
        ),
        _m(
            "lr_step",
            int,
            "where the two LRs are read: the worst finding's onset, at least the resume's step "
            "(null: an LR missing from either)",
            null=True,
        ),
        _m(
            "resumed_passed",
            bool,
            "the resumed job logged past attempt_last_step with no finding above info of the "
            "worst one's kind and vital sign there (false: it shows it again; null: it has not "
            "got that far)",
            null=True,
        ),
        _m(
            "attempt_causes",
            str,
            "the causes the attempt's own log supports for its worst finding, comma-separated "
            "ids (forensics.causes; null: none supported)",
            null=True,
        ),
    ),
    "truncated_log": (
        _m("file", str, "the file concerned"),
        _m(
            "bytes_lost",
            int,
            "bytes after the last complete record (event files, W&B binary)",
        ),
        _m("records_read", int, "complete records read from the file (event files)"),
        _m(
            "zero_filled",
            bool,
            "the tail is zero bytes, as a file preallocated by a killed job (event files)",
        ),
        _m("line", int, "the last line number, cut mid-record (JSONL)"),
        _m(
            "last_recorded_step",
            int,
            'last step with a value (Megatron golden values padded with "nan")',
        ),
        _m("end_step", int, "the step the file claims to end at (golden values)"),
    ),
    "crash": (
        _m(
            "reason",
            str,
            "what ended the job, as the log line says",
            values=CRASH_REASONS,
        ),
        _m("line", str, "the log line that says so (at most 200 characters)"),
    ),
}

_BY_KEY: dict[str, dict[str, Measure]] = {
    kind: {m.key: m for m in ms} for kind, ms in MEASURES.items()
}


def declared(kind: str) -> Mapping[str, Measure]:
    """The measures declared for a finding kind, by key, in declaration order."""
    return _BY_KEY[str(kind)]


def check_keys(kind: str, measures: Mapping[str, object]) -> None:
    """Raise ValueError naming every measure key the kind does not declare."""
    allowed = _BY_KEY[str(kind)]
    unknown = [k for k in measures if k not in allowed]
    if unknown:
        raise ValueError(
            f"{kind} finding: measure(s) {', '.join(map(repr, unknown))} not declared in "
            f"forensics/measures.py (declared: {', '.join(allowed)})"
        )


def problems(kind: str, measures: Mapping[str, object]) -> list[str]:
    """Every way the measures disagree with the declaration: unknown keys, types, values."""
    allowed = _BY_KEY[str(kind)]
    out = [f"{kind}.{k}: not declared" for k in measures if k not in allowed]
    for k, v in measures.items():
        m = allowed.get(k)
        if m is not None and not m.accepts(v):
            want = m.type.__name__ + ("|null" if m.null else "")
            if m.values:
                want += f" in {m.values}"
            out.append(f"{kind}.{k}: {v!r} is not {want}")
    out += [
        f"{kind}.{m.key}: missing" for m in allowed.values() if m.required and m.key not in measures
    ]
    return out
