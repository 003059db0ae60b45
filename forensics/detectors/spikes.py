"""Loss and grad-norm spikes: detection, shape, classification, co-occurrence (article 4).

``loss_spike`` measures (``grad_norm_spike`` has the same keys plus the ones marked *gn*):

| key | meaning |
|---|---|
| peak_value | the series at the peak |
| baseline | local robust baseline at the peak (median of the preceding points) |
| height | peak_value - baseline (series units) |
| height_ratio | peak_value / baseline (null when the series has non-positive values) |
| z | robust z-score of the peak (log units for positive series) |
| two_sided | the baseline also used the following points (start of the log, LR warm-up) |
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
outliers). A grad-norm spike that does not come back is a warning, critical from the grad-norm
band's critical line (``grad_norm_drift.crit_ratio``, 3x the run baseline; the same line the
drift finding and the chart use).

Steps: ``start_step`` is the onset (where the series left its noise), ``peak_step`` the
highest point, ``end_step`` the step it was back in the band (the last logged step if never).

The spikes come from the evidence (:meth:`forensics.evidence.Evidence.spikes`), found once
with the configured parameters and shared with the periodicity and loss-scale detectors; this
detector adds what happened around them and judges them. Each finding's ``judged_against``:
the local baseline and the alarm line (``alarm_at``, with ``z_threshold`` and ``min_ratio``),
the recovery limit (``recovery_limit_steps``), and for grad-norm spikes the run's grad-norm
band (``baseline``, ``warn_at``, ``critical_at``) and ``transient_limit_steps``.
"""

from __future__ import annotations

from typing import Any

from forensics.evidence import Band, Evidence
from forensics.evidence.spike_context import overlaps
from forensics.evidence.spike_shape import SpikeClass
from forensics.evidence.spikes import Spike, SpikeSearch
from forensics.findings import Finding, FindingKind, Severity, steps_text
from forensics.params import GRAD_NORM_CRITICAL, SpikesParams
from forensics.schema import GRAD_NORM, LOSS

_LOSS_SEVERITY = {
    SpikeClass.PHYSIOLOGICAL: Severity.INFO,
    SpikeClass.BENEFICIAL: Severity.INFO,
    SpikeClass.UNRESOLVED: Severity.WARNING,
    SpikeClass.PATHOLOGICAL: Severity.CRITICAL,
}


class _Judged:
    """A shared spike with this detector's own copy of its measures, to add context to."""

    __slots__ = ("spike", "m")

    def __init__(self, spike: Spike) -> None:
        self.spike = spike
        self.m: dict[str, Any] = dict(spike.measures)

    @property
    def start_step(self) -> int:
        return self.spike.start_step

    @property
    def end_step(self) -> int:
        return self.spike.end_step


class SpikeDetector:
    """loss_spike and grad_norm_spike: robust local detection, shape, classification, context."""

    name = "spikes"

    def __init__(self, params: SpikesParams | None = None) -> None:
        self.params = params or SpikesParams()

    def detect(self, ev: Evidence) -> list[Finding]:
        run = ev.run
        metrics = run.metrics()
        if LOSS not in metrics and GRAD_NORM not in metrics:
            run.note("spikes: not run, the log has neither a loss nor a grad-norm series")
            return []
        if any(
            SpikeSearch.of(self.params, m) != SpikeSearch.of(ev.params.spikes, m)
            for m in (LOSS, GRAD_NORM)
        ):
            # Made with other spike parameters than the evidence's (outside the pipeline): the
            # spikes this detector judges are found with its own.
            ev = ev.using(self.name, self.params)
        loss = [_Judged(s) for s in ev.spikes(LOSS)] if LOSS in metrics else []
        gn = [_Judged(s) for s in ev.spikes(GRAD_NORM)] if GRAD_NORM in metrics else []
        self._context(ev, loss + gn)
        self._link(loss, gn)
        band = ev.grad_norm_band if gn else None
        findings = [self._loss_finding(j) for j in loss]
        findings += [self._gn_finding(j, band) for j in gn]
        return findings

    # -- co-occurrence ------------------------------------------------------------------
    def _context(self, ev: Evidence, spikes: list[_Judged]) -> None:
        if not spikes:
            return
        drops = ev.drop_windows
        kinks = ev.lr_kinks
        for j in spikes:
            s, m = j.spike, j.m
            # The spike began after the previous logged point; a scaler logged after its update
            # shows the drop of an overflowing step at the next logged point: allow one interval.
            iv = s.log_interval
            overflow = overlaps(drops, s.start_step - iv, s.peak_step + iv)
            kink = next(
                (
                    k
                    for k in kinks
                    if k.step - iv <= s.start_step <= k.step + self.params.schedule_lag
                ),
                None,
            )
            m["loss_scale_drop"] = overflow
            m["lr_kink_step"] = kink.step if kink else None
            m["lr_kink_kind"] = kink.kind if kink else None
            m["cause"] = "numeric_overflow" if overflow else ("schedule_induced" if kink else None)

    def _link(self, loss: list[_Judged], gn: list[_Judged]) -> None:
        """Pair each grad-norm spike with a loss spike that began within the lead window."""
        for g in gn:
            g.m["loss_response"] = False
            g.m["leads_loss_by_steps"] = None
        for s in loss:
            s.m["grad_norm_lead_steps"] = None
            tol = s.spike.log_interval
            # A grad-norm spike leads a loss spike when the loss takes off while the grad norm is
            # still up (or within one logging interval of coming back), and not too long after.
            near = [
                g
                for g in gn
                if -tol <= s.start_step - g.start_step <= self.params.lead_window
                and s.start_step <= g.end_step + max(tol, g.spike.log_interval)
            ]
            if not near:
                continue
            g = min(near, key=lambda g: abs(s.start_step - g.start_step))
            lead = s.start_step - g.start_step
            g.m["loss_response"] = True
            if lead > 0:
                s.m["grad_norm_lead_steps"] = lead
                g.m["leads_loss_by_steps"] = lead
                if s.m["cause"] is None:
                    s.m["cause"] = "grad_norm_led"
        # A loss spike at the same step as a grad-norm spike (lead 0) is still a response.
        for g in gn:
            if not g.m["loss_response"]:
                g.m["loss_response"] = any(
                    abs(s.start_step - g.start_step) <= max(s.spike.log_interval, 1) for s in loss
                )

    # -- findings -----------------------------------------------------------------------
    def _judged(self, s: Spike) -> dict[str, Any]:
        """What a spike was judged against: its local baseline, the alarm line it passed and
        the thresholds that drew it, the recovery limit."""
        search = SpikeSearch.of(self.params, s.metric)
        return {
            "local_baseline": s.measures["baseline"],
            "alarm_at": s.alarm_at,
            "z_threshold": search.z_threshold,
            "min_ratio": search.min_ratio,
            "recovery_limit_steps": self.params.recover_steps,
        }

    def _loss_finding(self, j: _Judged) -> Finding:
        s, m = j.spike, j.m
        cls = s.classification
        sev = _LOSS_SEVERITY[cls]
        how = {
            SpikeClass.PHYSIOLOGICAL: f"back on its trend after {steps_text(m['recovery_steps'])}",
            SpikeClass.BENEFICIAL: (
                f"settled {abs(m['plateau_shift_rel'] or 0):.0%} below its earlier trend"
            ),
            SpikeClass.PATHOLOGICAL: _pathology(m, self.params.recover_steps),
            SpikeClass.UNRESOLVED: "still above its trend when the log ends",
        }[cls]
        extra = _cause_text(m)
        summary = (
            f"Loss spike at step {s.peak_step}: {m['peak_value']:.4g} against a local baseline of "
            f"{m['baseline']:.4g} ({_height(m)}), {how}; {cls}{extra}."
        )
        return Finding(
            FindingKind.LOSS_SPIKE,
            sev,
            LOSS,
            s.start_step,
            summary,
            s.peak_step,
            s.end_step,
            m,
            judged_against=self._judged(s),
        )

    def _gn_finding(self, j: _Judged, band: Band | None) -> Finding:
        s, m = j.spike, j.m
        rec = m["recovery_steps"]
        transient_limit = max(self.params.transient_steps, 2 * s.log_interval)
        transient = bool(m["recovered"]) and rec is not None and rec <= transient_limit
        run_base = band.baseline.value if band else None
        m["transient"] = transient
        m["run_baseline"] = run_base
        m["ratio_to_run_baseline"] = m["peak_value"] / run_base if run_base else None
        if transient:
            sev = (
                Severity.WARNING
                if m["loss_response"]
                else Severity(self.params.absorbed_gn_severity)
            )
            what = (
                "the loss moved with it: check that batch"
                if m["loss_response"]
                else "the loss did not move: an outlier batch the optimizer absorbed"
            )
            how = f"back within {steps_text(rec)}, {what}"
        else:
            r = m["ratio_to_run_baseline"] or m["height_ratio"]
            critical = band.critical_ratio if band and band.critical_ratio else GRAD_NORM_CRITICAL
            sev = (
                Severity.CRITICAL
                if (r or 0) >= critical and not m["recovered"]
                else Severity.WARNING
            )
            how = (
                f"back only after {steps_text(rec)}" if m["recovered"] else "not back on its trend"
            )
        lead = (
            f"; it led a loss spike by {m['leads_loss_by_steps']} steps"
            if m["leads_loss_by_steps"]
            else ""
        )
        summary = (
            f"Grad-norm spike at step {s.peak_step}: {m['peak_value']:.4g} against a local "
            f"baseline of {m['baseline']:.4g} ({_height(m)}), {how}{lead}{_cause_text(m)}."
        )
        judged: dict[str, Any] = dict(band.judged()) if band else {}
        judged.update(self._judged(s))
        judged["transient_limit_steps"] = transient_limit
        return Finding(
            FindingKind.GRAD_NORM_SPIKE,
            sev,
            GRAD_NORM,
            s.start_step,
            summary,
            s.peak_step,
            s.end_step,
            m,
            judged_against=judged,
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
        kind = str(m["lr_kink_kind"]).replace("_", " ")
        return f"; it follows an LR-schedule {kind} at step {m['lr_kink_step']}"
    return ""
