"""NaN / Inf in the loss or the grad norm (article 6.2 start-up checklist, 6.3 orange light).

Severity: fatal when the NaN persists (training never got a finite value back), critical for
isolated non-finite steps, but a warning for isolated non-finite grad-norm steps the loss did
not follow (back at its level after them: the update was skipped, as a GradScaler does for an
overflowing fp16 step when no loss scale is logged to excuse it). Non-finite grad norms at the
first logged steps (at most 16: a GradScaler halves its scale from 2**16 at each skip) with
the loss finite there and no higher after are a note: the scaler finding its scale, a
hypothesis the log cannot show without a loss scale.

A NaN tail that memory or step-time readings share from the same step is missing data (a
record padded with "nan" after the run stopped), not a numerical NaN: it is noted, not reported.
Likewise a short non-finite stretch of the grad norm where the fp16 loss scale dropped is the
scaler skipping an overflowing step: noted, not reported.

A trainer that counts the iterations whose loss was non-finite and skips them (Megatron's
``number of nan iterations``, the canonical ``nan_iters``) logs a loss that never shows them:
its line averages the iterations it kept. Those counts are a finding of their own (metric
``nan_iters``): critical, fatal where every iteration of ``persist_points`` intervals in a row
was counted.

The measures of its finding kinds are declared in :mod:`forensics.measures`.
"""

from __future__ import annotations

import numpy as np

from forensics.evidence import Evidence
from forensics.evidence.spike_context import overlaps
from forensics.evidence.trend_utils import num, robust_sigma
from forensics.findings import Finding, FindingKind, MeasureValue, Severity
from forensics.params import NanInfParams
from forensics.schema import (
    GRAD_NORM,
    LOSS,
    LOSS_SCALE,
    LR,
    MEMORY,
    NAN_ITERS,
    OVERFLOW,
    PARAM_NORM,
    STEP_TIME,
    THROUGHPUT,
    VAL_LOSS,
)

_INFRA = (MEMORY, STEP_TIME, THROUGHPUT)


def _label(v: float) -> str:
    return "nan" if np.isnan(v) else ("inf" if v > 0 else "-inf")


def _runs(bad: np.ndarray) -> list[tuple[int, int]]:
    """(first, last) index of each stretch of True."""
    idx = np.flatnonzero(bad)
    if len(idx) == 0:
        return []
    cuts = np.flatnonzero(np.diff(idx) > 1) + 1
    return [(int(g[0]), int(g[-1])) for g in np.split(idx, cuts)]


def _eval_note(ev: Evidence) -> None:
    """A note for a validation loss that is NaN / Inf at some evals: the train/val checks
    leave those evals out, and the reader is told where (it had gone unsaid). The train
    loss is what training runs on; an eval that gives NaN points at the evaluation (an fp16
    overflow there, an empty eval set), so it is a note, not a finding."""
    if not ev.has(VAL_LOSS):
        return
    s = ev.logged(VAL_LOSS)
    bad = s.steps[~np.isfinite(s.values)]
    if not len(bad):
        return
    shown = ", ".join(f"{int(t):,}" for t in bad[:5]) + (", ..." if len(bad) > 5 else "")
    ev.run.note(
        f"nan_inf: the validation loss is non-finite at {len(bad):,} of {len(s.steps):,} "
        f"evals (step {shown}), left out of the train/val checks: check the evaluation at "
        "those steps (an fp16 overflow in it, an empty eval set)"
    )


# Series whose non-finite points no finding reports; each check reads only the finite ones.
_QUIET = ((LR, "learning rate"), (PARAM_NORM, "param norm"), (LOSS_SCALE, "loss scale"))
# Norms cannot be negative: a negative value is a placeholder (-1) or a logging bug.
_NORMS = ((GRAD_NORM, "grad norm"), (PARAM_NORM, "param norm"))


def _counted(n: int, one: str, many: str | None = None) -> str:
    """``1 non-finite point``, ``3 non-finite points``."""
    return f"{n:,} {one if n == 1 else many or one + 's'}"


def _steps(steps: np.ndarray) -> str:
    """``step 1,000`` or ``steps 1,000, 1,001, ...`` (the first five)."""
    shown = ", ".join(f"{int(t):,}" for t in steps[:5]) + (", ..." if len(steps) > 5 else "")
    return f"step {shown}" if len(steps) == 1 else f"steps {shown}"


def _series_notes(ev: Evidence) -> None:
    """Notes for values no finding reports and the checks pass over without a word: a
    non-finite learning rate, param norm or loss scale (each check reads the finite points
    only), and a negative grad or param norm, which no norm can be (kept as logged: the checks
    judge it as a low value)."""
    for metric, name in _QUIET:
        if not ev.has(metric):
            continue
        s = ev.logged(metric)
        bad = s.steps[~np.isfinite(s.values)]
        if len(bad):
            ev.run.note(
                f"nan_inf: the {name} is non-finite at {len(bad):,} of {len(s.steps):,} logged "
                f"points ({_steps(bad)}), left out of the checks that read it"
            )
    for metric, name in _NORMS:
        if not ev.has(metric):
            continue
        s = ev.logged(metric)
        neg = s.steps[s.values < 0]
        if len(neg):
            ev.run.note(
                f"nan_inf: the {name} is negative at {len(neg):,} of {len(s.steps):,} logged "
                f"points ({_steps(neg)}), which no norm can be: a placeholder or a "
                "logging bug; they are kept as logged, so check what the trainer writes there"
            )


def _padding_tail(ev: Evidence, metric: str, from_step: int) -> str | None:
    """An infrastructure series finite before ``from_step`` and non-finite from it on."""
    for other in _INFRA:
        if other == metric or not ev.has(other):
            continue
        s = ev.logged(other)
        t, v = s.steps, s.values
        before, after = v[t < from_step], v[t >= from_step]
        if len(after) and np.isfinite(before).any() and not np.isfinite(after).any():
            return other
    return None


_LEVEL_POINTS = 20  # finite loss points each side of isolated non-finite steps


def _loss_level(
    ev: Evidence, first_bad: int, last_bad: int
) -> tuple[float | None, float | None, bool | None]:
    """The loss before ``first_bad`` and after ``last_bad`` (medians of the finite points each
    side, up to :data:`_LEVEL_POINTS`), and whether it came back to its level: no higher than
    before by more than three times the noise of such a median (or 1% of the level). A loss
    back at its level after isolated NaN steps had its update skipped (or only its logged value
    was bad): nothing to roll back. (None where either side has fewer than 5 points.)"""
    if not ev.has(LOSS):
        return None, None, None
    s = ev.logged(LOSS)
    ok = np.isfinite(s.values)
    t, v = s.steps[ok], s.values[ok]
    pre, post = v[t < first_bad][-_LEVEL_POINTS:], v[t > last_bad][:_LEVEL_POINTS]
    if len(pre) < 5 or len(post) < 5:
        return None, None, None
    before, after = float(np.median(pre)), float(np.median(post))
    sigma = robust_sigma(pre)
    tol = max(3.0 * 1.2533 * sigma * np.sqrt(1 / len(pre) + 1 / len(post)), 0.01 * abs(before))
    return before, after, bool(after - before <= tol)


_START_AFTER = 5  # finite loss points after a start-up stretch the loss level is read from
# GradScaler starts at 2**16 and halves the scale at each skipped step: 16 skips reach 1.
_START_MAX_POINTS = 16


def _skipped_at_start(
    ev: Evidence, t: np.ndarray, v: np.ndarray, r: tuple[int, int]
) -> tuple[float, float] | None:
    """A stretch of non-finite grad norms at the first logged steps whose updates were skipped:
    at most :data:`_START_MAX_POINTS` points, finite again after it for at least
    :data:`_START_AFTER` points, the loss logged and finite at those steps and, over the next
    :data:`_START_AFTER` finite points, no higher than there (by 1% or three times the
    noise). An applied non-finite update would make the next loss non-finite, a huge finite
    one would make it jump. Returns the loss's median at those steps and after; None when
    the stretch is not that."""
    n_bad = r[1] - r[0] + 1
    if r[0] != 0 or n_bad > _START_MAX_POINTS or len(v) - r[1] - 1 < _START_AFTER:
        return None
    if not np.isfinite(v[r[1] + 1 : r[1] + 1 + _START_AFTER]).all() or not ev.has(LOSS):
        return None
    s = ev.logged(LOSS)
    at = (s.steps >= t[r[0]]) & (s.steps <= t[r[1]])
    during = s.values[at]
    if len(during) == 0 or not np.isfinite(during).all():
        return None
    later = s.values[s.steps > t[r[1]]][: 4 * _START_AFTER]
    later = later[np.isfinite(later)][:_START_AFTER]
    if len(later) < _START_AFTER:
        return None
    before, after = float(np.median(during)), float(np.median(later))
    noise = robust_sigma(later) if len(later) >= 3 else 0.0
    if after - before > max(3.0 * noise, 0.01 * abs(before)):
        return None
    return before, after


def _level_text(
    before: float | None, after: float | None, back: bool | None, since: str, harmless: str
) -> str:
    """The sentence's clause on the loss level around isolated non-finite steps (see
    :func:`_loss_level`): back at it (and why that is harmless), or not; nothing unmeasured."""
    if back is None or before is None or after is None:
        return ""
    levels = f"({num(before)} before, {num(after)} after, medians of {_LEVEL_POINTS} points)"
    if back:
        return f"; the loss is back at its level {since} {levels}: {harmless}"
    return f"; the loss did not come back to its level {levels}"


class NanInfDetector:
    """The first NaN / Inf in the loss and in the grad norm."""

    name = "nan_inf"

    def __init__(self, params: NanInfParams | None = None) -> None:
        self.params = params or NanInfParams()

    def detect(self, ev: Evidence) -> list[Finding]:
        run = ev.run
        present = [m for m in self.params.metrics if run.has(m)]
        counted = run.has(NAN_ITERS)
        if not present and not counted:
            run.note("nan_inf: not run, the log has neither a loss nor a grad-norm series")
            return []
        out = []
        for metric in present:
            f = self._one(ev, metric)
            if f is not None:
                out.append(f)
        if counted:
            f = self._counted(ev)
            if f is not None:
                out.append(f)
        _eval_note(ev)
        _series_notes(ev)
        return out

    def _counted(self, ev: Evidence) -> Finding | None:
        """Iterations the trainer counted as having a NaN / Inf loss and skipped (Megatron's
        "number of nan iterations", a count over the logging interval ending at each line).
        The logged loss is the mean over the iterations it kept, so its curve never shows
        them. Fatal where every iteration of ``persist_points`` or more intervals in a row was
        counted (nothing was trained there); critical otherwise, as isolated non-finite steps."""
        s = ev.logged(NAN_ITERS)
        t, c = s.steps, s.values
        if len(t) == 0:
            return None
        counted = np.where(np.isfinite(c), c, 0.0)
        bad = counted > 0
        runs = _runs(bad)
        if not runs:
            return None
        # Iterations in each line's interval: from the line before (the first line's as its
        # next one's; a lone line's unknown).
        iv = np.diff(t).astype(float)
        iters = np.concatenate([iv[:1], iv]) if len(iv) else np.full(1, np.nan)
        full = bad & (counted >= iters)  # every iteration of the interval counted
        persistent = [r for r in _runs(full) if r[1] - r[0] + 1 >= self.params.persist_points]
        first, last = runs[0]
        total = int(counted.sum())
        covered = float(np.nansum(iters))
        last_bad = int(t[runs[-1][1]])
        measures: dict[str, MeasureValue] = {
            "first_bad_step": int(t[first]),
            "first_bad_value": "nan",  # (the count does not say NaN or Inf)
            "last_finite_step": int(t[first - 1]) if first > 0 else None,
            "last_finite_value": float(counted[first - 1]) if first > 0 else None,
            "bad_points": total,
            "last_bad_step": last_bad,
            "bad_runs": len(runs),
            "first_run_points": last - first + 1,
            "recovered_step": int(t[last + 1]) if last + 1 < len(t) else None,
            "persistent": bool(persistent),
            "persistent_from": int(t[persistent[0][0]]) if persistent else None,
            "bad_fraction": float(total / covered) if covered > 0 else float(bad.mean()),
            "loss_before": None,
            "loss_after": None,
            "loss_back": None,
        }
        lines = int(bad.sum())
        its = "iteration" if total == 1 else "iterations"
        where = (
            f"in the logging interval ending at step {int(t[first]):,}"
            if lines == 1
            else f"in {lines:,} logging intervals from the one ending at step {int(t[first]):,} "
            f"to the one ending at step {last_bad:,}"
        )
        hidden = (
            "the trainer skipped them, and the logged loss, a mean over the iterations it kept, "
            "does not show them"
        )
        if persistent:
            p0, p1 = persistent[0][0], persistent[-1][1]
            end = int(t[p1])
            measures["last_bad_step"] = end
            summary = (
                f"Every iteration had a NaN or Inf loss in the logging intervals ending at steps "
                f"{int(t[p0]):,} to {end:,} ({int(counted[p0 : p1 + 1].sum()):,} iterations): the "
                "trainer skipped them all, so nothing was trained there"
                + ("" if p1 < len(t) - 1 else ", to the end of the log")
                + f"; {total:,} such {its} in all"
                + (
                    ""
                    if p0 == first
                    else f", the first in the interval ending at step {int(t[first]):,}"
                )
                + "."
            )
            sev = Severity.FATAL
        else:
            end = last_bad
            lv_before, lv_after, back = _loss_level(
                ev, int(t[first - 1]) + 1 if first else int(t[0]), last_bad
            )
            measures.update(loss_before=lv_before, loss_after=lv_after, loss_back=back)
            level = _level_text(
                lv_before,
                lv_after,
                back,
                "after them",
                "their updates were skipped, so the weights were not harmed",
            )
            summary = f"The loss was NaN or Inf on {total:,} {its} {where}: {hidden}{level}."
            sev = Severity.CRITICAL
        return self._finding(NAN_ITERS, sev, int(t[first]), end, summary, measures)

    def _one(self, ev: Evidence, metric: str) -> Finding | None:
        run = ev.run
        s = ev.logged(metric)  # NaN and Inf included: they are what this detector reads
        t, v = s.steps, s.values
        bad = ~np.isfinite(v)
        runs = _runs(bad)
        if not runs:
            return None
        if runs[-1][1] == len(v) - 1:
            shared = _padding_tail(ev, metric, int(t[runs[-1][0]]))
            if shared:
                run.note(
                    f"nan_inf: {metric} is non-finite from step {int(t[runs[-1][0]]):,} to the "
                    f"end, and so is {shared}: read as missing values after the run stopped, "
                    "not as a numerical NaN"
                )
                bad[runs[-1][0] :] = False
                runs = runs[:-1]
                if not runs:
                    return None
        if metric == GRAD_NORM and (run.has(LOSS_SCALE) or run.has(OVERFLOW)):
            # fp16: the step whose gradients overflowed logs an inf / nan grad norm and is skipped
            # by the loss scaler. Short stretches at a scale drop are the scaler at work.
            windows = ev.drop_windows
            excused = [
                r
                for r in runs
                if r[1] - r[0] + 1 < self.params.persist_points
                and r[1] < len(v) - 1
                and all(overlaps(windows, t[i] - 1, t[i] + 1) for i in range(r[0], r[1] + 1))
            ]
            if excused:
                n_pts = sum(r[1] - r[0] + 1 for r in excused)
                run.note(
                    f"nan_inf: the grad norm is non-finite at {n_pts} step(s) where the loss scale "
                    "dropped (overflowing steps the fp16 scaler skipped); not reported"
                )
                for r in excused:
                    bad[r[0] : r[1] + 1] = False
                runs = [r for r in runs if r not in excused]
                if not runs:
                    return None
        start = None
        if (
            metric == GRAD_NORM
            and runs[0][0] == 0
            and not (run.has(LOSS_SCALE) or run.has(OVERFLOW))
        ):
            start = _skipped_at_start(ev, t, v, runs[0])
            if start is not None and len(runs) > 1:
                # (the rest judged on their own; the start said in the notes)
                r = runs[0]
                run.note(
                    f"nan_inf: the grad norm is non-finite at the first {r[1] + 1} logged "
                    f"step(s) ({int(t[0]):,}-{int(t[r[1]]):,}) and the loss did not follow: "
                    "updates skipped while an fp16 loss scaler finds its scale (no loss scale "
                    "is logged to show it); judged apart from the later stretches"
                )
                bad[: r[1] + 1] = False
                runs, start = runs[1:], None
        first, last = runs[0]
        # A stretch at the very end persists: without a loss scaler a non-finite gradient makes
        # the weights non-finite at the next update. With a dynamic loss scale logged (fp16),
        # the scaler skips such steps, so a short stretch there is not known to persist: the
        # log ends too soon to tell (a live run's last line, read by watch, is one poll from
        # the next, which may be finite).
        skippable = run.has(LOSS_SCALE) or run.has(OVERFLOW)
        persistent = [
            r
            for r in runs
            if r[1] - r[0] + 1 >= self.params.persist_points
            or (r[1] == len(v) - 1 and not skippable)
        ]
        prev = first - 1
        measures: dict[str, MeasureValue] = {
            "first_bad_step": int(t[first]),
            "first_bad_value": _label(v[first]),
            "last_finite_step": int(t[prev]) if prev >= 0 else None,
            "last_finite_value": float(v[prev]) if prev >= 0 else None,
            "bad_points": int(bad.sum()),
            "bad_runs": len(runs),
            "first_run_points": last - first + 1,
            "recovered_step": int(t[last + 1]) if last + 1 < len(v) else None,
            "persistent": bool(persistent),
            "persistent_from": int(t[persistent[0][0]]) if persistent else None,
            "bad_fraction": float(bad.sum() / len(v)),
            "loss_before": None,  # (measured for isolated steps only, below)
            "loss_after": None,
            "loss_back": None,
        }
        name = "loss" if metric == LOSS else "grad norm"
        measures["skipped_at_start"] = start is not None
        if start is not None:
            loss_during, loss_later = start
            measures.update(
                loss_before=loss_during, loss_after=loss_later, loss_back=True, persistent=False
            )
            measures["persistent_from"] = None
            measures["last_bad_step"] = int(t[last])
            n_bad = last - first + 1
            summary = (
                f"The grad norm is {_label(v[first])} at the first {n_bad:,} logged step(s) "
                f"({int(t[first]):,}-{int(t[last]):,}) and finite from step "
                f"{int(t[last + 1]):,} on, while the loss was finite there and did not rise "
                f"after ({num(loss_during)} at those steps, {num(loss_later)} over the next "
                f"{_START_AFTER} points): updates skipped at the start of training, as a "
                "dynamic fp16 loss scaler skips them while it lowers its scale from 65,536 "
                "(a hypothesis: the log has no loss scale to show it). The weights were not "
                "harmed; skips that go on past the first steps would need a look."
            )
            return self._finding(
                metric, Severity.INFO, int(t[first]), int(t[last]), summary, measures
            )
        if persistent:
            # The extent is from the first persistent stretch to the end of the last one: a few
            # finite points in between do not end it, and the text counts them.
            p0, p1 = persistent[0][0], persistent[-1][1]
            end = int(t[p1])
            span_bad = int(bad[p0 : p1 + 1].sum())
            span_n = p1 - p0 + 1
            finite = t[p0 : p1 + 1][~bad[p0 : p1 + 1]]
            measures["last_bad_step"] = end
            to_end = p1 == len(v) - 1
            tail = (
                f"to the end of the log (step {end:,})"
                if to_end
                else f"to step {end:,}, finite again from step {int(t[p1 + 1]):,}"
            )
            if len(finite) == 0:
                count = (
                    "its one logged point is"
                    if span_n == 1
                    else f"all {span_n:,} logged points are"
                )
            else:
                where = ", ".join(f"{int(x):,}" for x in finite[:3]) + (
                    " ..." if len(finite) > 3 else ""
                )
                steps_word = "step" if len(finite) == 1 else "steps"
                count = (
                    f"{span_bad:,} of the {span_n:,} logged points (finite only at "
                    f"{steps_word} {where}) are"
                )
            after = "; no usable values after that" if to_end and len(finite) == 0 else ""
            first_text = (
                f"The {name} is {_label(v[first])} from step {int(t[first]):,}"
                if p0 == first
                else f"The {name} is first {_label(v[first])} at step {int(t[first]):,}, "
                f"and non-finite from step {int(t[p0]):,}"
            )
            sev, level = Severity.FATAL, ""
            if not to_end:
                # Finite again after the stretch, and the loss back at its level: the run got
                # over it by itself (a scaler skipping steps, bad values logged), which is not
                # the red light's divergence that does not recover. Judged as isolated steps
                # are: critical for the loss, a warning for a grad norm the loss did not follow.
                lv_before, lv_after, back = _loss_level(ev, int(t[first]), end)
                if back is True:
                    measures.update(loss_before=lv_before, loss_after=lv_after, loss_back=back)
                    level = _level_text(
                        lv_before,
                        lv_after,
                        back,
                        "after it",
                        "the run got over it by itself, so this is not a divergence that does "
                        "not recover (nothing to roll back)",
                    )
                    sev = Severity.WARNING if metric == GRAD_NORM else Severity.CRITICAL
            summary = f"{first_text} {tail}: {count} non-finite{after}{level}."
            if span_n == 1 and to_end and p0 == first:
                # (one point, the log's last: "from step 9,000 to the end of the log (step
                # 9,000): all 1 logged points are non-finite" said it three times over)
                summary = (
                    f"The {name} is {_label(v[first])} at step {int(t[first]):,}, the last "
                    "step logged: nothing finite after it."
                )
        else:
            end = int(t[last])
            last_bad = int(t[runs[-1][1]])
            measures["last_bad_step"] = last_bad
            lv_before, lv_after, back = _loss_level(ev, int(t[first]), last_bad)
            measures.update(loss_before=lv_before, loss_after=lv_after, loss_back=back)
            level = _level_text(
                lv_before,
                lv_after,
                back,
                "after it",
                "the update was skipped or only the logged value was bad, so the weights were "
                "not harmed",
            )
            rec = measures["recovered_step"]
            open_tail = runs[-1][1] == len(v) - 1
            too_soon = "the log ends there, too soon to tell whether it persists"
            again = (
                f": the last logged step{'s' if last > first else ''}; {too_soon}"
                if rec is None
                else f", finite again at step {int(rec):,}"
                + (
                    f"; non-finite again from step {int(t[runs[-1][0]]):,}, and {too_soon}"
                    if open_tail
                    else ""
                )
            )
            summary = (
                f"The {name} is {_label(v[first])} at step {int(t[first]):,} "
                f"({_counted(int(bad.sum()), 'non-finite point')} in "
                f"{_counted(len(runs), 'stretch', 'stretches')})"
                f"{again}{level}."
            )
            # The article's orange light is a non-finite loss. A grad norm non-finite at
            # isolated steps that the loss did not follow (back at its level after them) is a
            # transient judged by the loss, as an absorbed grad-norm outlier is: a warning.
            absorbed = metric == GRAD_NORM and back is True
            sev = Severity.WARNING if absorbed else Severity.CRITICAL
        return self._finding(metric, sev, int(t[first]), end, summary, measures)

    def _finding(
        self,
        metric: str,
        sev: Severity,
        first: int,
        end: int,
        summary: str,
        measures: dict[str, MeasureValue],
    ) -> Finding:
        """A nan_inf finding from its first non-finite step (its onset and peak) to ``end``."""
        return Finding(
            FindingKind.NAN_INF,
            sev,
            metric,
            first,
            summary,
            first,
            end,
            measures,
            judged_against={"persist_points": self.params.persist_points},
        )
