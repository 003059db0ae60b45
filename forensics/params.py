"""Every detector's parameters, declared once: frozen keyword-only dataclasses.

Defaults are the article's numbers where it gives one (2x / 3x a 500-step grad-norm baseline,
gap growth above 1.5x, activations above 1e4, a 30% throughput drop, recovery within 500
steps); the rest are calibrated on the sample runs and the real logs. The configuration
(``[tool.forensics.detectors.<name>]``) is checked against these classes when it loads, and
every problem is reported at once. The evidence layer and the detectors read the same
instances, so a configured window reaches every number computed with it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from forensics.errors import ConfigError

# The article's fixed numbers, each in one place.
ACTIVATION_LIMIT = 1e4  # an activation past this absolute value marks a problem layer (4.2)
GRAD_NORM_WARN = 2.0  # x the grad-norm baseline: yellow light (6.1, 6.3)
GRAD_NORM_CRITICAL = 3.0  # x the grad-norm baseline: orange light (6.1, 6.3)
PARAM_NORM_WARN = 1.5  # x the param-norm baseline (6.1)
BASELINE_STEPS = 500  # the article's baseline period after start-up (6.1)
GAP_ACCELERATION = 1.5  # gap growth over the last window vs the one before (5.2)
THROUGHPUT_DROP = 0.3  # a fall of 30% below the throughput baseline (2.4)
RECOVERY_STEPS = 500  # a spike still elevated after this many steps is pathological (4.3)
QUICK_RECOVERY_STEPS = 300  # a passing fluctuation is back on its trend within 100-300 (4.3)


@dataclass(frozen=True, kw_only=True)
class SpikesParams:
    """Parameters of the ``spikes`` detector."""

    window: int = 20
    min_side: int = 3
    z_threshold: float = 6.0
    loss_min_ratio: float = 1.15
    grad_norm_min_ratio: float = 2.0
    loss_gross_ratio: float = 2.0
    grad_norm_gross_ratio: float = 4.0
    z_gross: float = 3.0
    sigma_floor: float = 0.005
    band_k: float = 3.0
    recover_steps: int = RECOVERY_STEPS
    plateau_window: int = BASELINE_STEPS
    plateau_tol: float = 0.05
    trend_window: int = BASELINE_STEPS
    transient_steps: int = 20
    # A transient (one batch) also stands above its alarm line for at most this many logged
    # points: a wider excursion moves the grad norm's level, which the 2x / 3x lines judge.
    transient_points: int = 3
    lead_window: int = 100
    schedule_lag: int = 50
    # "info": the grad-norm outliers the optimizer absorbed are one grad_norm_outliers note;
    # "warning": each is a grad_norm_spike finding to act on
    absorbed_gn_severity: str = "info"


@dataclass(frozen=True, kw_only=True)
class PeriodicParams:
    """Parameters of the ``periodic`` detector."""

    min_count: int = 4
    max_spread: float = 0.2
    shrink_ratio: float = 0.8
    match_tol: float = 0.1
    max_multiple: int = 4
    max_p: float = 0.001
    max_p_regular: float = 0.002
    phase_tol: float = 0.03


@dataclass(frozen=True, kw_only=True)
class NanInfParams:
    """Parameters of the ``nan_inf`` detector."""

    persist_points: int = 3
    metrics: tuple[str, ...] = ("loss", "grad_norm")


@dataclass(frozen=True, kw_only=True)
class DivergenceParams:
    """Parameters of the ``divergence`` detector."""

    window: int = BASELINE_STEPS
    loss_rise: float = 0.1
    grad_rise: float = 2.0
    smooth_points: int = 9
    min_points: int = 5
    # loss_climb: a rise the loss never came back from while the grad norm did not double
    # (so no divergence): reported once it has lasted the article's pathological recovery
    # time, over enough points, and its level stands clear of the loss's noise.
    climb_min_steps: int = BASELINE_STEPS
    climb_min_points: int = 20
    climb_noise_k: float = 4.0


@dataclass(frozen=True, kw_only=True)
class LossScaleParams:
    """Parameters of the ``loss_scale`` detector."""

    cascade_gap: int = 50
    calibration_steps: int = 200
    warn_halvings: int = 3
    decline_halvings: int = 2
    decline_steps: int = 2000


@dataclass(frozen=True, kw_only=True)
class GradNormDriftParams:
    """Parameters of the ``grad_norm_drift`` detector."""

    warn_ratio: float = GRAD_NORM_WARN
    crit_ratio: float = GRAD_NORM_CRITICAL
    baseline_window: int = BASELINE_STEPS
    recent_frac: float = 0.02
    spike_k: float = 5.0
    min_points: int = 20
    envelope_exponent: float = 0.5
    envelope_margin: float = 1.25
    envelope_max: float = 4.0
    # The grad norm still falling after the baseline window: a climb is judged from where it
    # settled when that level is under this share of the baseline.
    settled_below: float = 0.8


@dataclass(frozen=True, kw_only=True)
class EvalRegressionParams:
    """Parameters of the ``eval_regression`` detector."""

    noise_k: float = 3.0
    min_rel_drop: float = 0.01
    min_evals_after: int = 2
    min_evals: int = 4


@dataclass(frozen=True, kw_only=True)
class ResumeRegressionParams:
    """Parameters of the ``resume_regression`` detector."""

    noise_k: float = 3.0
    window: int = 100
    min_points_after: int = 20
    min_evals_after: int = 3
    warn_rel_rise: float = 0.1  # a rise of the train loss's level this large is a warning
    # resume_drop (the same detector): the loss on the steps both jobs logged, resumed job
    # against the earlier one, lower by at least this much (in % of the earlier level), over
    # at least this many steps
    drop_min_pct: float = 2.0
    drop_min_points: int = 20
    # a resume that logged no step twice: the points either side of its seam compared
    drop_seam_points: int = 50


@dataclass(frozen=True, kw_only=True)
class LrRestartParams:
    """Parameters of the ``lr_restart`` detector."""

    window: int = 100  # steps of a loss level (before the restart; the rolling median after)
    level_points: int = 5  # ... but at least this many points (a sparse log)
    window_steps: int = 500  # ... within this many steps before the restart
    noise_k: float = 3.0  # a rise counts above this many times a level's noise
    slow_recovery: int = 500  # steps: a single restart's loss not back by then is a warning
    min_points: int = 20  # loss points needed before and after the restart


@dataclass(frozen=True, kw_only=True)
class ParamNormParams:
    """Parameters of the ``param_norm`` detector."""

    jump_k: float = 8.0
    min_rel_jump: float = 0.01
    window: int = 21
    # A jump may spread over several logged points within this many steps (an LR raised for
    # a few dozen steps moves the norm a little each step, none of them 1% on its own).
    jump_max_steps: int = 100
    ratio_limit: float = PARAM_NORM_WARN
    surge_ratio: float = 3.0
    baseline_window: int = BASELINE_STEPS
    min_points: int = 10


@dataclass(frozen=True, kw_only=True)
class LayersParams:
    """Parameters of the ``layers`` detector."""

    group_ratio: float = 2.0
    layer_ratio: float = 1.5
    min_share: float = 0.05
    min_increase: float = 0.1
    window_frac: float = 0.15
    min_window: int = BASELINE_STEPS
    noise_k: float = 3.0
    min_points: int = 6


@dataclass(frozen=True, kw_only=True)
class ActivationsParams:
    """Parameters of the ``activations`` detector."""

    absmax_limit: float = ACTIVATION_LIMIT
    std_jump_ratio: float = 3.0
    history: int = 10
    min_history: int = 3


@dataclass(frozen=True, kw_only=True)
class TrainValParams:
    """Parameters of the ``train_val`` detector."""

    accel_ratio: float = GAP_ACCELERATION
    min_window: int = 1000
    window_intervals: int = 2
    noise_k: float = 2.0
    confirm: int = 2
    overfit_noise_k: float = 3.0
    critical_epoch: int = 5
    shift_window: int = 3000
    shift_noise_k: float = 4.0
    min_rel_shift: float = 0.02
    min_val_points: int = 5


@dataclass(frozen=True, kw_only=True)
class PlateauParams:
    """Parameters of the ``plateau`` detector."""

    flat_rel: float = 0.005
    noise_k: float = 3.0
    min_steps: int = 2000
    min_fraction: float = 0.25
    decayed_lr_ratio: float = 0.1
    bins: int = 200
    min_points: int = 20


@dataclass(frozen=True, kw_only=True)
class NoLearningParams:
    """Parameters of the ``no_learning`` detector."""

    min_fall: float = 0.05
    still_falling_pct: float = 0.25
    min_steps: int = 1000
    min_points: int = 20
    head_frac: float = 0.05
    # The start is the untrained model's loss: on a long run 5% of the points is far too wide
    # (an LLM's loss falls most of the way in its first few thousand steps).
    head_max_points: int = 1000
    tail_frac: float = 0.1


@dataclass(frozen=True, kw_only=True)
class ThroughputParams:
    """Parameters of the ``throughput`` detector."""

    drop: float = THROUGHPUT_DROP
    baseline_points: int = 100
    smooth_points: int = 5
    min_points: int = 3
    min_history: int = 10
    # The slow-decline check compares the median of the log's early and last tenths, each of
    # at least this many points.
    decline_points: int = 20


@dataclass(frozen=True, kw_only=True)
class StallParams:
    """Parameters of the ``stall`` detector."""

    factor: float = 20.0
    min_seconds: float = 300.0
    pause_factor: float = 3.0
    min_points: int = 10
    slow_factor: float = 3.0


@dataclass(frozen=True, kw_only=True)
class MemoryParams:
    """Parameters of the ``memory`` detector."""

    skip_frac: float = 0.1
    min_growth: float = 0.05
    level_off: float = 0.5
    min_points: int = 20


# detector name (as in the registry and the config) -> its parameter class
PARAMS: dict[str, type] = {
    "spikes": SpikesParams,
    "periodic": PeriodicParams,
    "nan_inf": NanInfParams,
    "divergence": DivergenceParams,
    "loss_scale": LossScaleParams,
    "grad_norm_drift": GradNormDriftParams,
    "eval_regression": EvalRegressionParams,
    "resume_regression": ResumeRegressionParams,
    "lr_restart": LrRestartParams,
    "param_norm": ParamNormParams,
    "layers": LayersParams,
    "activations": ActivationsParams,
    "train_val": TrainValParams,
    "plateau": PlateauParams,
    "no_learning": NoLearningParams,
    "throughput": ThroughputParams,
    "stall": StallParams,
    "memory": MemoryParams,
}


@dataclass(frozen=True)
class Params:
    """The parameters of every detector, as configured (defaults where not)."""

    by_detector: dict[str, Any] = field(
        default_factory=lambda: {name: cls() for name, cls in PARAMS.items()}
    )

    def __getitem__(self, name: str) -> Any:
        return self.by_detector[name]

    @property
    def spikes(self) -> SpikesParams:
        return self.by_detector["spikes"]

    @property
    def grad_norm_drift(self) -> GradNormDriftParams:
        return self.by_detector["grad_norm_drift"]

    @property
    def param_norm(self) -> ParamNormParams:
        return self.by_detector["param_norm"]

    @property
    def activations(self) -> ActivationsParams:
        return self.by_detector["activations"]

    @property
    def train_val(self) -> TrainValParams:
        return self.by_detector["train_val"]

    @property
    def throughput(self) -> ThroughputParams:
        return self.by_detector["throughput"]


def _article(type_name: str) -> str:
    return ("an " if type_name[0] in "aeiou" else "a ") + type_name


def _type_problem(name: str, key: str, value: Any, default: Any) -> str | None:
    """A configured value must have its default's type (an int is fine for a float)."""
    if isinstance(default, tuple):
        if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            return None
        return (
            f"detector {name}: {key} = {value!r} should be a list of names"
            f" (default {list(default)!r})"
        )
    want: tuple[type, ...] = (int, float) if isinstance(default, float) else (type(default),)
    if isinstance(value, bool) and not isinstance(default, bool) or not isinstance(value, want):
        return (
            f"detector {name}: {key} = {value!r} should be {_article(type(default).__name__)}"
            f" (default {default!r})"
        )
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value < 0:
        return f"detector {name}: {key} = {value!r} cannot be negative"
    return None


# Ratios that are multiples of a baseline (a default above 1): at 1 or below they would flag
# values at or under the baseline itself. (shrink_ratio and decayed_lr_ratio are fractions.)
_FRACTIONS = {("throughput", "drop")}  # a share of the level, between 0 and 1
_ORDERED = {"grad_norm_drift": ("warn_ratio", "crit_ratio")}  # warning line <= critical line


def _range_problem(name: str, key: str, value: Any, default: Any) -> str | None:
    """A configured value outside what its parameter can mean (see :data:`_FRACTIONS`)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if key.endswith("_ratio") and isinstance(default, float) and default > 1 and value <= 1:
        return (
            f"detector {name}: {key} = {value!r} must be above 1 (a multiple of the baseline; "
            f"default {default!r})"
        )
    if (name, key) in _FRACTIONS and not 0 < value < 1:
        return f"detector {name}: {key} = {value!r} must be between 0 and 1 (default {default!r})"
    return None


def resolve(raw: dict[str, dict[str, Any]] | None = None) -> Params:
    """Check the configured parameters against the declarations and build :class:`Params`.

    Raises:
        ConfigError: every unknown detector, unknown key and wrongly typed value, one per line.
    """
    raw = raw or {}
    problems: list[str] = []
    unknown = sorted(set(raw) - set(PARAMS))
    if unknown:
        problems.append(
            f"unknown detector(s) in configuration: {', '.join(unknown)};"
            f" known: {', '.join(PARAMS)}"
        )
    out: dict[str, Any] = {}
    for name, cls in PARAMS.items():
        given = dict(raw.get(name) or {})
        fields = {f.name: f for f in dataclasses.fields(cls)}
        kwargs: dict[str, Any] = {}
        for key, value in given.items():
            if key not in fields:
                problems.append(
                    f"detector {name}: unknown parameter {key!r}; known: {', '.join(fields)}"
                )
                continue
            default = fields[key].default
            problem = _type_problem(name, key, value, default)
            if problem:
                problems.append(problem)
                continue
            if isinstance(default, float):
                value = float(value)
            elif isinstance(default, tuple):
                value = tuple(value)
            problem = _range_problem(name, key, value, default)
            if problem:
                problems.append(problem)
                continue
            kwargs[key] = value
        pair = _ORDERED.get(name)
        if pair is not None:
            lo, hi = (kwargs.get(k, fields[k].default) for k in pair)
            if lo > hi:
                problems.append(
                    f"detector {name}: {pair[0]} = {lo!r} is above {pair[1]} = {hi!r}; the "
                    "warning line must not be above the critical one"
                )
        out[name] = cls(**kwargs)
    if problems:
        raise ConfigError("; ".join(problems) if len(problems) == 1 else "\n".join(problems))
    return Params(out)


def defaults() -> dict[str, dict[str, Any]]:
    """Every parameter's default, per detector (for docs and `forensics --help` texts)."""
    return {name: dataclasses.asdict(cls()) for name, cls in PARAMS.items()}
