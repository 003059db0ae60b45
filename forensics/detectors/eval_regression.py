"""eval_regression: an eval metric getting worse while the training loss keeps improving.

The article opens with it: the loss fell smoothly, yet a benchmark checked at step 8000 was
about three points below its step-6000 score (section 3.1). For each ``eval/<name>`` series
the best smoothed score is found; when the evals after it are worse by more than the eval's
own noise and a small relative margin, and the train loss kept falling over that stretch,
it is a warning. It becomes critical when a grad-norm drift overlaps it, the combination the
article traced to its root cause. Direction comes from :func:`forensics.schema.lower_is_better`
(WER, CER, perplexity: lower is better).

Held-out losses (``val_loss`` and each eval set's ``eval/<set>_loss``) are not scores here: the
train/val checks judge them (overfitting, val_shift, gap_acceleration), and a perplexity that
restates one of them (``eval/perplexity``, ``eval/<set>_ppl``) is noted and skipped.

The measures of its finding kinds are declared in :mod:`forensics.measures`.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import numpy as np

from forensics.evidence import Evidence
from forensics.evidence.trend_utils import (
    hinge_onset,
    robust_sigma,
    rolling_median,
    sig,
    theil_sen,
)
from forensics.findings import Finding, FindingKind, Severity
from forensics.params import EvalRegressionParams
from forensics.schema import EVAL_PREFIX, LOSS, held_out_set, lower_is_better

if TYPE_CHECKING:
    from forensics.detectors.drift import DriftResult

CHECK = "eval_regression"
# Eval entries that are counters or timings, not quality scores.
_NOT_A_SCORE = re.compile(
    r"(runtime|per_second|samples|num_tokens|tokens|epoch_?$|step|time|entropy)", re.I
)
_PERPLEXITY = re.compile(r"^(?:(?P<set>.+?)_)??(?:epoch_)?(?:perplexity|ppl)$", re.I)


def _restates(name: str, held_out: set[str | None]) -> bool:
    """Whether eval/<name> is the perplexity of a held-out loss the run logs ("" = val_loss)."""
    m = _PERPLEXITY.match(name)
    return m is not None and (m.group("set") or "") in held_out


class EvalRegressionDetector:
    """Flags eval scores that worsen while the train loss still falls."""

    name = CHECK

    def __init__(self, params: EvalRegressionParams | None = None) -> None:
        self.params = params or EvalRegressionParams()

    def detect(self, ev: Evidence) -> list[Finding]:
        run = ev.run
        metrics = run.metrics()
        # Held-out losses (eval/<set>_loss) are the train/val checks': overfitting, val_shift
        # and gap_acceleration judge each one. Scores (accuracy, BLEU, WER ...) are judged here.
        names = [
            m
            for m in metrics
            if m.startswith(EVAL_PREFIX)
            and not _NOT_A_SCORE.search(m[len(EVAL_PREFIX) :])
            and held_out_set(m) is None
        ]
        restated: list[str] = []
        held_out = {held_out_set(m) for m in metrics if held_out_set(m) is not None}
        if held_out:
            # A perplexity is exp(a held-out loss) the train/val checks already read: the bare
            # one restates val_loss, eval/<set>_ppl restates eval/<set>_loss.
            restated = [m for m in names if _restates(m[len(EVAL_PREFIX) :], held_out)]
            for m in restated:
                run.note(
                    f"{CHECK}: {m} not checked, it restates a held-out loss "
                    "(see the train/val checks)"
                )
            names = [m for m in names if m not in restated]
        if not names:
            losses = sorted(
                m for m in metrics if m.startswith(EVAL_PREFIX) and held_out_set(m) is not None
            )
            if restated:
                why = "its only eval metrics restate val_loss"
            elif losses:
                # (multi_eval_sets logs eval/idlelib_loss: "no eval metric" beside a finding on
                # it read as a contradiction)
                shown = ", ".join(losses[:3]) + (" ..." if len(losses) > 3 else "")
                why = (
                    f"the run's eval metrics are held-out losses ({shown}), which the train/val "
                    "checks judge; no score (accuracy, BLEU, WER ...) to check"
                )
            else:
                why = "the run logged no eval metric (eval/<name>)"
            run.note(f"{CHECK}: not run, {why}")
            return []
        out: list[Finding] = []
        for metric in names:
            f = self._one(ev, metric)
            if f is not None:  # the drift analysis is the evidence's, shared by every metric
                out.append(self._finish(f, ev.drift))
        return out

    def _one(self, ev: Evidence, metric: str) -> dict[str, Any] | None:
        p = self.params
        s = ev.series(metric)
        x, y = s.steps, s.values
        if len(x) < p.min_evals:
            ev.run.note(f"{CHECK}: {metric} not checked, only {len(x)} evals (need {p.min_evals})")
            return None
        lower = lower_is_better(metric)
        score = -y if lower else y  # work on "higher is better"
        smooth = rolling_median(score, 3)
        best_i = int(np.argmax(smooth))
        # The median of three lags a sharp peak by one eval: take the raw best next to it.
        lo, hi = max(0, best_i - 1), min(len(x), best_i + 2)
        best_i = lo + int(np.argmax(score[lo:hi]))
        after = len(x) - 1 - best_i
        if after < p.min_evals_after:
            return None
        n_now = min(3, after)
        now = float(np.median(score[-n_now:]))
        best = float(smooth[best_i])
        drop = best - now
        noise = robust_sigma(score)
        margin = max(p.noise_k * noise, p.min_rel_drop * abs(best))
        if drop <= margin:
            return None
        # The later evals must really be worse, not a single dip: their trend must not recover.
        tail = theil_sen(x[best_i:], score[best_i:])
        if tail is not None and tail.slope > 0:
            return None
        loss = ev.series(LOSS)
        lx, ly = loss.steps, loss.values
        sel = (lx >= x[best_i]) & ev.despiked(LOSS)  # despike(ly)
        loss_change = None
        if sel.sum() >= 3:
            ls = theil_sen(lx[sel], ly[sel])
            if ls is not None:
                if ls.rising:
                    return None  # the train loss is worse too: divergence territory, not this kind
                start = ls.intercept + ls.slope * x[best_i]
                loss_change = (
                    100.0 * ls.slope * float(lx[sel][-1] - x[best_i]) / abs(start)
                    if start
                    else None
                )
        worst_i = best_i + int(np.argmin(score[best_i:]))
        # Where it turned: a score that held flat has its best at a noise peak anywhere on the
        # flat (step 2,000 of a benchmark flat at 62 until 6,000), and the slide begins where
        # the flat ends: the knot of a two-piece line bending down (an eval step, with the
        # steps it cannot be told from), when that lies after the best.
        # Else it turned after its best eval, at or before the next one: evals are all the
        # log has of it, so the onset is known only to that interval (the article's case: a
        # benchmark at its best at step 6,000 and lower at 6,500, the grad norm climbing from
        # 6,480; with the onset pinned to 6,000 the causes read that climb as coming after).
        turn_i = best_i
        turn_range: tuple[int, int] | None = (int(x[best_i]), int(x[best_i + 1]))
        h = hinge_onset(x.astype(float), -score)
        if h is not None and h.after > h.before:
            k = int(np.searchsorted(x, h.onset, side="right")) - 1
            if best_i < k <= worst_i:
                turn_i, turn_range = k, (h.lo, h.hi)
        sign = -1.0 if lower else 1.0
        return {
            "metric": metric,
            "start": int(x[turn_i]),
            "range": turn_range,
            "peak": int(x[worst_i]),
            "end": int(x[-1]),
            "m": {
                "direction": "lower_is_better" if lower else "higher_is_better",
                "best": sign * best,
                "best_step": int(x[best_i]),
                "best_logged": float(y[best_i]),
                "turn_step": int(x[turn_i]),
                "current": sign * now,
                "current_evals": n_now,
                "last_value": float(y[-1]),
                "worst": float(y[worst_i]),
                "worst_step": int(x[worst_i]),
                "drop": drop,
                "drop_pct": 100.0 * drop / abs(best) if best else None,
                "noise": noise,
                "evals_after_best": after,
                "loss_change_pct": loss_change,
            },
            "judged": {
                "best": sign * best,
                "noise": noise,
                "noise_k": p.noise_k,
                "min_rel_drop": p.min_rel_drop,
                # a score past this line (below it, or above for lower-is-better) is a regression
                "regression_at": sign * (best - margin),
            },
        }

    def _finish(self, f: dict[str, Any], drift: DriftResult | None) -> Finding:
        m = f["m"]
        overlap = bool(
            drift is not None
            and drift.alarming  # a climb the LR schedule explains does not count
            and drift.onset_step <= f["end"]
            and drift.end_step >= f["start"]
        )
        m["grad_norm_drift"] = overlap
        judged = dict(f["judged"])
        if overlap and drift is not None:
            judged["drift_onset_step"] = drift.onset_step
            judged["drift_end_step"] = drift.end_step
        loss_txt = (
            "the train loss was not logged"
            if m["loss_change_pct"] is None
            else f"the train loss moved {m['loss_change_pct']:+.1f}%"
        )
        pct = f", {m['drop_pct']:.1f}% worse," if m["drop_pct"] is not None else ""
        # Both ends are medians of three evals (one lucky or unlucky eval decides nothing); where
        # a median is not the value logged at its step, the sentence gives that value too.
        best, logged = sig(m["best"], 4), sig(m["best_logged"], 4)
        best_txt = (
            f"{best} at step {m['best_step']:,}"
            if best == logged
            else f"{best} around step {m['best_step']:,} (the median of 3 evals; {logged} "
            "logged there)"
        )
        now, last = sig(m["current"], 4), sig(m["last_value"], 4)
        now_txt = (
            now
            if now == last
            else f"{now} (the median of the last {m['current_evals']}; {last} at step {f['end']:,})"
        )
        if m["turn_step"] > m["best_step"]:
            # (held flat: the best is one of the evals on the flat, the slide begins after it)
            of3 = "" if best == logged else f", the median of 3 evals; {logged} logged there"
            moved = (
                f"held near its best ({best} at step {m['best_step']:,}{of3}) until step "
                f"{m['turn_step']:,}, then slipped"
            )
        else:
            moved = f"slipped from {best_txt}"
        summary = f"{f['metric']} {moved} to {now_txt}{pct} while {loss_txt}" + (
            "; the grad norm drifts up over the same stretch." if overlap else "."
        )
        return Finding(
            kind=FindingKind.EVAL_REGRESSION,
            severity=Severity.CRITICAL if overlap else Severity.WARNING,
            metric=f["metric"],
            start_step=f["start"],
            peak_step=f["peak"],
            end_step=f["end"],
            onset_range=f["range"],
            measures=m,
            summary=summary,
            judged_against=judged,
        )
