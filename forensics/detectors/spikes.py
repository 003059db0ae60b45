"""Loss and grad-norm spikes: detection, shape, classification, co-occurrence (article 4).

``loss_spike`` measures (``grad_norm_spike`` has the same keys plus the ones marked *gn*):

| key | meaning |
|---|---|
| peak_value | the series at the peak |
| baseline | local robust baseline at the peak (median of the preceding points) |
| height | peak_value - baseline (series units) |
| height_ratio | peak_value / baseline (null when the series has non-positive values) |
| z | robust z-score of the peak (log units for positive series) |
| two_sided | the baseline also used the following points (near the start of the log or in the warm-up) |
| points | logged points flagged in the spike |
| log_interval | typical logging interval of the series (steps) |
| width_steps | steps spent above the alarm line around the peak |
| recovered | the series came back inside the band of the extrapolated pre-spike trend |
| recovery_steps | steps from the peak until back inside that band (null if never) |
| recovered_step | step where it was back (null if never) |
| plateau_shift | post-recovery steady level minus the extrapolated trend (series units) |
| plateau_shift_rel | the same, relative to the trend |
| excess_area | sum of (value - trend) x steps from onset to recovery (series units x steps) |
| excess_area_rel | the same with the excess relative to the trend (steps) |
| trend | "trend" (a robust line was fitted before the spike) or "level" (too few points) |
| steps_logged_after_peak | how far the log goes past the peak |
| classification | physiological, pathological, beneficial or unresolved |
| loss_scale_drop | a loss-scale drop / fp16 overflow was logged at the spike (numeric overflow) |
| lr_kink_step | step of an LR-schedule kink the spike follows (schedule-induced), else null |
| lr_kink_kind | warmup_end, restart, drop or slope_change |
| cause | numeric_overflow, schedule_induced, grad_norm_led or null |
| grad_norm_lead_steps | loss only: a grad-norm spike began this many steps before the loss spike |
| transient | *gn*: back inside the band within ``transient_steps`` |
| loss_response | *gn*: a loss spike began within the lead window around it |
| leads_loss_by_steps | *gn*: steps by which it preceded the loss spike (null if none) |
| run_baseline | *gn*: the run's grad-norm baseline (median after LR warm-up, article 6.1) |
| ratio_to_run_baseline | *gn*: peak_value / run_baseline (article: 2x yellow, 3x orange) |

Severity: physiological or beneficial loss spike = info; unresolved = warning; pathological =
critical. A transient grad-norm spike is a warning ("check that batch") when the loss
responded; when the loss did not move at all the spike was absorbed and is reported at
``absorbed_gn_severity`` (info by default: healthy GPT-2 runs show several such one-step
outliers). A grad-norm spike that does not come back is a warning, critical at 3x the run
baseline.

Steps: ``start_step`` is the onset (where the series left its noise), ``peak_step`` the
highest point, ``end_step`` the step it was back in the band (the last logged step if never).
The periodicity and loss-scale detectors call :func:`find_spikes` through a default
``SpikeDetector``: thresholds set for ``spikes`` in the configuration do not reach them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from forensics.evidence import robust
from forensics.evidence.baseline import grad_norm_baseline, warmup_end
from forensics.evidence.spike_context import drop_windows, level_barriers, lr_kinks, overlaps
from forensics.evidence.spike_shape import (
    BENEFICIAL,
    PATHOLOGICAL,
    PHYSIOLOGICAL,
    UNRESOLVED,
    ShapeParams,
    measure,
)
from forensics.evidence import Evidence
from forensics.params import SpikesParams
from forensics.findings import Finding, FindingKind, Severity, steps_text
from forensics.run import Run
from forensics.schema import GRAD_NORM, LOSS, LOSS_SCALE, OVERFLOW

_LOSS_SEVERITY = {
    PHYSIOLOGICAL: Severity.INFO,
    BENEFICIAL: Severity.INFO,
    UNRESOLVED: Severity.WARNING,
    PATHOLOGICAL: Severity.CRITICAL,
}


@dataclass
class Spike:
    """One spike with its measures; the raw material for findings and for periodicity."""

    metric: str
    start_step: int
    peak_step: int
    end_step: int
    measures: dict[str, Any]


def find_spikes(
    run: Run,
    metric: str,
    *,
    window: int = 20,
    min_side: int = 3,
    z_threshold: float = 6.0,
    min_ratio: float = 1.15,
    gross_ratio: float | None = 2.0,
    z_gross: float = 3.0,
    sigma_floor: float = 0.005,
    shape: ShapeParams | None = None,
    barriers: list[int] | None = None,
) -> list[Spike]:
    """Detect spikes in one series and measure their shape (no co-occurrence, no severity).

    ``barriers`` are steps where the level may jump for its own reasons (epoch starts, LR
    restarts); by default they are read from the run.
    """
    shape = shape or ShapeParams()
    if barriers is None:
        barriers = level_barriers(run)
    series = run.series(metric)
    sc = robust.score(
        series,
        window=window,
        min_side=min_side,
        sigma_floor=sigma_floor,
        confirm_until=start_zone(run, series, window),
    )
    if sc.height < 3:
        return []
    steps = sc.get_column("step").to_numpy()
    values = sc.get_column("value").to_numpy()
    log_scale = robust.use_log(values)
    events = robust.find_events(
        sc,
        z_min=z_threshold,
        min_ratio=min_ratio,
        log_scale=log_scale,
        gross_ratio=gross_ratio,
        z_gross=z_gross,
    )
    interval = robust.median_interval(steps)
    out: list[Spike] = []
    for ev in events:
        row = sc.row(ev.peak, named=True)
        alarm = max(float(np.log(min_ratio)) if log_scale else 0.0, z_threshold * row["sigma"])
        m = measure(
            steps,
            values,
            onset=ev.onset,
            peak=ev.peak,
            log_scale=log_scale,
            sigma=row["sigma"],
            baseline_at_peak=row["baseline"],
            alarm=alarm,
            p=shape,
            barriers=barriers,
        )
        end_step = m["recovered_step"] if m["recovered"] else int(steps[-1])
        measures: dict[str, Any] = {
            "peak_value": row["value"],
            "baseline": row["baseline"],
            "height": row["value"] - row["baseline"],
            "height_ratio": row["value"] / row["baseline"] if log_scale else None,
            "z": row["z"],
            "two_sided": row["two_sided"],
            "points": ev.n_flagged,
            "log_interval": interval,
            **m,
        }
        out.append(
            Spike(metric, int(steps[ev.onset]), int(steps[ev.peak]), int(end_step), measures)
        )
    return out


def start_zone(run: Run, series: pl.DataFrame, window: int) -> float | None:
    """Last step of the start of training, where spikes need two-sided confirmation: the LR
    warm-up, and at least the first ``window`` logged points. None when the log starts
    mid-training (its step numbers say so)."""
    steps = series.filter(pl.col("value").is_finite()).get_column("step").to_numpy()
    if len(steps) == 0:
        return None
    interval = robust.median_interval(steps)
    if steps[0] > 2 * interval + 1:
        return None
    first_points = float(steps[min(window, len(steps)) - 1])
    return max(float(warmup_end(run) or 0), first_points)


class SpikeDetector:
    """loss_spike and grad_norm_spike: robust local detection, shape, classification, context."""

    name = "spikes"

    def __init__(self, params: SpikesParams | None = None) -> None:
        self.params = params or SpikesParams()

    def shape_params(self) -> ShapeParams:
        return ShapeParams(
            trend_window=self.params.trend_window,
            band_k=self.params.band_k,
            recover_steps=self.params.recover_steps,
            plateau_window=self.params.plateau_window,
            plateau_tol=self.params.plateau_tol,
        )

    def spikes(self, run: Run, metric: str) -> list[Spike]:
        """The detector's spikes in one series, with this detector's parameters."""
        is_loss = metric == LOSS
        ratio = self.params.loss_min_ratio if is_loss else self.params.grad_norm_min_ratio
        gross = self.params.loss_gross_ratio if is_loss else self.params.grad_norm_gross_ratio
        return find_spikes(
            run,
            metric,
            window=self.params.window,
            min_side=self.params.min_side,
            z_threshold=self.params.z_threshold,
            min_ratio=ratio,
            gross_ratio=gross,
            z_gross=self.params.z_gross,
            sigma_floor=self.params.sigma_floor,
            shape=self.shape_params(),
        )

    def detect(self, ev: Evidence) -> list[Finding]:
        run = ev.run
        metrics = run.metrics()
        if LOSS not in metrics and GRAD_NORM not in metrics:
            run.note("spikes: not run, the log has neither a loss nor a grad-norm series")
            return []
        loss = self.spikes(run, LOSS) if LOSS in metrics else []
        gn = self.spikes(run, GRAD_NORM) if GRAD_NORM in metrics else []
        self._context(run, loss + gn)
        self._link(loss, gn)
        base = grad_norm_baseline(run) if gn else None
        findings = [self._loss_finding(s) for s in loss]
        findings += [self._gn_finding(s, base.value if base else None) for s in gn]
        return findings

    # -- co-occurrence ------------------------------------------------------------------
    def _context(self, run: Run, spikes: list[Spike]) -> None:
        if not spikes:
            return
        drops = (
            drop_windows(run) if (run.has(LOSS_SCALE) or run.has(OVERFLOW)) else np.empty((0, 2))
        )
        kinks = lr_kinks(run)
        for s in spikes:
            # The spike began after the previous logged point; a scaler logged after its update
            # shows the drop of an overflowing step at the next logged point: allow one interval.
            iv = s.measures["log_interval"]
            overflow = overlaps(drops, s.start_step - iv, s.peak_step + iv)
            kink = next(
                (
                    k
                    for k in kinks
                    if k.step - s.measures["log_interval"]
                    <= s.start_step
                    <= k.step + self.params.schedule_lag
                ),
                None,
            )
            s.measures["loss_scale_drop"] = overflow
            s.measures["lr_kink_step"] = kink.step if kink else None
            s.measures["lr_kink_kind"] = kink.kind if kink else None
            s.measures["cause"] = (
                "numeric_overflow" if overflow else ("schedule_induced" if kink else None)
            )

    def _link(self, loss: list[Spike], gn: list[Spike]) -> None:
        """Pair each grad-norm spike with a loss spike that began within the lead window."""
        for g in gn:
            g.measures["loss_response"] = False
            g.measures["leads_loss_by_steps"] = None
        for s in loss:
            s.measures["grad_norm_lead_steps"] = None
            tol = s.measures["log_interval"]
            # A grad-norm spike leads a loss spike when the loss takes off while the grad norm is
            # still up (or within one logging interval of coming back), and not too long after.
            near = [
                g
                for g in gn
                if -tol <= s.start_step - g.start_step <= self.params.lead_window
                and s.start_step <= g.end_step + max(tol, g.measures["log_interval"])
            ]
            if not near:
                continue
            g = min(near, key=lambda g: abs(s.start_step - g.start_step))
            lead = s.start_step - g.start_step
            g.measures["loss_response"] = True
            if lead > 0:
                s.measures["grad_norm_lead_steps"] = lead
                g.measures["leads_loss_by_steps"] = lead
                if s.measures["cause"] is None:
                    s.measures["cause"] = "grad_norm_led"
        # A loss spike at the same step as a grad-norm spike (lead 0) is still a response.
        for g in gn:
            if not g.measures["loss_response"]:
                g.measures["loss_response"] = any(
                    abs(s.start_step - g.start_step) <= max(s.measures["log_interval"], 1)
                    for s in loss
                )

    # -- findings -----------------------------------------------------------------------
    def _loss_finding(self, s: Spike) -> Finding:
        m = s.measures
        cls = m["classification"]
        sev = _LOSS_SEVERITY[cls]
        how = {
            PHYSIOLOGICAL: f"back on its trend after {steps_text(m['recovery_steps'])}",
            BENEFICIAL: f"settled {abs(m['plateau_shift_rel'] or 0):.0%} below its earlier trend",
            PATHOLOGICAL: _pathology(m, self.params.recover_steps),
            UNRESOLVED: "still above its trend when the log ends",
        }[cls]
        extra = _cause_text(m)
        summary = (
            f"Loss spike at step {s.peak_step}: {m['peak_value']:.4g} against a local baseline of "
            f"{m['baseline']:.4g} ({_height(m)}), {how}; {cls}{extra}."
        )
        return Finding(
            FindingKind.LOSS_SPIKE, sev, LOSS, s.start_step, summary, s.peak_step, s.end_step, m
        )

    def _gn_finding(self, s: Spike, run_base: float | None) -> Finding:
        m = s.measures
        rec = m["recovery_steps"]
        transient = (
            bool(m["recovered"])
            and rec is not None
            and rec <= max(self.params.transient_steps, 2 * m["log_interval"])
        )
        m["transient"] = transient
        m["run_baseline"] = run_base
        m["ratio_to_run_baseline"] = m["peak_value"] / run_base if run_base else None
        if transient:
            sev = Severity.WARNING if m["loss_response"] else Severity(self.params.absorbed_gn_severity)
            what = (
                "the loss moved with it: check that batch"
                if m["loss_response"]
                else "the loss did not move: an outlier batch the optimizer absorbed"
            )
            how = f"back within {steps_text(rec)}, {what}"
        else:
            r = m["ratio_to_run_baseline"] or m["height_ratio"]
            sev = Severity.CRITICAL if (r or 0) >= 3.0 and not m["recovered"] else Severity.WARNING
            how = (
                f"back only after {steps_text(rec)}" if m["recovered"] else "not back on its trend"
            )
        lead = (
            f"; it led a loss spike by {m['leads_loss_by_steps']} steps"
            if m["leads_loss_by_steps"]
            else ""
        )
        summary = (
            f"Grad-norm spike at step {s.peak_step}: {m['peak_value']:.4g} against a local baseline of "
            f"{m['baseline']:.4g} ({_height(m)}), {how}{lead}{_cause_text(m)}."
        )
        return Finding(
            FindingKind.GRAD_NORM_SPIKE,
            sev,
            GRAD_NORM,
            s.start_step,
            summary,
            s.peak_step,
            s.end_step,
            m,
        )


def _height(m: dict[str, Any]) -> str:
    r = m["height_ratio"]
    return f"{r:.2f}x" if r is not None else f"+{m['height']:.4g}"


def _pathology(m: dict[str, Any], limit: int) -> str:
    if not m["recovered"]:
        return f"not back on its trend {m['steps_logged_after_peak']} steps later"
    if m["recovery_steps"] > limit:
        return f"back only after {steps_text(m['recovery_steps'])}"
    return f"settled {m['plateau_shift_rel'] or 0:.0%} above its earlier trend"


def _cause_text(m: dict[str, Any]) -> str:
    if m.get("cause") == "numeric_overflow":
        return "; the loss scale dropped in the same step (numeric overflow)"
    if m.get("cause") == "schedule_induced":
        return f"; it follows an LR-schedule {m['lr_kink_kind'].replace('_', ' ')} at step {m['lr_kink_step']}"
    return ""
