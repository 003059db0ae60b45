"""Loss and grad-norm spikes: detection, shape, classification, co-occurrence (article 4).

One rule per severity; the severity a finding's text announces is the severity it gets.

* A spike inside a diverged stretch (:attr:`Evidence.diverged`: from the divergence's onset
  to where the loss came back, or to the end of the log) is part of that divergence, not an
  event of its own: classification ``diverged``, info (the divergence finding carries the red
  light), and the text says so.
* A spike the log cannot judge yet, because the log ends before it could come back
  (``unresolved``: still up, fewer than ``recover_steps`` logged after the peak; a spike at the
  last logged step has none) is at most a warning: alone it never makes a verdict critical.
* Loss spikes (article 4.3): physiological or beneficial = info; pathological = critical.
* Grad-norm spikes back within ``transient_steps``, above their alarm line for at most
  ``transient_points`` logged points, are single-batch outliers: the article's 2x / 3x lines
  (6.1, 6.3) judge the grad norm's level, a rolling mean, which one step does not move; such
  a spike is judged by its recovery: info when the loss did not move (absorbed,
  ``absorbed_gn_severity``), warning when the loss moved with it ("check that batch"). The
  text says so and does not print the 2x / 3x lines as if they applied. The absorbed ones
  with no overflow or schedule event at them are one ``grad_norm_outliers`` note per run
  (their count, rate, highest, and each one's step in ``events_at``), not a finding each.
* Every other grad-norm spike stays up long enough to move that level, and is judged against
  the grad-norm band (``grad_norm_drift.warn_ratio`` / ``crit_ratio``, 2x / 3x the run
  baseline: the same lines the drift finding and the chart use): critical at or above the
  critical line, warning at or above the warning line, info below it. The text states the
  ratio and the lines.

* A grad-norm surge, a stretch above the band's warning line that the search's local
  baseline followed (a ramp of a few dozen steps, :mod:`forensics.evidence.surges`), is one
  of these spikes too (``Spike.found_by == "band"``): never one batch, judged by the lines,
  its text a "surge" with its points above the line counted.

``judged_by`` in the measures names which of these rules gave the severity.

Steps: ``start_step`` is the onset (where the series left its noise), ``peak_step`` the
highest point, ``end_step`` the step it was back in the band (the last logged step if never).

The spikes come from the evidence (:meth:`forensics.evidence.Evidence.spikes`), found once
with the configured parameters and shared with the periodicity and loss-scale detectors; this
detector adds what happened around them and judges them. Each finding's ``judged_against``:
the local baseline and the alarm line (``alarm_at``, with ``z_threshold`` and ``min_ratio``,
or ``gross_ratio`` and ``z_gross`` where that rule's line is lower),
the recovery limit (``recovery_limit_steps``), and for grad-norm spikes the run's grad-norm
band (``baseline``, ``warn_at``, ``critical_at``) and ``transient_limit_steps``.

The measures of its finding kinds are declared in :mod:`forensics.measures`.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from typing import Any

import numpy as np

from forensics.evidence import Band, Evidence
from forensics.evidence.spike_context import Overlaps, absorbed_reach, event_near, near_steps
from forensics.evidence.spike_shape import SpikeClass
from forensics.evidence.spikes import Spike, SpikeSearch
from forensics.evidence.surges import band_surges
from forensics.evidence.trend_utils import num, robust_sigma, steps_within, times
from forensics.findings import Finding, FindingKind, Severity, step_range, steps_text
from forensics.params import (
    GRAD_NORM_CRITICAL,
    GRAD_NORM_WARN,
    QUICK_RECOVERY_STEPS,
    SpikesParams,
)
from forensics.schema import GRAD_NORM, LOSS

DIVERGED = "diverged"  # the classification of a spike inside a diverged stretch

_LOSS_SEVERITY = {
    SpikeClass.PHYSIOLOGICAL: Severity.INFO,
    SpikeClass.BENEFICIAL: Severity.INFO,
    SpikeClass.UNRESOLVED: Severity.WARNING,
    SpikeClass.PATHOLOGICAL: Severity.CRITICAL,
}


class _Judged:
    """A shared spike with this detector's own copy of its measures, to add context to."""

    __slots__ = ("spike", "m", "diverged", "nonfinite_at", "held")

    def __init__(self, spike: Spike) -> None:
        self.spike = spike
        self.m: dict[str, Any] = dict(spike.measures)
        self.diverged: tuple[int, int] | None = None  # the diverged stretch it lies in
        self.nonfinite_at: int | None = None  # the series turned NaN / Inf before it came back
        self.held: tuple[float, int] | None = None  # a level step: (level held, its points)

    @property
    def start_step(self) -> int:
        return self.spike.start_step

    @property
    def end_step(self) -> int:
        return self.spike.end_step


class _Starts:
    """Spikes by start step, for the ones whose start lies in ``[lo, hi]`` (in their given
    order); every spike when a bound is not a finite number."""

    def __init__(self, spikes: list[_Judged]) -> None:
        self.spikes = spikes
        self.order = sorted(range(len(spikes)), key=lambda i: spikes[i].start_step)
        self.starts = [spikes[i].start_step for i in self.order]

    def within(self, lo: float, hi: float) -> list[_Judged]:
        if not (math.isfinite(lo) and math.isfinite(hi)):
            return self.spikes
        a = bisect_left(self.starts, lo)
        b = bisect_right(self.starts, hi)
        return [self.spikes[i] for i in sorted(self.order[a:b])]


class SpikeDetector:
    """loss_spike, grad_norm_spike and grad_norm_outliers: robust local detection, shape,
    classification, context."""

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
        gn = [_Judged(s) for s in _grad_norm_spikes(ev)] if GRAD_NORM in metrics else []
        self._context(ev, loss + gn)
        self._link(loss, gn)
        _rose_after(ev, loss)
        _highest(ev, loss)
        band = ev.grad_norm_band if gn else None
        _level_steps(ev, gn)
        findings = [self._loss_finding(j) for j in loss]
        band_judged = band.judged() if band else {}  # (the same lines for every spike)
        absorbed = [j for j in gn if self._absorbed(j)]
        if absorbed:
            kept = {id(j) for j in absorbed}
            gn = [j for j in gn if id(j) not in kept]
        findings += [self._gn_finding(j, band, band_judged) for j in gn]
        if absorbed:
            findings.append(self._outliers_finding(ev, absorbed, band))
        return findings

    # -- absorbed outliers: one note for all of them --------------------------------------
    def _transient_limit(self, s: Spike) -> float:
        return max(self.params.transient_steps, 2 * s.log_interval)

    def _transient(self, s: Spike, m: dict[str, Any]) -> bool:
        """Back within its transient limit, and above its alarm line for at most
        ``transient_points`` logged points: one batch. Twenty steps at 4x the baseline came
        back within the limit too, and read "a batch the optimizer absorbed"; a grad norm
        held that long has moved the level the 2x / 3x lines judge."""
        rec = m["recovery_steps"]
        if s.found_by == "band":  # (more than transient_points points above the line)
            return False
        if not m["recovered"] or rec is None or rec > self._transient_limit(s):
            return False
        return _points_above(s, m) <= self.params.transient_points

    def _absorbed(self, j: _Judged) -> bool:
        """A grad-norm spike that is one batch the optimizer absorbed: back within its
        transient limit, outside a divergence, the loss unmoved, no overflow or schedule event
        at it. A long run has thousands (4,812 in a synthetic 1M-step run, 30 in a real 20k-step
        llm.c run), each alike: they are one ``grad_norm_outliers`` note, whose
        ``events_at`` keeps each one's step. Only while such spikes are notes: configured to a
        warning (``absorbed_gn_severity``), each is its own finding to act on."""
        if self.params.absorbed_gn_severity != Severity.INFO.value or j.diverged is not None:
            return False
        s, m = j.spike, j.m
        if not self._transient(s, m) or m["loss_response"]:
            return False
        m["transient"] = True  # (as _gn_finding sets it: the reach of a schedule event reads it)
        _unless_absorbed(m, s.start_step, self.params.schedule_lag)
        return m.get("cause") is None

    def _outliers_finding(self, ev: Evidence, js: list[_Judged], band: Band | None) -> Finding:
        js = sorted(js, key=lambda j: j.spike.start_step)
        ratios = np.array([_ratio(j.m) for j in js])
        top = sorted(range(len(js)), key=lambda i: (-ratios[i], js[i].spike.peak_step))
        hi = js[top[0]]
        steps = ev.series(GRAD_NORM).steps
        span = int(steps[-1] - steps[0]) if len(steps) else 0
        n = len(js)
        rec = max(int(j.m["recovery_steps"]) for j in js)
        # (the steps the finding spans: the first one's onset to the last one back, as the
        # report's steps column and chart show them)
        last_end = max(j.spike.end_step for j in js)
        m: dict[str, Any] = {
            "count": n,
            "per_1k_steps": n * 1000 / span if span > 0 else None,
            "highest_ratio": float(ratios[top[0]]),
            "highest_step": hi.spike.peak_step,
            "highest_value": hi.m["peak_value"],
            "highest_baseline": hi.m["baseline"],
            "median_ratio": float(np.median(ratios)),
            "longest_recovery_steps": rec,
        }
        warn = band.warn_ratio if band else GRAD_NORM_WARN
        crit = band.critical_ratio if band and band.critical_ratio else GRAD_NORM_CRITICAL
        lines = f"not by the {warn:g}x / {crit:g}x lines of the grad norm's level"
        if n == 1:
            summary = (
                f"A grad-norm outlier at step {hi.spike.peak_step:,}: {num(hi.m['peak_value'])} "
                f"against a local baseline of {num(hi.m['baseline'])} ({_height(hi.m)}), back "
                f"within {steps_text(rec)} and the loss did not move: a batch the optimizer "
                f"absorbed (judged by its recovery, {lines})."
            )
        else:
            rate = m["per_1k_steps"]
            often = f" ({_rate(rate)} per 1,000 steps)" if rate is not None else ""
            nexts = [f"{js[i].spike.peak_step:,} ({_ratio_text(ratios[i])})" for i in top[1:3]]
            others = f"; then step{'s' if len(nexts) > 1 else ''} {' and '.join(nexts)}"
            summary = (
                f"{n:,} grad-norm outliers from step {js[0].spike.start_step:,} to "
                f"{last_end:,}{often}, each back within {steps_text(rec)} with the "
                f"loss unmoved: batches the optimizer absorbed (judged by their recovery, "
                f"{lines}). The highest: {num(hi.m['peak_value'])} against a local baseline "
                f"of {num(hi.m['baseline'])} ({_height(hi.m)}) at step "
                f"{hi.spike.peak_step:,}{others}; their median "
                f"{_ratio_text(m['median_ratio'])}."
            )
        search = SpikeSearch.of(self.params, GRAD_NORM)
        judged: dict[str, Any] = {
            "z_threshold": search.z_threshold,
            "min_ratio": search.min_ratio,
            "gross_ratio": search.gross_ratio,
            "z_gross": search.z_gross,
            "transient_limit_steps": max(self._transient_limit(j.spike) for j in js),
            "transient_limit_points": self.params.transient_points,
        }
        return Finding(
            FindingKind.GRAD_NORM_OUTLIERS,
            Severity.INFO,
            GRAD_NORM,
            js[0].spike.start_step,
            summary,
            hi.spike.peak_step,
            last_end,
            m,
            judged_against=judged,
            events_at=tuple(j.spike.peak_step for j in js),
        )

    # -- co-occurrence ------------------------------------------------------------------
    def _context(self, ev: Evidence, spikes: list[_Judged]) -> None:
        if not spikes:
            return
        drops = Overlaps(ev.drop_windows)  # (one binary search a spike)
        events = ev.schedule_events
        event_steps = [e.step for e in events]  # (once, not once a spike)
        diverged = ev.diverged if ev.has(LOSS) and ev.has(GRAD_NORM) else []
        # (the causes table's reach too: a sentence never names a kink its causes rule out)
        lag = near_steps(ev.run.first_step, ev.run.last_step, self.params.schedule_lag)
        for j in spikes:
            s, m = j.spike, j.m
            j.diverged = next((d for d in diverged if d[0] <= s.start_step <= d[1]), None)
            m["divergence_from"] = j.diverged[0] if j.diverged else None
            if not m["recovered"]:
                logged = ev.logged(s.metric)
                bad = logged.steps[(logged.steps > s.peak_step) & ~np.isfinite(logged.values)]
                j.nonfinite_at = int(bad[0]) if len(bad) else None
            # The spike began after the previous logged point; a scaler logged after its update
            # shows the drop of an overflowing step at the next logged point: allow one interval.
            iv = s.log_interval
            overflow = drops(s.start_step - iv, s.peak_step + iv)
            # (the causes table's window: an event up to the onset's step, within the reach)
            kink = event_near(events, event_steps, s.start_step - lag, s.start_step + 1)
            m["loss_scale_drop"] = overflow
            m["lr_kink_step"] = kink.step if kink else None
            m["lr_kink_kind"] = kink.kind if kink else None
            m["cause"] = "numeric_overflow" if overflow else ("schedule_induced" if kink else None)

    def _link(self, loss: list[_Judged], gn: list[_Judged]) -> None:
        """Pair each grad-norm spike with a loss spike that began within the lead window.

        Thousands of grad-norm spikes against a few loss spikes: each test looks only at the
        spikes whose start lies within its reach (binary searches over the starts), which are
        the only ones the plain scan could accept, in the plain scan's order."""
        for g in gn:
            g.m["loss_response"] = False
            g.m["leads_loss_by_steps"] = None
        gn_starts = _Starts(gn)
        for s in loss:
            s.m["grad_norm_lead_steps"] = None
            tol = s.spike.log_interval
            lead_window = self.params.lead_window
            # A grad-norm spike leads a loss spike when the loss takes off while the grad norm is
            # still up (or within one logging interval of coming back), and not too long after.
            near = [
                g
                for g in gn_starts.within(s.start_step - lead_window, s.start_step + tol)
                if -tol <= s.start_step - g.start_step <= lead_window
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
        if not loss:
            return
        loss_starts = _Starts(loss)
        reach = max(max(s.spike.log_interval, 1) for s in loss)
        for g in gn:
            if not g.m["loss_response"]:
                g.m["loss_response"] = any(
                    abs(s.start_step - g.start_step) <= max(s.spike.log_interval, 1)
                    for s in loss_starts.within(g.start_step - reach, g.start_step + reach)
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
            "gross_ratio": search.gross_ratio,
            "z_gross": search.z_gross,
            "recovery_limit_steps": self.params.recover_steps,
        }

    def _loss_finding(self, j: _Judged) -> Finding:
        s, m = j.spike, j.m
        cls = s.classification
        if j.diverged is not None:
            m["classification"] = DIVERGED
            m["judged_by"] = "divergence"
            sev = Severity.INFO
            how = _inside(j.diverged)
        else:
            sev = _LOSS_SEVERITY[cls]
            m["judged_by"] = "unresolved" if cls is SpikeClass.UNRESOLVED else "shape"
            how = {
                SpikeClass.PHYSIOLOGICAL: (
                    f"back on its trend after {steps_text(m['recovery_steps'])}"
                    f"{_slow_text(m, self.params.recover_steps, s.peak_step)}; {cls}"
                ),
                SpikeClass.BENEFICIAL: (
                    f"settled {abs(m['plateau_shift_rel'] or 0):.0%} below its earlier trend; {cls}"
                ),
                # (a spike cut from a climb the loss never came back from: the climb says it;
                # "settled 93% above its earlier trend" beside "went on rising" contradicted it)
                SpikeClass.PATHOLOGICAL: (
                    f"{cls}{_rose_text(m)}"
                    if m.get("rose_after_to") is not None
                    else f"{_pathology(m, self.params.recover_steps)}; {cls}"
                ),
                SpikeClass.UNRESOLVED: _unresolved(j),
            }[cls]
        summary = (
            f"Loss spike at step {s.peak_step:,}: {num(m['peak_value'])} against a local "
            f"baseline of {num(m['baseline'])} ({_height(m)}{_highest_text(m)}), {how}"
            f"{_cause_text(m)}."
        )
        # A spike cut from a climb the loss never came back from began where the climb did
        # (the point after its low): the incident, its order sentence and the rollback then
        # tell one story (bigscience ds-off: "onset at step 40" beside "last healthy step 31,
        # before the loss climb at step 32").
        since = m.get("rose_since_step")
        start = since + 1 if isinstance(since, int) and since < s.start_step else s.start_step
        return Finding(
            FindingKind.LOSS_SPIKE,
            sev,
            LOSS,
            start,
            summary,
            s.peak_step,
            s.end_step,
            m,
            judged_against=self._judged(s),
        )

    def _gn_finding(
        self, j: _Judged, band: Band | None, band_judged: dict[str, Any] | None = None
    ) -> Finding:
        s, m = j.spike, j.m
        rec = m["recovery_steps"]
        transient_limit = self._transient_limit(s)
        transient = self._transient(s, m)
        run_base = band.baseline.value if band else None
        m["transient"] = transient
        m["run_baseline"] = run_base
        m["ratio_to_run_baseline"] = m["peak_value"] / run_base if run_base else None
        # The level lines: the run's grad-norm band (2x / 3x its baseline), or the same ratios
        # of the local baseline when the run has no band.
        r = m["ratio_to_run_baseline"] or m["height_ratio"] or 0.0
        warn = band.warn_ratio if band else GRAD_NORM_WARN
        crit = band.critical_ratio if band and band.critical_ratio else GRAD_NORM_CRITICAL
        on_level = _on_lines(r, warn, crit)
        of_what = "the run's baseline" if run_base else "its local baseline"
        lines = f"{r:.1f}x {of_what} (warning from {warn:g}x, critical from {crit:g}x)"
        if j.diverged is not None:
            m["classification"] = DIVERGED
            m["judged_by"] = "divergence"
            sev = Severity.INFO
            how = _inside(j.diverged)
        elif transient:
            m["judged_by"] = "recovery"
            _settled_by_recovery(m)
            _unless_absorbed(m, s.start_step, self.params.schedule_lag)
            sev = (
                Severity.WARNING
                if m["loss_response"]
                else Severity(self.params.absorbed_gn_severity)
            )
            what = (
                "but the loss moved with it: check that batch"
                if m["loss_response"]
                else "and the loss did not move: an outlier batch the optimizer absorbed"
            )
            how = (
                f"back within {steps_text(rec)} {what} (a transient: judged by its recovery, "
                f"not by the {warn:g}x / {crit:g}x lines of the grad norm's level)"
            )
        elif s.classification is SpikeClass.UNRESOLVED:
            m["judged_by"] = "unresolved"
            level = on_level or Severity.INFO
            sev = level if level.rank <= Severity.WARNING.rank else Severity.WARNING
            held = (
                f"; {r:.1f}x {of_what}, held at warning until a longer log shows whether it "
                "comes back"
                if level is Severity.CRITICAL
                else f"; {lines}"
            )
            how = _unresolved(j) + held
        elif j.held is not None:
            # A step to a level it held: judged by that level, which is what the 2x / 3x
            # lines are for, not by the highest point of its noise (a step to 1.9x read as a
            # warning from one point at 2.05x, and as a batch to find).
            held_at, n_held = j.held
            m["judged_by"] = "level"
            h = held_at / run_base if run_base else held_at / m["baseline"]
            m["held_ratio"] = h
            sev = _on_lines(h, warn, crit) or Severity.INFO
            steps = m["steps_logged_after_peak"]
            summary = (
                f"Grad-norm level step at step {s.start_step:,}: from a local baseline of "
                f"{num(m['baseline'])} to {num(held_at)} (the median of the {n_held:,} points from "
                f"its peak on), held for the {steps_text(steps)} the log goes on; {h:.1f}x "
                f"{of_what} (warning from {warn:g}x, critical from {crit:g}x); its highest point "
                f"{num(m['peak_value'])} at step {s.peak_step:,}, within the new level's noise"
                f"{_cause_text(m)}."
            )
            return self._gn_made(j, sev, summary, band, band_judged, transient_limit)
        else:
            m["judged_by"] = "band"
            sev = on_level or Severity.INFO
            if m["recovered"] and m.get("settled") == "higher":
                # Its band widened with the distance until it took in the new level: that is
                # no return (a step up read "back only after 1,536 steps").
                back = f"settled {m['plateau_shift_rel'] or 0:.0%} above its earlier trend"
            elif m["recovered"] and rec is not None and rec <= transient_limit:
                # (back within the transient limit, but too wide for one batch)
                back = (
                    f"back after {steps_text(rec)}, above its alarm line for "
                    f"{_points_above(s, m):,} logged points: longer than one batch"
                )
                if s.found_by == "band":  # (its points above the line, counted)
                    back = (
                        f"back after {steps_text(rec)}, above the warning line for "
                        f"{m['points']:,} logged points: longer than one batch"
                    )
            elif m["recovered"]:
                back = f"back only after {steps_text(rec)}"
            else:
                back = f"not back {steps_text(m['steps_logged_after_peak'])} later"
            how = f"{back}; {lines}"
        lead = (
            f"; it led a loss spike by {steps_text(m['leads_loss_by_steps'])}"
            if m["leads_loss_by_steps"]
            else ""
        )
        summary = (
            f"Grad-norm spike at step {s.peak_step:,}: {num(m['peak_value'])} against a local "
            f"baseline of {num(m['baseline'])} ({_height(m)}), {how}{lead}{_cause_text(m)}."
        )
        if s.found_by == "band":  # a climb its local baseline followed: named as one
            summary = (
                f"Grad-norm surge from step {s.start_step:,}: up to {num(m['peak_value'])} at "
                f"step {s.peak_step:,} from a level of {num(m['baseline'])} ({_height(m)}), "
                f"{how}{lead}{_cause_text(m)}."
            )
        return self._gn_made(j, sev, summary, band, band_judged, transient_limit)

    def _gn_made(
        self,
        j: _Judged,
        sev: Severity,
        summary: str,
        band: Band | None,
        band_judged: dict[str, Any] | None,
        transient_limit: float,
    ) -> Finding:
        s, m = j.spike, j.m
        m.setdefault("held_level", j.held[0] if j.held else None)
        m.setdefault("held_ratio", None)
        if band_judged is None:
            band_judged = band.judged() if band else {}
        judged: dict[str, Any] = dict(band_judged)
        judged.update(self._judged(s))
        judged["transient_limit_steps"] = transient_limit
        judged["transient_limit_points"] = self.params.transient_points
        if m["judged_by"] == "level":
            judged["held_at"] = m["held_level"]  # (the level judged, drawn on the chart)
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


def _grad_norm_spikes(ev: Evidence) -> list[Spike]:
    """The grad norm's spikes, and its surges above the band that the spike search's local
    baseline followed (:func:`~forensics.evidence.surges.band_surges`)."""
    found = ev.spikes(GRAD_NORM)
    return sorted([*found, *band_surges(ev, GRAD_NORM, found)], key=lambda s: s.start_step)


def _points_above(s: Spike, m: dict[str, Any]) -> int:
    """The logged points a spike stood above its alarm line around its peak (its width in
    logging intervals, at least one)."""
    return max(1, round(m["width_steps"] / s.log_interval)) if s.log_interval > 0 else 1


def _on_lines(ratio: float, warn: float, crit: float) -> Severity | None:
    """The grad-norm band's light for a ratio to its baseline: critical from ``crit``,
    warning from ``warn``, None below."""
    return Severity.CRITICAL if ratio >= crit else (Severity.WARNING if ratio >= warn else None)


# A grad-norm spike that is not back and whose highest point lies within this many robust
# sigmas of the level it held after it is a step to that level, not a spike above it.
_STEP_NOISE_K = 6.0
_STEP_MIN_POINTS = 20


def _level_steps(ev: Evidence, gn: list[_Judged]) -> None:
    """Mark the grad-norm spikes that are steps to a level held to their end (not back,
    their peak within the new level's own noise): ``j.held`` = (the median of the finite
    points from the peak to the spike's end, their number)."""
    series = None  # (finite values, looked up once and only when a spike is not back)
    for j in gn:
        m = j.m
        if (
            j.diverged is not None
            or m["recovered"]
            or j.spike.classification is SpikeClass.UNRESOLVED
        ):
            continue
        if series is None:
            series = ev.series(GRAD_NORM)
        v = series.values[steps_within(series.steps, j.spike.peak_step, j.spike.end_step)]
        if len(v) < _STEP_MIN_POINTS:
            continue
        level = float(np.median(v))
        sigma = robust_sigma(v)
        if level > m["baseline"] and m["peak_value"] <= level + _STEP_NOISE_K * sigma:
            j.held = (level, len(v))


def _settled_by_recovery(m: dict[str, Any]) -> None:
    """A grad-norm outlier back within its transient limit: its shape is its recovery. The
    level of the next 500 steps is not its doing (one batch cannot set it), and measured
    against a trend fitted on the few steps before it (the warm-up's fall, at step 72 of the
    sample runs) it read +270% "settled higher" for a grad norm that stayed at 0.5-0.8. So
    no plateau is measured for it, and it is back on its trend: physiological. A lasting
    level change of the grad norm is grad_norm_drift's to judge."""
    m["plateau_shift"] = m["plateau_shift_rel"] = m["settled"] = None
    m["classification"] = SpikeClass.PHYSIOLOGICAL


def _unless_absorbed(m: dict[str, Any], onset: int, lag: int) -> None:
    """An outlier the optimizer absorbed follows a schedule event only at its onset or the
    logged step before it (:func:`absorbed_reach`, as the causes table reads it)."""
    kink = m.get("lr_kink_step")
    if isinstance(kink, int) and kink < onset - absorbed_reach(m, lag):
        m["lr_kink_step"] = m["lr_kink_kind"] = None
        if m.get("cause") == "schedule_induced":
            m["cause"] = None


def _rose_after(ev: Evidence, loss: list[_Judged]) -> None:
    """``rose_after_to`` / ``rose_after_step`` of each pathological loss spike that the loss
    never came back from (every later point above its local baseline) and that it went on
    climbing past (a later point above the peak): a steady climb the spike search cut a piece
    from, which "settled above its trend" alone would misdescribe."""
    series = None
    for j in loss:
        j.m["rose_after_to"] = j.m["rose_after_step"] = None
        j.m["rose_since_value"] = j.m["rose_since_step"] = None
        if j.diverged is not None or j.spike.classification is not SpikeClass.PATHOLOGICAL:
            continue
        if series is None:
            series = ev.series(LOSS)  # (finite values, looked up once)
        i = int(np.searchsorted(series.steps, j.spike.peak_step, side="right"))
        after = series.values[i:]
        if not len(after):
            continue
        top = int(np.argmax(after))
        if after[top] > j.m["peak_value"] and after.min() > j.m["baseline"]:
            j.m["rose_after_to"] = float(after[top])
            j.m["rose_after_step"] = int(series.steps[i + top])
            low = _climb_start(series.steps, series.values, j)
            if low is not None:
                j.m["rose_since_value"] = float(series.values[low])
                j.m["rose_since_step"] = int(series.steps[low])
    _climb_grad_norm(ev, loss)


def _climb_grad_norm(ev: Evidence, loss: list[_Judged]) -> None:
    """``climb_grad_norm_early`` / ``_late``: the grad norm's median over the first and the
    last third of a never-recovered climb. The divergence the article names has the loss and
    the grad norm rising together; a loss climbing on its own (bigscience ds-off: 11.65 to
    20.44 while the grad norm held near 7.9) is said to be that, from the log's numbers."""
    grad = ev.series(GRAD_NORM) if ev.run.has(GRAD_NORM) else None
    for j in loss:
        j.m["climb_grad_norm_early"] = j.m["climb_grad_norm_late"] = None
        if grad is None or j.m.get("rose_after_to") is None:
            continue
        since = j.m.get("rose_since_step")
        a = since if since is not None else j.spike.start_step
        sel = (grad.steps >= a) & (grad.steps <= j.m["rose_after_step"])
        g = grad.values[sel]
        third = len(g) // 3
        if third >= 3:
            j.m["climb_grad_norm_early"] = float(np.median(g[:third]))
            j.m["climb_grad_norm_late"] = float(np.median(g[-third:]))


def _climb_start(steps: np.ndarray, values: np.ndarray, j: _Judged) -> int | None:
    """Where the climb a never-recovered spike is part of began: the loss's lowest point
    within ``CLIMB_LOOKBACK`` logged points before the onset, when it lies below the spike's
    local baseline, at least ``CLIMB_MIN_POINTS`` points before the onset, and the loss went
    up on at least two thirds of the steps from there to the onset (a steady climb, not a
    dip before a jump). None otherwise."""
    onset = int(np.searchsorted(steps, j.spike.start_step, side="left"))
    lo = max(0, onset - CLIMB_LOOKBACK)
    if onset - lo < CLIMB_MIN_POINTS:
        return None
    low = lo + int(np.argmin(values[lo:onset]))
    if onset - low < CLIMB_MIN_POINTS or not values[low] < j.m["baseline"]:
        return None
    ups = np.diff(values[low : onset + 1]) > 0
    return low if 3 * int(ups.sum()) >= 2 * len(ups) else None


CLIMB_LOOKBACK = 100  # logged points before a spike searched for the start of its climb
CLIMB_MIN_POINTS = 3  # a climb spans at least this many logged points before the onset


def _highest(ev: Evidence, loss: list[_Judged]) -> None:
    """``highest_value`` / ``highest_step``: the highest finite loss within each spike. The
    peak is where the loss stood furthest above its local baseline; on a steeply falling
    baseline that can be a point after the highest one, which the chart beside the sentence
    shows."""
    if not loss:
        return
    series = ev.series(LOSS)
    for j in loss:
        s = j.spike
        a = int(np.searchsorted(series.steps, s.start_step, side="left"))
        b = int(np.searchsorted(series.steps, s.end_step, side="right"))
        j.m["highest_value"], j.m["highest_step"] = j.m["peak_value"], s.peak_step
        if b > a:
            top = a + int(np.argmax(series.values[a:b]))
            if series.values[top] > j.m["peak_value"]:
                j.m["highest_value"] = float(series.values[top])
                j.m["highest_step"] = int(series.steps[top])


def _highest_text(m: dict[str, Any]) -> str:
    # (a loss that went on rising after the spike says so with its higher value already; a
    # spike inside a divergence spans into the divergence's later, higher spikes)
    if (
        m["highest_value"] <= m["peak_value"]
        or m.get("rose_after_to") is not None
        or m.get("judged_by") == "divergence"
    ):
        return ""
    return (
        f"; the highest logged value was {num(m['highest_value'])}, at step {m['highest_step']:,}"
    )


def _rose_text(m: dict[str, Any]) -> str:
    if m.get("rose_after_to") is None:
        return ""
    since = ""
    if m.get("rose_since_step") is not None:
        since = (
            f"; part of a climb from {num(m['rose_since_value'])} at step {m['rose_since_step']:,}"
        )
    early, late = m.get("climb_grad_norm_early"), m.get("climb_grad_norm_late")
    grad = ""
    if early and late is not None:
        if late / early < _CLIMB_GRAD_RISE:
            grad = (
                f"; the grad norm held through the climb ({num(early)} over its first third, "
                f"{num(late)} over its last): the loss rose on its own, not the divergence "
                "where loss and grad norm climb together"
            )
        else:
            grad = f"; the grad norm rose with it ({num(early)} -> {num(late)})"
    return (
        f"{since}; the loss never came back and went on rising after it, to "
        f"{num(m['rose_after_to'])} at step {m['rose_after_step']:,}{grad}"
    )


_CLIMB_GRAD_RISE = 1.5  # late / early grad norm over a climb from which it counts as rising


def _inside(stretch: tuple[int, int]) -> str:
    return (
        f"inside the divergence of steps {step_range(*stretch)}: part of it (judged there), "
        "not an event of its own"
    )


def _unresolved(j: _Judged) -> str:
    m = j.m
    if j.nonfinite_at is not None:
        return f"still up when the values turned non-finite at step {j.nonfinite_at:,}; unresolved"
    n = m["steps_logged_after_peak"]
    if not n:
        return "at the last logged step: unresolved (nothing is logged after it)"
    return f"still up when the log ends {steps_text(n)} later: unresolved"


def _ratio(m: dict[str, Any]) -> float:
    """A spike's peak / local baseline (0 where the baseline gives none)."""
    r = m["height_ratio"]
    return float(r) if r is not None and math.isfinite(r) else 0.0


def _ratio_text(r: float) -> str:
    return f"{r:.2f}x" if r < 100 else f"{times(r)}x"


def _rate(r: float) -> str:
    """ "4.8", "0.31", "12": a rate with two significant digits below 10."""
    if r < 0.01:
        return "under 0.01"
    return f"{r:.2g}" if r < 10 else f"{r:,.0f}"


def _height(m: dict[str, Any]) -> str:
    r = m["height_ratio"]
    if r is None:
        return f"+{num(m['height'])}"
    return _ratio_text(r)


def _slow_text(m: dict, limit: int, peak: int) -> str:
    """A physiological spike slower than a passing fluctuation (the article's 100-300 steps)
    but back within ``limit``: said, so the reader sees it was close to the line. One whose
    logged points are too far apart to tell (back at a point more than ``limit`` after its
    peak, its last raised point less than ``limit`` after it): said too."""
    steps = m.get("recovery_steps")
    if steps is not None and steps > limit:
        raised = m.get("last_raised_step")
        raised = raised if isinstance(raised, int) else peak
        gap = steps - (raised - peak)
        last = (
            "the next logged point after its peak"
            if raised == peak
            else f"{steps_text(gap)} after its last raised point (step {raised:,})"
        )
        return (
            f" ({last}): the log's points are too far apart to show whether it was back "
            f"within the {limit:,} steps that would make it pathological, and it shows no "
            f"point still raised {limit:,} steps after the peak"
        )
    if steps is None or not QUICK_RECOVERY_STEPS < steps <= limit:
        return ""
    return (
        f", slower than a passing fluctuation (back within {QUICK_RECOVERY_STEPS}) but within "
        f"the {limit:,} that would make it pathological"
    )


def _pathology(m: dict[str, Any], limit: int) -> str:
    if not m["recovered"]:
        # How far off, where the log shows it: the plateau is read from ``limit`` steps after
        # the peak (spike_shape's plateau window), the median there against the trend.
        rel = m.get("plateau_shift_rel")
        off = (
            f" (from {steps_text(limit)} after the peak, a median {abs(rel):.1%} "
            f"{'above' if rel > 0 else 'below'} it)"
            if isinstance(rel, float) and abs(rel) >= 0.005
            else ""
        )
        return f"not back on its trend {steps_text(m['steps_logged_after_peak'])} later{off}"
    if m["recovery_steps"] > limit and m.get("settled") != "higher":
        return f"back only after {steps_text(m['recovery_steps'])}"
    return f"settled {m['plateau_shift_rel'] or 0:.0%} above its earlier trend"


_EVENT_WORDS = {
    "warmup_end": "the LR warm-up's end",
    "restart": "an LR restart",
    "drop": "an LR step drop",
    "cooldown": "the start of the LR cooldown",
}


def _cause_text(m: dict[str, Any]) -> str:
    if m.get("cause") == "numeric_overflow":
        # The overflow is the mechanism; what set it off is judged by the causes (diagnosis).
        return "; the loss scale dropped during the spike (an overflow: see its causes)"
    if m.get("cause") == "schedule_induced":
        kind = _EVENT_WORDS.get(str(m["lr_kink_kind"]), str(m["lr_kink_kind"]))
        return f"; it follows {kind} at step {m['lr_kink_step']:,}"
    return ""
