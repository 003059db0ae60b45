"""Render a Diagnosis into one self-contained HTML page.

Jinja with ``autoescape=True`` and ``StrictUndefined``: every metric name, tag, run name and
note comes from a log file and is untrusted, so nothing is marked safe except the figure JSON
(escaped by :func:`~forensics.report.charts.figure_json`) and plotly.js itself.
"""

from __future__ import annotations

import base64
import datetime as _dt
import hashlib
import re
from dataclasses import replace
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from forensics.findings import (
    LOOKS,
    FindingKind,
    Look,
    Severity,
    finding_steps,
    look,
    notes_in_reading_order,
    onset_at,
    peak_word,
    step_range,
)
from forensics.params import QUICK_RECOVERY_STEPS
from forensics.prescriptions import (
    AREA_TITLES,
    STANDING_GUIDANCE,
    TABLE,
    needs_action,
    reads_as_hard_batch,
)
from forensics.timeline import vital_label

if TYPE_CHECKING:
    import jinja2

    from forensics.diagnosis import Diagnosis

# Metadata keys that identify machines, people or places; dropped by --redact.
_SENSITIVE_KEY = re.compile(
    r"host|node|machine|path|dir|file|cwd|user|email|ip\b|addr|url|cluster|hostname", re.I
)
FULL_FINDINGS = 60  # findings shown as full cards; the rest as table rows
MAX_INCIDENTS = 20  # incidents shown as full cards; the rest as table rows
MAX_ROLLBACKS = 50  # rows in the rollback table
MAX_ROWS = 500  # rows in the long tables (more findings, spikes, timeline events)
# Shape measures shown first in the spike table (article 4.4: height, width, recovery, frequency).
_SPIKE_COLUMNS = (
    "classification",
    "height",
    "height_ratio",
    "ratio_to_run_baseline",
    "width_steps",
    "recovery_steps",
    "plateau_shift_rel",
    "cause",
    "grad_norm_lead_steps",
    "leads_loss_by_steps",
)
# The article's spike classes (physiological, beneficial...) judge the loss. Another metric's
# spike gets the same shape measured, but its table cell names the shape, not a verdict.
_SHAPE_WORDS = {
    "physiological": "back on its trend",
    "pathological": "settled higher or slow",
    "beneficial": "settled lower",
    "unresolved": "high at the log's end",
    "diverged": "diverged",
}
# Absolute paths (POSIX, home-relative, Windows); paths relative to the run folder stay readable.
_PATHLIKE = re.compile(r"(?<![\w.])(?:[A-Za-z]:[\\/]|~[\\/]|/)[^\s'\"<>,;\]\)]*")
# TensorBoard names event files events.out.tfevents.<time>.<host name>[.<pid>.<n>].
_TFEVENTS_HOST = re.compile(r"(events\.out\.tfevents\.\d+\.)[^\s'\"<>,;\]\)]+")


@lru_cache(maxsize=1)
def _env() -> jinja2.Environment:
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("forensics.report", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["num"] = _num
    env.globals["spike_cell"] = spike_cell
    env.filters["steps"] = finding_steps
    env.filters["peak_word"] = peak_word
    env.globals["step_range"] = step_range
    env.globals["onset_at"] = onset_at
    env.globals["vital_label"] = vital_label
    # (a spike back within this many steps passed quickly; up to the recovery limit, slowly)
    env.globals["QUICK_RECOVERY_STEPS"] = QUICK_RECOVERY_STEPS
    env.globals["LOOKS"] = LOOKS  # the one table of lights (base.html's colours come from it)
    return env


def _num(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        if v.is_integer() and abs(v) < 1e15:
            return f"{int(v):,}"
        return f"{v:.4g}"
    return str(v)


def spike_cell(finding: Any, key: str) -> str:
    """One cell of the spike table: the measure, with a non-loss spike's class as its shape."""
    value = finding.measures.get(key)
    if key == "classification" and finding.metric != "loss" and value in _SHAPE_WORDS:
        rec = finding.measures.get("recovery_steps")
        if finding.measures.get("judged_by") == "recovery" and isinstance(rec, int):
            # A transient outlier is judged by its recovery alone: no level after it is
            # measured, so the cell says what was (not "back on its trend" for good).
            return f"back within {rec:,} step{'s' if rec != 1 else ''}"
        if value == "pathological" and finding.measures.get("recovered"):
            # Which of the two: the level it settled at, or the time it took.
            return "settled higher" if finding.measures.get("settled") == "higher" else "slow"
        return _SHAPE_WORDS[value]
    return _num(value)


def redact_text(text: str) -> str:
    """Replace absolute paths and the host names inside event-file names with placeholders."""
    return _TFEVENTS_HOST.sub(r"\1[host]", _PATHLIKE.sub("[path]", text))


@lru_cache(maxsize=1)
def _plotly_inline() -> str:
    from plotly.offline import get_plotlyjs

    return get_plotlyjs()


@lru_cache(maxsize=1)
def _plotly_cdn() -> tuple[str, str]:
    from plotly.offline import get_plotlyjs_version

    digest = hashlib.sha384(_plotly_inline().encode("utf-8")).digest()
    return (
        f"https://cdn.plot.ly/plotly-{get_plotlyjs_version()}.min.js",
        "sha384-" + base64.b64encode(digest).decode(),
    )


def _flatten(d: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.extend(_flatten(v, key + "."))
        else:
            out.append((key, v))
    return out


def _short(v: Any, limit: int = 200) -> str:
    text = v if isinstance(v, str) else repr(v)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _spike_table(findings: list[Any]) -> tuple[list[str], list[Any]]:
    from forensics.report.charts import SPIKE_KINDS

    spikes = [f for f in findings if f.kind in SPIKE_KINDS]
    if len(spikes) > MAX_ROWS:  # keep the most severe, shown in step order
        spikes = sorted(
            sorted(spikes, key=lambda f: (-f.severity.rank, f.start_step))[:MAX_ROWS],
            key=lambda f: f.start_step,
        )
    keys: list[str] = []
    for f in spikes:
        for k in f.measures:
            if k not in keys:
                keys.append(k)
    first = [k for k in _SPIKE_COLUMNS if k in keys]
    return first + sorted(k for k in keys if k not in first), spikes


def _metadata(
    diagnosis: Diagnosis, redact: bool
) -> tuple[list[tuple[str, str]], list[tuple[str, str]], int]:
    run = diagnosis.run
    meta: list[tuple[str, str]] = [
        ("format", run.format),
        ("steps", step_range(run.first_step, run.last_step)),
    ]
    if not redact:
        meta.insert(0, ("path", str(run.path)))
    for key, value in _flatten(run.metadata):
        if key == "checkpoints_said":
            continue  # (said beside the checkpoints' steps)
        if key == "checkpoints" and isinstance(value, list):
            said = " (as the log says)" if run.metadata.get("checkpoints_said") else ""
            value = (
                f"{len(value)} saved{said}: "
                + ", ".join(f"{int(s):,}" for s in sorted(value)[:10])
                + (" …" if len(value) > 10 else "")
            )
        if redact and _SENSITIVE_KEY.search(key):
            continue
        text = _short(value)
        meta.append((key, redact_text(text) if redact else text))
    config = [] if redact else [(k, _short(v)) for k, v in _flatten(run.config)]
    return meta, config, len(_flatten(run.config))


def _light(diagnosis: Diagnosis) -> Look:
    """The verdict's light; a red light whose every rollback has no healthy step to go back
    to (non-finite from the first step) does not ask for a rollback."""
    lk = look(diagnosis.verdict)
    plans = [rb for rb in diagnosis.rollbacks if rb.rollback]
    if diagnosis.verdict == "fatal" and plans and all(rb.nothing_healthy for rb in plans):
        return replace(lk, label="Red light: stop the run; no step of it is known healthy")
    return lk


def build_context(
    diagnosis: Diagnosis, *, plotlyjs: str = "inline", redact: bool = False
) -> dict[str, Any]:
    """Everything the templates need, computed once (templates hold no logic beyond loops)."""
    from forensics.report.charts import SPIKE_KINDS, build_panels

    run = diagnosis.run
    panels = build_panels(diagnosis.ev, diagnosis.findings)
    # Worst first; the notes in reading order (a flood of one kind after the rarer ones).
    ranked = [f for f in diagnosis.ranked() if f.severity is not Severity.INFO]
    ranked += notes_in_reading_order(diagnosis.findings)
    incidents = sorted(diagnosis.incidents, key=lambda i: (-i.severity.rank, i.start_step))
    rollbacks: dict[int, list[Any]] = {}
    for rb in diagnosis.rollbacks:
        rollbacks.setdefault(id(rb.finding), []).append(rb)
    # Findings beyond the first FULL_FINDINGS (worst first) are listed as table rows, not cards.
    items = [
        {
            "f": f,
            "kind": f.kind.value,
            "prescription": diagnosis.prescription_for(f),
            "entry": TABLE.get(f.kind),
            "acts": needs_action(f),
            "rollbacks": rollbacks.get(id(f), []),
            "causes": (causes := diagnosis.causes_for(f)),
            "hard_batch": reads_as_hard_batch(f, causes),
            "incident": diagnosis.incident_of(f),
        }
        for f in ranked[:FULL_FINDINGS]
    ]
    more = ranked[FULL_FINDINGS : FULL_FINDINGS + MAX_ROWS]
    n_hidden = max(0, len(ranked) - FULL_FINDINGS - MAX_ROWS)
    kinds_present = []
    for f in ranked:
        if (
            f.kind in TABLE
            and TABLE[f.kind] not in kinds_present
            and f.severity is not Severity.INFO
        ):
            kinds_present.append(TABLE[f.kind])
    spike_keys, spikes = _spike_table(diagnosis.findings)
    meta, config, n_config = _metadata(diagnosis, redact)
    notes = [redact_text(n) if redact else n for n in run.notes]
    top = run.frame.get_column("segment").max() if run.frame.height else None
    segments = int(top) if isinstance(top, (int, float)) else 0
    unmapped = run.unmapped_tags()
    counts = severity_counts(diagnosis.findings)
    if plotlyjs not in ("inline", "cdn"):
        raise ValueError(f"plotlyjs must be 'inline' or 'cdn', not {plotlyjs!r}")
    cdn_url, cdn_sri = _plotly_cdn() if plotlyjs == "cdn" else ("", "")
    return {
        "run": run,
        "metrics": run.metrics(),
        "redact": redact,
        "verdict": diagnosis.verdict,
        "light": _light(diagnosis),
        "counts": counts,
        "timeline": diagnosis.timeline,
        "order_sentence": diagnosis.order_sentence(limit=3),
        "unjudged": diagnosis.unjudged(),
        "x_unit_note": diagnosis.x_unit_note(),
        # The worst incidents as cards (then by onset), the rest as rows.
        "incidents": incidents[:MAX_INCIDENTS],
        "more_incidents": incidents[MAX_INCIDENTS : MAX_INCIDENTS + MAX_ROWS],
        "n_incidents": len(diagnosis.incidents),
        # An incident card without a rollback ends on its next step, as the terminal does.
        "advice": {
            inc.id: diagnosis.what_to_do(inc.findings)
            for inc in incidents[:MAX_INCIDENTS]
            if inc.rollback is None
        },
        "items": items,
        "more": more,
        "n_hidden": n_hidden,
        "investigation": diagnosis.investigation,
        "area_titles": AREA_TITLES,
        # The earliest events first: going back before the first one covers the later ones.
        "rollbacks": diagnosis.rollbacks[:MAX_ROLLBACKS],
        "n_rollbacks": len(diagnosis.rollbacks),
        "panels": panels,
        "spike_keys": spike_keys,
        "spikes": spikes,
        "n_spikes": sum(1 for f in diagnosis.findings if f.kind in SPIKE_KINDS),
        "n_absorbed": sum(
            len(f.events_at or ())
            for f in diagnosis.findings
            if f.kind is FindingKind.GRAD_NORM_OUTLIERS
        ),
        "max_rows": MAX_ROWS,
        "item_rx": diagnosis.prescription_for,
        "phases": diagnosis.phases,
        "coverage": diagnosis.coverage,
        "kinds_present": kinds_present,
        "standing": STANDING_GUIDANCE,
        "meta": meta,
        "config": config,
        "n_config": n_config,
        "notes": notes,
        "restarts": segments,
        "unmapped": unmapped,
        "plotlyjs": plotlyjs,
        "plotly_inline": _plotly_inline() if plotlyjs == "inline" else "",
        "cdn_url": cdn_url,
        "cdn_sri": cdn_sri,
        "generated": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "version": _version(),
    }


def severity_counts(findings: list[Any]) -> dict[str, int]:
    """Findings per severity, worst first (the banner's and compare's counts)."""
    out = {s.value: 0 for s in sorted(Severity, key=lambda s: -s.rank)}
    for f in findings:
        out[f.severity.value] += 1
    return out


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("forensics")
    except Exception:  # not installed (running from a checkout)
        return "dev"


def render_html(diagnosis: Diagnosis, *, plotlyjs: str = "inline", redact: bool = False) -> str:
    """The report as one HTML page.

    Args:
        diagnosis: what :func:`forensics.diagnosis.diagnose` returned.
        plotlyjs: ``"inline"`` embeds plotly.js once so the page works offline (about 5 MB);
            ``"cdn"`` loads it from cdn.plot.ly (a small file that needs the network).
        redact: leave out paths, host names and config values, for sharing outside the team.
    """
    from markupsafe import Markup

    ctx = build_context(diagnosis, plotlyjs=plotlyjs, redact=redact)
    # plotly.js is our own bundled file, not log data; it contains no "</script".
    ctx["plotly_inline"] = Markup(ctx["plotly_inline"])
    ctx["panel_json"] = [Markup(p.json()) for p in ctx["panels"]]
    return _env().get_template("report.html").render(**ctx)
