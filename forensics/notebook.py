"""Notebook display: a diagnosis shows itself in Jupyter, and a run's frame is at hand.

``forensics.analyze(path)`` in a cell shows the verdict, the findings (worst first, with
their prescriptions) and one chart per vital sign with the findings marked: the same figures
as the HTML report (:mod:`forensics.report.charts`), drawn in the cell, no file written.

plotly.js (about 5 MB) is inlined into the first output of the kernel only (``"once"``, as
plotly's own notebook mode does), so the charts work on an air-gapped cluster and later
outputs stay small; ``forensics.notebook.options.plotlyjs`` also takes ``"inline"`` (every
output, for outputs copied elsewhere) and ``"cdn"`` (nothing inlined, needs the network).

The run's frame: ``diagnosis.frame`` (polars), ``diagnosis.to_arrow()`` (a pyarrow Table)
and ``diagnosis.to_pandas()`` (pandas through Arrow, with Arrow-backed columns so NaN and
null stay distinct); the same on a :class:`~forensics.run.Run`.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import jinja2
    import pandas as pd
    import polars as pl
    import pyarrow as pa

    from forensics.diagnosis import Diagnosis
    from forensics.run import Run


@dataclass
class Options:
    """Display settings for notebooks."""

    plotlyjs: str = "once"  # "once" (first output of the kernel), "inline" (each) or "cdn"
    max_findings: int = 50  # rows in the findings table; the rest are counted
    buckets: int = 600  # points per chart after min/max decimation


options = Options()
_inlined = False  # plotly.js went out in an earlier output of this kernel ("once")

_TEMPLATE = """\
<div class="forensics-nb" id="{{ uid }}">
<style>
#{{ uid }} { font-family: system-ui, sans-serif; font-size: 13px; }
#{{ uid }} .verdict { padding: 6px 10px; border-left: 6px solid {{ light.colour }};
  background: #f7f7f7; margin-bottom: 6px; }
#{{ uid }} table { border-collapse: collapse; margin: 4px 0; }
#{{ uid }} th, #{{ uid }} td { text-align: left; vertical-align: top; padding: 2px 8px;
  border-bottom: 1px solid #ddd; }
#{{ uid }} .sev { font-weight: 600; }
#{{ uid }} .chart { width: 100%; max-width: 900px; height: 300px; }
</style>
<div class="verdict" data-verdict="{{ verdict }}">
  <strong>{{ run.name }}</strong> ({{ run.format }}, steps {{ "{:,}".format(run.first_step) }}
  to {{ "{:,}".format(run.last_step) }}):
  <strong class="verdict-word">{{ verdict | upper }}</strong> &mdash; {{ light.label }}
</div>
{% if rows %}
<table class="findings">
<thead><tr><th>severity</th><th>kind</th><th>steps</th><th>what happened</th>
<th>what to do</th></tr></thead>
<tbody>
{% for r in rows %}
<tr data-kind="{{ r.kind }}" data-severity="{{ r.severity }}">
<td class="sev" style="color: {{ r.colour }}">{{ r.severity }}</td><td>{{ r.kind }}</td>
<td>{{ r.steps }}</td><td>{{ r.summary }}</td><td>{{ r.prescription }}</td></tr>
{% endfor %}
</tbody></table>
{% if more %}<p class="more">... and {{ more }} more finding(s).</p>{% endif %}
{% else %}
<p class="none">No finding.</p>
{% endif %}
{% for p in panels %}
<div class="panel" data-key="{{ p.key }}">
<div class="chart" id="{{ uid }}-{{ loop.index }}"></div>
<script type="application/json" id="{{ uid }}-{{ loop.index }}-fig">{{ figs[loop.index0] }}</script>
</div>
{% endfor %}
{% if plotlyjs == "inline" %}
<script>if (typeof window.Plotly === "undefined") { {{ plotly_inline }} }</script>
{% elif plotlyjs == "cdn" %}
<script src="{{ cdn_url }}" crossorigin="anonymous"></script>
{% endif %}
<script>
(function () {
  var tries = 0;
  function draw() {
    if (typeof window.Plotly === "undefined") {
      if (++tries < 100) { return setTimeout(draw, 100); }
      document.querySelectorAll("#{{ uid }} .chart").forEach(function (div) {
        div.textContent = "plotly.js is not loaded here: run forensics.notebook.options" +
          ".plotlyjs = 'inline' and show the diagnosis again.";
      });
      return;
    }
    document.querySelectorAll("#{{ uid }} .chart").forEach(function (div) {
      var fig = JSON.parse(document.getElementById(div.id + "-fig").textContent);
      window.Plotly.newPlot(div, fig.data, fig.layout, {displaylogo: false, responsive: true});
    });
  }
  draw();
})();
</script>
</div>
"""


@lru_cache(maxsize=1)
def _template() -> jinja2.Template:
    import jinja2

    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
    return env.from_string(_TEMPLATE)


def _steps(f: Any) -> str:
    if f.end_step is not None and f.end_step != f.start_step:
        return f"{f.start_step:,}-{f.end_step:,}"
    return f"{f.start_step:,}"


def diagnosis_html(diag: Diagnosis, *, plotlyjs: str | None = None) -> str:
    """The notebook view of a diagnosis: verdict, findings, a chart per vital sign."""
    from markupsafe import Markup

    from forensics.findings import look
    from forensics.report.charts import build_panels
    from forensics.report.render import _plotly_cdn, _plotly_inline

    global _inlined
    mode = plotlyjs or options.plotlyjs
    if mode not in ("once", "inline", "cdn"):
        raise ValueError(f"plotlyjs must be 'once', 'inline' or 'cdn', not {mode!r}")
    if mode == "once":
        mode = "none" if _inlined else "inline"
        _inlined = True
    ranked = diag.ranked()
    rows = [
        {
            "kind": f.kind.value,
            "severity": f.severity.value,
            "colour": look(f.severity.value).colour,
            "steps": _steps(f),
            "summary": f.summary,
            "prescription": diag.prescription_for(f),
        }
        for f in ranked[: options.max_findings]
    ]
    panels = build_panels(diag.ev, diag.findings, buckets=options.buckets)
    return _template().render(
        uid=f"forensics-{uuid.uuid4().hex[:12]}",
        run=diag.run,
        verdict=diag.verdict,
        light=look(diag.verdict),
        rows=rows,
        more=max(0, len(ranked) - options.max_findings),
        panels=panels,
        # figure_json escapes <, > and &: safe inside a script element.
        figs=[Markup(p.json()) for p in panels],
        plotlyjs=mode,
        plotly_inline=Markup(_plotly_inline()) if mode == "inline" else "",
        cdn_url=_plotly_cdn()[0] if mode == "cdn" else "",
    )


def to_polars(run: Run) -> pl.DataFrame:
    """The run's canonical long frame (every row, restarts included)."""
    return run.frame


def to_arrow(run: Run) -> pa.Table:
    """The run's frame as a pyarrow Table (zero-copy where polars allows)."""
    return run.frame.to_arrow()


def to_pandas(run: Run) -> pd.DataFrame:
    """The run's frame as pandas, through Arrow: Arrow-backed dtypes keep nulls apart from NaN."""
    try:
        import pandas as pd
    except ImportError as exc:  # pragma: no cover - depends on the environment
        from forensics.errors import ForensicsError

        raise ForensicsError(
            "to_pandas needs pandas and pyarrow: pip install 'forensics[notebook]'"
        ) from exc
    return to_arrow(run).to_pandas(types_mapper=pd.ArrowDtype)
