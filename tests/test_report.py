"""The HTML report: structure, escaping, redaction, size, downsampling, smoothing, summary."""

from __future__ import annotations

import html
import json
import re
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from synthetic import healthy_grad_norm, healthy_loss, long_frame, run_from_frame

from forensics.diagnosis import diagnose
from forensics.findings import Finding, FindingKind
from forensics.measures import declared
from forensics.report import render_html
from forensics.report.charts import tb_smooth
from forensics.report.downsample import minmax_indices
from forensics.run import Run

EVIL = "<script>alert(1)</script>"
EVIL_IMG = '"><img src=x onerror=alert(2)>'


def full_run(n: int = 6000, name: str = "full", seed: int = 0) -> tuple[Run, list[Finding]]:
    """A run with every vital sign the report plots, a loss spike at 3000, and findings on most
    panels."""
    rng = np.random.default_rng(seed)
    s, loss = healthy_loss(n, seed=seed)
    loss[3000:3006] *= 3.0
    gs, gn = healthy_grad_norm(n, seed=seed + 1)
    gn[3000:3003] *= 6.0
    lr = 3e-4 * np.minimum(1.0, (s + 1) / 300) * (0.55 + 0.45 * np.cos(np.pi * s / n))
    scale = np.where(s < 3000, 2.0**16, 2.0**14)
    vs = np.arange(0, n, 250)
    es = np.arange(0, n, 1000)
    ts = np.arange(0, n, 10)
    tput = np.where(ts < 4500, 12000.0, 8000.0) * np.exp(rng.normal(0, 0.02, len(ts)))
    series = {
        "train/loss": (s, loss),
        "grad_norm": (gs, gn),
        "param_norm": (s, 100 + 0.002 * s),
        "lr": (s, lr),
        "loss_scale": (s, scale),
        "val/loss": (vs, 2.6 + 1e-5 * vs + 5.0 / (1 + vs / 100)),
        "eval/accuracy": (es, 0.3 + 0.04 * es / 1000),
        "eval/hellaswag": (es, 0.25 + 0.01 * es / 1000),
        "throughput/tokens_per_sec": (ts, tput),
        "memory/max_reserved(GiB)": (ts, 30 + 1e-3 * ts),
    }
    ls = np.arange(0, n, 50)
    for layer in range(8):
        grow = 1 + (2.0 * ls / n if layer < 2 else 0.0)
        series[f"grad_norm/layers.{layer}"] = (
            ls,
            0.2 * grow * np.exp(rng.normal(0, 0.05, len(ls))),
        )
        series[f"activations/absmax/layers.{layer}"] = (
            ls,
            10.0 ** (1 + 0.1 * layer) * np.ones(len(ls)),
        )
    run = run_from_frame(long_frame(series), name=name)
    findings = [
        Finding(
            "loss_spike",
            "critical",
            "loss",
            3000,
            "Loss tripled at step 3000 and settled higher",
            peak_step=3002,
            end_step=3010,
            measures={
                "classification": "pathological",
                "height": 5.0,
                "height_ratio": 3.0,
                "recovery_steps": None,
                "cause": "grad_norm_led",
            },
        ),
        Finding(
            "grad_norm_spike",
            "warning",
            "grad_norm",
            3000,
            "Grad norm 6x",
            peak_step=3001,
            end_step=3003,
            measures={"ratio_to_run_baseline": 6.0},
        ),
        Finding("loss_scale_drop", "warning", "loss_scale", 3000, "Loss scale 65536 -> 16384"),
        Finding(
            "layer_grad_shift",
            "warning",
            "grad_norm_layer",
            1500,
            "Layers 0-1 share doubled",
            end_step=5950,
            measures={"layer": 0, "layers": "0-1", "share_before": 0.05, "share_after": 0.12},
        ),
        Finding("throughput_drop", "warning", "throughput", 4500, "Throughput fell by a third"),
        Finding("eval_regression", "warning", "eval/hellaswag", 4000, "hellaswag stalled"),
        Finding("restart", "info", None, 2000, "The job restarted at step 2000"),
    ]
    return run, sorted(findings, key=Finding.sort_key)


class Page(HTMLParser):
    """Collect what the safety and structure checks need from a rendered report."""

    def __init__(self) -> None:
        super().__init__()
        self.scripts: list[tuple[dict[str, str], str]] = []
        self.tags: list[tuple[str, dict[str, str]]] = []
        self._in_script: dict[str, str] | None = None
        self._buf: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        self.tags.append((tag, a))
        if tag == "script":
            self._in_script, self._buf = a, []

    def handle_endtag(self, tag: str) -> None:
        if tag == "script" and self._in_script is not None:
            self.scripts.append((self._in_script, "".join(self._buf)))
            self._in_script = None

    def handle_data(self, data: str) -> None:
        if self._in_script is not None:
            self._buf.append(data)
        else:
            self.text.append(data)

    @property
    def figures(self) -> dict[str, dict]:
        return {
            a["id"]: json.loads(body)
            for a, body in self.scripts
            if a.get("type") == "application/json"
        }

    def all(self, tag: str, **match: str) -> list[dict[str, str]]:
        return [
            a for t, a in self.tags if t == tag and all(a.get(k) == v for k, v in match.items())
        ]


def parse(text: str) -> Page:
    p = Page()
    p.feed(text)
    p.close()
    return p


@pytest.fixture(scope="module")
def full_page() -> tuple[str, Page, object]:
    run, fs = full_run()
    diag = diagnose(run, fs)
    text = render_html(diag)
    return text, parse(text), diag


def test_one_chart_per_vital_sign(full_page) -> None:
    """Every vital sign the run logged gets its panel, each with a parseable figure."""
    _, page, _ = full_page
    panels = [a["data-panel"] for a in page.all("div", **{"class": "chart"})]
    assert panels == [
        "loss",
        "grad_norm",
        "param_norm",
        "lr",
        "loss_scale",
        "val_loss",
        "eval",
        "throughput",
        "memory",
        "grad_norm_layer",
        "act_absmax",
    ]
    figs = page.figures
    assert len(figs) == len(panels)
    assert all(f["data"] for f in figs.values())


def test_plotly_inlined_once(full_page) -> None:
    """The default page carries plotly.js exactly once and loads nothing from the network."""
    _, page, _ = full_page
    big = [body for a, body in page.scripts if "src" not in a and len(body) > 1_000_000]
    assert len(big) == 1
    assert not [a for a in page.all("script") if a.get("src")]
    assert not [a for _, a in page.tags if a.get("href", "").startswith("http")]


def test_findings_ranked_by_severity(full_page) -> None:
    """The report lists findings worst first; the JSON keeps step order."""
    _, page, diag = full_page
    sev = [a["data-severity"] for a in page.all("article") if "data-kind" in a]
    rank = {"fatal": 3, "critical": 2, "warning": 1, "info": 0}
    assert [rank[s] for s in sev] == sorted((rank[s] for s in sev), reverse=True)
    assert [f["start_step"] for f in diag.to_document()["findings"]] == sorted(
        f["start_step"] for f in diag.to_document()["findings"]
    )


def test_findings_marked_on_their_panels(full_page) -> None:
    """The loss spike is shaded over its span and marked at its peak, with the peak value kept."""
    _, page, _ = full_page
    loss = page.figures["fig-1"]
    rects = [s for s in loss["layout"]["shapes"] if s["type"] == "rect"]
    assert any(r["x0"] == 3000 and r["x1"] == 3010 for r in rects)
    markers = next(t for t in loss["data"] if t["name"] == "findings")
    assert 3002 in markers["x"]
    raw = loss["data"][0]
    assert 3002 in raw["x"]
    # run-level findings (the restart) land on the first panel as a dotted line
    assert any(s["type"] == "line" and s["x0"] == 2000 for s in loss["layout"]["shapes"])


def test_grad_norm_panel_has_baseline_bands(full_page) -> None:
    """The grad-norm panel draws the baseline and the article's 2x and 3x lines."""
    _, page, _ = full_page
    gn = page.figures["fig-2"]
    names = [t["name"] for t in gn["data"]]
    assert {"baseline", "2x baseline (yellow)", "3x baseline (orange)"} <= set(names)
    base = next(t for t in gn["data"] if t["name"] == "baseline")["y"][0]
    two = next(t for t in gn["data"] if t["name"].startswith("2x"))["y"][0]
    assert two == pytest.approx(2 * base, rel=1e-4)


def test_param_norm_band_and_warmup_line(full_page) -> None:
    """The param-norm panel draws the evidence's baseline and its 1.5x limit; the LR and
    grad-norm panels mark where the evidence says the warm-up ends."""
    _, page, diag = full_page
    pn = page.figures["fig-3"]
    lines = {t["name"]: t["y"][0] for t in pn["data"] if t.get("meta")}
    band = diag.ev.param_norm_band
    assert band is not None
    assert lines == {"baseline": band.baseline.value, "1.5x baseline": band.warn_at}
    wu = diag.ev.warmup_end
    assert wu is not None and 250 <= wu <= 300  # the LR reaches its peak at step 300
    for fig in (page.figures["fig-2"], page.figures["fig-4"]):
        (line,) = [s for s in fig["layout"]["shapes"] if s.get("name") == "warm-up end"]
        assert line["x0"] == wu


def test_train_val_panel_has_the_gap(full_page) -> None:
    """Train vs val shows both curves and the gap on a second axis."""
    _, page, _ = full_page
    tv = next(
        f for f in page.figures.values() if f["layout"]["title"]["text"].startswith("Training vs")
    )
    gap = next(t for t in tv["data"] if t["name"] == "gap")
    assert gap["yaxis"] == "y2" and len(gap["x"]) == 24


def test_layer_share_heatmap_sums_to_100(full_page) -> None:
    """The per-layer grad-share heatmap shows shares that add up to 100% per step."""
    _, page, _ = full_page
    hm = next(f for f in page.figures.values() if f["data"][0]["type"] == "heatmap")
    z = np.array(hm["data"][0]["z"], dtype=float)
    assert z.shape == (8, 120)
    assert np.allclose(z.sum(axis=0), 100, atol=0.01)
    assert z[0, -1] > z[0, 0] * 1.5  # the injected growth of layer 0's share


def test_sections_present(full_page) -> None:
    """Verdict, timeline, investigation, rollback, spikes, checklists, coverage, prescriptions,
    notes, metadata."""
    _, page, _ = full_page
    ids = {a.get("id") for _, a in page.tags}
    assert {
        "verdict",
        "timeline",
        "findings",
        "investigation",
        "rollback",
        "vitals",
        "spikes",
        "checklists",
        "coverage",
        "prescriptions",
        "notes",
        "metadata",
    } <= ids
    text = " ".join(page.text)
    assert "Standing guidance" in text and "generations are poor" in text
    assert "checkpoint at step" in text
    rows = [a for a in page.all("tr") if "data-status" in a]
    assert len(rows) == 15


def test_spike_table_lists_shape_measures(full_page) -> None:
    """The spike table has a column per measure, classification first."""
    text, _, _ = full_page
    spikes = text[text.index('id="spikes"') : text.index('id="checklists"')]
    heads = re.findall(r"<th[^>]*>([^<]*)</th>", spikes)
    assert heads[:6] == ["kind", "severity", "start", "peak", "end", "classification"]
    assert heads.index("classification") < heads.index("height") < heads.index("recovery_steps")


def test_spike_table_names_a_grad_norm_spike_by_its_shape() -> None:
    """The article's verdicts (beneficial...) are for the loss; a grad-norm row names the shape."""
    run, _ = full_run(1200)
    found = [
        Finding(
            kind,
            "info",
            metric,
            step,
            "a spike",
            peak_step=step + 2,
            end_step=step + 9,
            measures={"classification": "beneficial"},
        )
        for kind, metric, step in (
            (FindingKind.LOSS_SPIKE, "loss", 300),
            (FindingKind.GRAD_NORM_SPIKE, "grad_norm", 600),
        )
    ]
    page = render_html(diagnose(run, found), plotlyjs="cdn")
    spikes = page[page.index('id="spikes"') : page.index('id="checklists"')]
    rows = re.findall(r"<tr><td>(\w+)</td>.*?</tr>", spikes, re.S)
    assert rows == ["loss_spike", "grad_norm_spike"]
    cells = [re.findall(r'<td class="n">([^<]*)</td>', r) for r in spikes.split("<tr><td>")[1:]]
    assert cells[0][3] == "beneficial"
    assert cells[1][3] == "settled lower"


@pytest.mark.parametrize("kind", list(FindingKind))
def test_every_kind_renders(kind: FindingKind) -> None:
    """A finding of each kind renders through its own partial."""
    run, _ = full_run(1200)
    f = Finding(
        kind,
        "warning",
        "loss",
        600,
        f"a {kind.value} finding",
        peak_step=610,
        end_step=650,
        measures={
            k: v
            for k, v in {"layer": 2, "classification": "pathological"}.items()
            if k in declared(kind)  # a key the kind does not declare is refused
        },
    )
    page = parse(render_html(diagnose(run, [f]), plotlyjs="cdn"))
    arts = page.all("article", **{"data-kind": kind.value})
    assert len(arts) == 1


@pytest.mark.parametrize(
    ("kind", "word"),
    [
        (FindingKind.THROUGHPUT_DROP, "lowest"),
        (FindingKind.STALL, "slowest"),
        (FindingKind.EVAL_REGRESSION, "worst"),
        (FindingKind.LOSS_SPIKE, "peak"),
    ],
)
def test_a_cards_peak_step_is_named_for_its_kind(kind: FindingKind, word: str) -> None:
    """A throughput drop's peak step is its lowest rate: its card had read "peak at 900"."""
    run, _ = full_run(1200)
    f = Finding(kind, "warning", "loss", 600, "a finding", peak_step=610, end_step=650)
    page = render_html(diagnose(run, [f]), plotlyjs="cdn")
    (card,) = re.findall(rf'<article[^>]*data-kind="{kind.value}".*?</h3>', page, re.S)
    assert f"{word} at 610" in card
    assert word == "peak" or "peak at" not in card


def _evil_run() -> tuple[Run, list[Finding]]:
    s, loss = healthy_loss(800)
    series = {
        "train/loss": (s, loss),
        EVIL: (s, loss),
        "eval/" + EVIL_IMG: (s[::100], loss[::100]),
        "eval/</script><script>alert(3)</script>": (s[::100], loss[::100]),
    }
    run = run_from_frame(long_frame(series), name=EVIL)
    run.notes.append("skipped line: " + EVIL)
    run.config.update({"note": EVIL, EVIL_IMG: 1})
    run.metadata["framework"] = EVIL_IMG
    fs = [
        Finding(
            "loss_spike",
            "critical",
            "loss",
            400,
            "summary " + EVIL,
            measures={"classification": EVIL_IMG},
        ),
        Finding(
            "eval_regression",
            "warning",
            "eval/" + EVIL_IMG,
            500,
            "</script><script>alert(4)</script>",
        ),
    ]
    # Finding refuses undeclared measure keys; the page must still escape one that got through.
    object.__setattr__(fs[0], "measures", {**fs[0].measures, EVIL: 1.0})
    return run, fs


@pytest.mark.parametrize("plotlyjs", ["inline", "cdn"])
def test_untrusted_text_stays_inert(plotlyjs: str) -> None:
    """Tags, names, notes and summaries holding HTML cannot inject elements or scripts."""
    run, fs = _evil_run()
    text = render_html(diagnose(run, fs), plotlyjs=plotlyjs)
    page = parse(text)
    assert not page.all("img")
    assert not [a for _, a in page.tags if any(k.startswith("on") for k in a)]
    for attrs, body in page.scripts:
        if attrs.get("type") == "application/json":
            assert "<" not in body  # cannot close the element early
        else:
            assert "alert(" not in body
    ours = [a for a, _ in page.scripts if a.get("type") != "application/json"]
    assert len(ours) == 3  # error recorder, plotly (inline or cdn), the renderer
    # The figures still carry the names, HTML-escaped for plotly to display as plain text.
    names = {t.get("name") for f in page.figures.values() for t in f["data"]}
    assert html.escape('"><img_src=x_onerror=alert(2)>') in names
    visible = " ".join(page.text)
    assert EVIL in visible  # shown literally, as text


def test_script_json_escaping() -> None:
    """Figure JSON never contains a literal '<', so '</script>' in a name cannot close the
    element."""
    from forensics.report.charts import figure_json

    out = figure_json({"data": [{"name": "</script><b>x</b>&"}]})
    assert "<" not in out and ">" not in out and "&" not in out
    assert json.loads(out)["data"][0]["name"] == "</script><b>x</b>&"


def test_redact_leaves_out_paths_hosts_and_config() -> None:
    """--redact drops the run path, host names and config values from the page."""
    run, fs = full_run(1500, name="exp7")
    run.path = Path("/home/alice/secret-project/exp7")
    run.config.update({"learning_rate": 0.000123456, "data_path": "/mnt/corp/data"})
    run.metadata.update({"hostname": "gpu-node-17.corp.example", "framework": "torch 2.5"})
    run.notes.append("skipped 2 lines in /home/alice/secret-project/exp7/log.txt")
    run.notes.append(
        "read events.out.tfevents.1795980190.gpu-node-17.9070.0"
        " and checkpoint-500/trainer_state.json"
    )
    plain = render_html(diagnose(run, fs))
    red = render_html(diagnose(run, fs), redact=True)
    for secret in ("/home/alice", "gpu-node-17", "0.000123456", "/mnt/corp"):
        assert secret in plain
        assert secret not in red
    assert "torch 2.5" in red and "configuration value(s) withheld" in red
    assert "checkpoint-500/trainer_state.json" in red  # paths inside the run folder stay readable


@pytest.mark.slow
def test_size_limits_on_a_million_points() -> None:
    """A 1M-step run stays under 8 MB inline and 3 MB with the CDN, and keeps every spike's peak."""
    n = 1_000_000
    s, loss = healthy_loss(n, seed=3)
    gs, gn = healthy_grad_norm(n, seed=4)
    rng = np.random.default_rng(5)
    spikes = np.sort(rng.choice(np.arange(1000, n - 1000), 25, replace=False))
    loss[spikes] *= 4.0
    series = {
        "train/loss": (s, loss),
        "grad_norm": (gs, gn),
        "lr": (s, np.full(n, 1e-4)),
        "param_norm": (s, 50 + s * 1e-5),
        "throughput": (s, 1e4 + rng.normal(0, 50, n)),
    }
    run = run_from_frame(long_frame(series), name="long")
    fs = [
        Finding(
            "loss_spike",
            "warning",
            "loss",
            int(k),
            "spike",
            peak_step=int(k),
            end_step=int(k) + 1,
            measures={"classification": "unresolved"},
        )
        for k in spikes
    ]
    diag = diagnose(run, fs)
    inline = render_html(diag)
    cdn = render_html(diag, plotlyjs="cdn")
    assert len(inline.encode()) < 8_000_000
    assert len(cdn.encode()) < 3_000_000
    loss_fig = parse(cdn).figures["fig-1"]
    raw = loss_fig["data"][0]
    kept = dict(zip(raw["x"], raw["y"], strict=True))
    for k in spikes:
        assert kept[int(k)] == pytest.approx(loss[k], rel=1e-5)


def test_minmax_keeps_every_injected_extreme() -> None:
    """Min/max decimation keeps each injected spike and dip (one per bucket), unlike striding."""
    rng = np.random.default_rng(11)
    n, buckets = 200_000, 500
    y = rng.normal(0, 1, n)
    size = n // buckets
    chosen = rng.choice(
        buckets, 80, replace=False
    )  # distinct buckets: a bucket shows its one extreme
    where = chosen * size + rng.integers(0, size, 80)
    ups, downs = where[:40], where[40:]
    y[ups] += 50
    y[downs] -= 50
    idx = set(minmax_indices(y, buckets).tolist())
    assert len(idx) <= 4 * buckets
    assert set(ups.tolist()) <= idx and set(downs.tolist()) <= idx
    strided = set(range(0, n, 100))
    assert not set(ups.tolist()) <= strided  # the naive way loses them


def test_two_spikes_in_one_bucket_keep_the_higher_unless_asked() -> None:
    """Within one bucket only the extreme survives; a finding's peak passed as keep survives too."""
    y = np.zeros(100_000)
    y[[1500, 1510]] = [5.0, 9.0]
    idx = minmax_indices(y, 100)
    assert 1510 in idx and 1500 not in idx
    assert 1500 in minmax_indices(y, 100, keep=np.array([1500]))


def test_minmax_keeps_nan_and_requested_points() -> None:
    """One NaN per bucket survives (gaps stay visible) and requested indices are always kept."""
    y = np.linspace(0, 1, 100_000)
    y[5_000] = np.nan
    idx = minmax_indices(y, 100, keep=np.array([77_777]))
    assert 5_000 in idx and 77_777 in idx
    assert np.array_equal(minmax_indices(y[:50], 100), np.arange(50))


def _tb_reference(values: list[float], weight: float) -> list[float]:
    """TensorBoard's smoothing loop, transcribed point by point."""
    last, num, out = 0.0, 0, []
    constant = all(v == values[0] for v in values)
    for v in values:
        if constant or not np.isfinite(v):
            out.append(v)
            continue
        last = last * weight + (1 - weight) * v
        num += 1
        out.append(last / (1 - weight**num))
    return out


@pytest.mark.parametrize("weight", [0.6, 0.9, 0.99])
def test_smoothing_matches_tensorboard(weight: float) -> None:
    """Our vectorised smoothing equals TensorBoard's debiased EMA, NaNs passed through."""
    rng = np.random.default_rng(2)
    y = 3 + rng.normal(0, 0.3, 500)
    y[[10, 200]] = np.nan
    got = tb_smooth(y, weight)
    ref = np.array(_tb_reference(y.tolist(), weight))
    assert np.allclose(got, ref, equal_nan=True)
    assert got[0] == pytest.approx(y[0])  # debiasing: no pull toward zero at the start


def test_healthy_run_report() -> None:
    """A run with no finding renders a green banner and says nothing needs action."""
    s, loss = healthy_loss(2000)
    gs, gn = healthy_grad_norm(2000)
    run = run_from_frame(long_frame({"loss": (s, loss), "grad_norm": (gs, gn)}))
    page = parse(render_html(diagnose(run, []), plotlyjs="cdn"))
    assert page.all("span", **{"class": "verdict", "data-verdict": "healthy"})
    assert "No vital sign left its normal range." in " ".join(page.text)


def test_cdn_mode_references_plotly() -> None:
    """--plotlyjs cdn loads plotly.js from cdn.plot.ly with a subresource-integrity hash."""
    run, fs = full_run(1200)
    page = parse(render_html(diagnose(run, fs), plotlyjs="cdn"))
    (src,) = [a for a in page.all("script") if a.get("src")]
    assert src["src"].startswith("https://cdn.plot.ly/plotly-") and src["integrity"].startswith(
        "sha384-"
    )
    with pytest.raises(ValueError):
        render_html(diagnose(run, fs), plotlyjs="bogus")


def test_summary_prints_verdict_findings_and_report_path() -> None:
    """The terminal summary names the verdict, the worst findings with steps, and the report."""
    from rich.console import Console

    from forensics.summary import print_summary

    run, fs = full_run(6000, name="[red]run[/red]")
    con = Console(record=True, width=120)
    print_summary(diagnose(run, fs), report_path=Path("reports/x.html"), console=con)
    out = con.export_text()
    assert "CRITICAL" in out and "orange light" in out
    assert "loss_spike" in out and "3,000" in out
    assert "[red]run[/red]" in out  # markup in a run name is printed, not interpreted
    assert "reports/x.html" in out
    assert "Roll back to the checkpoint at step" in out


@pytest.mark.parametrize(
    ("sample", "expected"),
    [
        ("layer_grad_shift", "What to do (layer_grad_shift from step 310): Yellow light: slow"),
        ("throughput_drop", "What to do (throughput_drop from step 510): Yellow light: profile"),
        ("healthy", None),
        ("param_norm_jump", None),  # a rollback plan is the advice there
        # the incident's supported root cause, a bad batch, over its loss-scale drop's row
        # ("move to bf16 or tame the offending layer")
        ("bad_batch", "What to do (bad batch at step 300): Yellow light: find that batch"),
    ],
)
def test_summary_ends_on_what_to_do_when_no_rollback_is_advised(
    sample: str, expected: str | None
) -> None:
    """A drift or a slowdown has no rollback plan; the terminal summary used to end on the
    incident's order with no next step. It now gives the most severe finding's prescription,
    and says nothing for a green run or where the rollback sentence already advises."""
    import io

    from rich.console import Console

    import forensics
    from forensics.summary import print_summary

    root = Path(__file__).resolve().parents[1]
    out = io.StringIO()
    print_summary(
        forensics.analyze(root / "sample_runs" / sample), console=Console(file=out, width=400)
    )
    text = out.getvalue()
    if expected is None:
        assert "What to do" not in text, text
    else:
        assert expected in text, text


def test_pipeline_on_a_real_tensorboard_file(spike_run: Path) -> None:
    """Read a tensorboardX-written run, detect, diagnose, render: the injected spike is marked at
    step 300."""
    from forensics.detectors import detect
    from forensics.importers import read_run

    run = read_run(spike_run)
    diag = diagnose(run, detect(run))
    spikes = [f for f in diag.findings if f.kind == FindingKind.LOSS_SPIKE]
    assert spikes and abs(spikes[0].start_step - 300) <= 2
    page = parse(render_html(diag, plotlyjs="cdn"))
    loss = page.figures["fig-1"]
    marks = next(t for t in loss["data"] if t["name"] == "findings")
    assert any(abs(x - 300) <= 3 for x in marks["x"])
    assert page.all("article", **{"data-kind": "loss_spike"})


@pytest.mark.slow
def test_thousands_of_findings_stay_small() -> None:
    """5000 findings on a 1M-step run: cards for the worst, rows for the rest, file still under the
    limits."""
    n = 1_000_000
    s, loss = healthy_loss(n, seed=7)
    run = run_from_frame(
        long_frame({"train/loss": (s, loss), "grad_norm": healthy_grad_norm(n, seed=8)}),
        name="noisy",
    )
    steps = np.linspace(1000, n - 1000, 5000).astype(int)
    fs = [
        Finding(
            "loss_spike",
            "fatal" if i == 4321 else "warning",
            "loss",
            int(k),
            f"spike {i}",
            peak_step=int(k),
            end_step=int(k) + 5,
            measures={"classification": "unresolved", "height": 1.0},
        )
        for i, k in enumerate(steps)
    ]
    diag = diagnose(run, fs)
    cdn = render_html(diag, plotlyjs="cdn")
    assert len(cdn.encode()) < 3_000_000
    assert len(render_html(diag).encode()) < 8_000_000
    page = parse(cdn)
    cards = page.all("article", **{"data-kind": "loss_spike"})
    assert cards[0]["data-severity"] == "fatal" and len(cards) == 60
    assert len([a for a in page.all("tr") if a.get("data-kind") == "loss_spike"]) == 500
    assert "spike 4321" in " ".join(page.text)


class _Cards(HTMLParser):
    """The text of each <article> (finding and incident cards), keyed by its id."""

    def __init__(self) -> None:
        super().__init__()
        self.cards: dict[str, str] = {}
        self._id: str | None = None
        self._depth = 0
        self._buf: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "article":
            if self._id is None:
                self._id, self._buf, self._depth = dict(attrs).get("id") or "", [], 0
            self._depth += 1

    def handle_endtag(self, tag: str) -> None:
        if tag == "article" and self._id is not None:
            self._depth -= 1
            if self._depth == 0:
                self.cards[self._id] = re.sub(r"\s+", " ", "".join(self._buf))
                self._id = None

    def handle_data(self, data: str) -> None:
        if self._id is not None:
            self._buf.append(data)


def test_nan_report_incident_causes_and_lights() -> None:
    """nan: one incident card names the LR change as the cause and the LR as the first mover;
    the fatal NaN card and its prescription say "Red light" (never "Orange light"); each
    finding card lists its causes tested against the log."""
    from forensics import analyze

    diag = analyze(Path(__file__).resolve().parents[1] / "sample_runs" / "nan")
    page = render_html(diag, plotlyjs="cdn")
    ids = {a.get("id") for _, a in parse(page).tags}
    assert "incidents" in ids and "incident-1" in ids
    p = _Cards()
    p.feed(page)
    inc = p.cards["incident-1"]
    assert "Cause: An LR change no schedule explains" in inc
    assert "The learning rate moved first (onset at step 501" in inc
    assert "layers 0-3" not in inc or "0, 1, 2, 3" in inc  # signs list the layers
    nan_card = next(t for k, t in p.cards.items() if k.startswith("finding-nan_inf"))
    assert "Red light" in nan_card and "Orange light" not in nan_card
    assert "Causes tested against the log" in nan_card
    assert "supported : An LR change no schedule explains" in nan_card.replace(
        "supported:", "supported :"
    )
    for k, text in p.cards.items():
        if k.startswith("finding-"):
            assert "Causes tested against the log" in text, k


def test_counts_over_a_thousand_have_separators() -> None:
    """A 1M-step run printed "4810 more informational note(s)" and "4815 note(s)" in the
    banner beside step numbers written "2,724": every count a reader sees has separators."""
    import io

    from rich.console import Console

    from forensics.pipeline import analyze_run
    from forensics.summary import print_summary

    s, loss = healthy_loss(64_000)
    _, gn = healthy_grad_norm(64_000)
    gn = gn.copy()
    gn[500::50] *= 3.0  # 1,270 one-step grad-norm spikes the optimizer absorbs
    diag = analyze_run(run_from_frame(long_frame({"loss": (s, loss), "grad_norm": (s, gn)})))
    # (one note for all of them now: the count is in its sentence)
    (notes,) = [f for f in diag.findings if f.kind.value == "grad_norm_outliers"]
    n = notes.measures["count"]
    assert isinstance(n, int) and n > 1000
    out = io.StringIO()
    print_summary(diag, console=Console(file=out, width=400))
    text = out.getvalue()
    assert f" {n:,} grad-norm outliers from step 500 " in text, text
    # (the periodic finding of the same spikes said "(1270 from step 500 to 63,950)")
    assert "(1,270 from step 500 to 63,950)" in text, text
    assert not re.search(r"\b\d{4,} (?:more|grad-norm|from)", text)
    page = render_html(diag, plotlyjs="cdn")
    assert f"{n:,} grad-norm outliers" in page
    assert not re.search(r"\b\d{4,} (?:note|more|finding|further|spike|grad-norm|from)", page)


def test_a_flood_of_one_note_does_not_hide_the_rarer_ones() -> None:
    """The 1M-step benchmark run's three loss spikes (steps 223,870 onwards) were past the
    report's cards and table, behind 4,812 absorbed grad-norm spikes in step order: only the
    JSON had them. Those spikes are one note now, beside the loss spike's card; and where
    notes still come in numbers, notes about the loss come first, then rarer kinds before
    frequent ones."""
    from forensics.findings import Finding, FindingKind, notes_in_reading_order
    from forensics.pipeline import analyze_run
    from forensics.report.render import FULL_FINDINGS

    s, loss = healthy_loss(64_000)
    _, gn = healthy_grad_norm(64_000)
    loss, gn = loss.copy(), gn.copy()
    gn[500::50] *= 3.0
    loss[60_000:60_003] *= (1.8, 1.4, 1.1)  # a loss spike near the end
    diag = analyze_run(run_from_frame(long_frame({"loss": (s, loss), "grad_norm": (s, gn)})))
    notes = notes_in_reading_order(diag.findings)
    assert [(f.kind.value, f.start_step) for f in notes] == [
        ("loss_spike", 60_000),
        ("grad_norm_outliers", 500),
    ]
    assert notes[1].measures["count"] > 1000  # type: ignore[operator]
    page = render_html(diag, plotlyjs="cdn")
    findings = page[page.index('id="findings"') : page.index('id="investigation"')]
    assert "Loss spike at step 60,000" in findings and "more finding(s)" not in findings
    assert "Absorbed gradient-norm outliers" in findings

    # A flood of one kind of note, made by hand: the loss's and the rarer notes first.
    many = [
        Finding(FindingKind.ACTIVATION_OUTLIER, "info", "act_absmax", 100 + i, "a")
        for i in range(1_200)
    ]
    few = [Finding(FindingKind.PLATEAU, "info", "loss", 50, "p")] * 2
    loss_note = Finding(FindingKind.LOSS_SPIKE, "info", "loss", 60_000, "l")
    ordered = notes_in_reading_order([*many, loss_note, *few])
    assert ordered[0] is loss_note and ordered[1:3] == few
    g = [f.start_step for f in ordered[3:]]
    assert g == sorted(g) and len(g) == 1_200 > FULL_FINDINGS


def test_the_hidden_notes_line_says_what_kinds_they_are() -> None:
    """The 1M-step benchmark run ended its screen with "4,810 more informational note(s) in
    the report.": one flood of absorbed grad-norm spikes or a dozen different events worth
    opening the report for read the same. The line now counts them by kind."""
    import io

    from rich.console import Console

    from forensics.pipeline import analyze_run
    from forensics.summary import print_summary

    s, loss = healthy_loss(64_000)
    _, gn = healthy_grad_norm(64_000)
    loss, gn = loss.copy(), gn.copy()
    gn[500::50] *= 3.0
    # eight loss spikes at uneven steps, off the grad-norm spikes' grid: four shown under
    # the periodic spikes' warning, four behind the line with the grad-norm outliers' note
    for at in (9_013, 17_521, 23_007, 31_033, 38_511, 47_029, 52_017, 60_041):
        loss[at : at + 3] *= (1.8, 1.4, 1.1)
    diag = analyze_run(run_from_frame(long_frame({"loss": (s, loss), "grad_norm": (s, gn)})))
    notes = [f for f in diag.findings if f.severity == "info"]
    by_kind = {k: sum(f.kind.value == k for f in notes) for k in {f.kind.value for f in notes}}
    assert by_kind == {"loss_spike": 8, "grad_norm_outliers": 1}, by_kind
    out = io.StringIO()
    print_summary(diag, console=Console(file=out, width=400))
    text = out.getvalue()
    rows = [ln for ln in text.splitlines() if ln.startswith("info ")]
    shown = {k: sum(f" {k} " in ln for ln in rows) for k in by_kind}
    line = next(ln for ln in text.splitlines() if "more informational note(s)" in ln)
    hidden = {k: n - shown[k] for k, n in by_kind.items() if n > shown[k]}
    assert line.startswith(f"{sum(hidden.values()):,} more informational note(s) in the report: ")
    for kind, n in hidden.items():
        assert f"{n:,} {kind}" in line, (kind, n, line)
    # Most frequent first.
    assert hidden == {"loss_spike": 4, "grad_norm_outliers": 1}, hidden
    assert line.index("loss_spike") < line.index("grad_norm_outliers"), line


def test_a_log_without_a_training_loss_says_the_light_covers_only_what_was_logged(
    tmp_path: Path,
) -> None:
    """A JSONL log of grad norm and LR only was "HEALTHY (green light)" and nothing more: the
    loss checks had not run. The terminal and the report's banner now say so."""
    import io

    from rich.console import Console

    import forensics
    from forensics.summary import print_summary

    rows = [{"step": s, "grad_norm": 0.5, "lr": 3e-4} for s in range(1, 2001)]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    diag = forensics.analyze(tmp_path)
    said = "No training loss in the log: its checks (spikes, divergence, plateau, the train/val"
    out = io.StringIO()
    print_summary(diag, console=Console(file=out, width=400))
    assert said in out.getvalue() and "(grad_norm, lr)." in out.getvalue()
    page = render_html(diag, plotlyjs="cdn")
    banner = page[page.index('<header class="card banner"') : page.index("</header>")]
    assert said in html.unescape(banner), banner
    healthy = forensics.analyze(Path(__file__).resolve().parents[1] / "sample_runs" / "healthy")
    assert healthy.unjudged() is None


def test_the_layer_card_does_not_repeat_its_summary() -> None:
    """The layer_grad_shift sample's card said "Layer 1 went from 9% to 25% of the squared
    grad norm ..." and, right under it, "Layer 1 went from 8.7% to 24.5% of the gradient
    (squared norms)": the same fact twice, with more digits the second time, which reads
    like two numbers that disagree. The shares are stated once."""
    from forensics.pipeline import analyze

    d = analyze(Path(__file__).resolve().parents[1] / "sample_runs" / "layer_grad_shift")
    (f,) = [f for f in d.findings if f.kind is FindingKind.LAYER_GRAD_SHIFT]
    assert "from 9% to 25% of the squared grad norm" in f.summary
    page = render_html(d, plotlyjs="cdn")
    start = page.index(f'id="finding-layer_grad_shift-{f.start_step}"')
    card = " ".join(
        html.unescape(re.sub(r"<[^>]+>", "", page[start : page.index("</article>", start)])).split()
    )
    assert card.count("% of the") == 1, card
    assert "8.7%" not in card and "24.5%" not in card
    assert "heatmap" in card and '"type":"heatmap"' in page  # (the chart it points to)
