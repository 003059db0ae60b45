"""`forensics compare`: runs side by side and where their losses part ways."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from conftest import snapshot, write_tb_run
from synthetic import long_frame, run_from_frame
from torch_runs import train_run
from typer.testing import CliRunner

from forensics.cli import app
from forensics.compare import compare, config_diff, loss_parts_ways, partings
from forensics.evidence import Evidence
from forensics.importers import read_run

runner = CliRunner()
SAMPLES = Path(__file__).resolve().parent.parent / "sample_runs"


def test_parts_ways_at_injected_step() -> None:
    """Two loss curves equal until step 700, then one stays 20% higher: found at 700."""
    steps = np.arange(0, 2000, 10)
    base = 2 + 5 / (1 + steps / 100)
    other = np.where(steps >= 700, base * 1.2, base)
    a = run_from_frame(long_frame({"loss": (steps, base)}))
    b = run_from_frame(long_frame({"loss": (steps, other)}))
    got = loss_parts_ways(a, b)
    assert got is not None and got["step"] == 700
    assert got["rel_diff_at_step"] == pytest.approx(0.2, rel=0.01)
    assert loss_parts_ways(a, a)["step"] is None


def test_band_from_step_noise_and_run_to_run() -> None:
    """Noisy seeds stay inside the band (its width is the data's noise, not a percentage); a
    run whose level moves by a few noise widths parts where it moves. With three or more other
    runs the run-to-run spread widens the band: seed-to-seed wander does not part."""
    steps = np.arange(0, 1000)
    base = 2 + 5 / (1 + steps / 100)
    rng = np.random.default_rng(0)

    def noisy(shift_at: int | None = None) -> np.ndarray:
        y = base + rng.normal(0, 0.02, len(steps))
        if shift_at is not None:
            y = np.where(steps >= shift_at, y + 0.3, y)
        return y

    ref = Evidence(run_from_frame(long_frame({"loss": (steps, noisy())})))
    seeds = [Evidence(run_from_frame(long_frame({"loss": (steps, noisy())}))) for _ in range(3)]
    moved = Evidence(run_from_frame(long_frame({"loss": (steps, noisy(600))})))
    got = partings(ref, [*seeds, moved], "loss")
    assert all(g is not None and g["step"] is None for g in got[:3])
    assert got[3]["step"] is not None and 600 <= got[3]["step"] <= 603
    assert got[3]["run_to_run"] is True
    assert partings(ref, [seeds[0]], "loss")[0]["step"] is None  # step-to-step band alone


def test_bit_identical_runs_part_where_the_data_differ() -> None:
    """healthy and param_norm_jump are bit-identical through step 500 (the LR is 50x from step
    500): the loss parts at 501 (its first differing value, not before), the LR and the param
    norm at 500, and those are named the first signs to part."""
    cmp = compare([SAMPLES / "healthy", SAMPLES / "param_norm_jump"])
    assert cmp.part_ways[1]["step"] == 501
    assert cmp.partings["lr"][1]["step"] == 500
    assert cmp.partings["grad_norm"][1]["step"] == 502
    assert cmp.first_parting[1]["step"] == 500
    assert set(cmp.first_parting[1]["metrics"]) == {"lr", "param_norm"}
    assert all(p[1]["step"] is None or p[1]["step"] >= 500 for p in cmp.partings.values())
    assert "parted at step 500" in cmp.why[1]
    fd = cmp.finding_diff[1]
    assert "param_norm_jump" in {f["kind"] for f in fd["only_other"]}
    assert not fd["only_reference"]
    # --reference: judged the other way round, the same steps.
    rev = compare([SAMPLES / "healthy", SAMPLES / "param_norm_jump"], reference=1)
    assert rev.part_ways[0]["step"] == 501 and rev.part_ways[1] is None
    assert "param_norm_jump" in {f["kind"] for f in rev.finding_diff[0]["only_reference"]}


@pytest.fixture(scope="module")
def torch_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Real small trainings: two seeds meeting one corrupt batch at step 150; two LRs."""
    root = tmp_path_factory.mktemp("torch_runs")
    return {
        "seed1": train_run(root / "seed1", seed=1, bad_batch_at=150),
        "seed2": train_run(root / "seed2", seed=2, bad_batch_at=150),
        "lr_low": train_run(root / "lr_low", lr=3e-3),
        "lr_high": train_run(root / "lr_high", lr=3e-2),
    }


def test_two_seeds_share_a_data_spike(torch_runs: dict[str, Path]) -> None:
    """Two seeds, one corrupt batch at step 150: the spike is in both at the same step, and
    since the seeds differ it is put on the data (the batch's samples from the batch size)."""
    cmp = compare([torch_runs["seed1"], torch_runs["seed2"]])
    fd = cmp.finding_diff[1]
    assert ("loss_spike", 150) in {(f["kind"], f["step"]) for f in fd["both"]}
    shared = next(s for s in cmp.shared_spikes if s["kind"] == "loss_spike")
    assert shared["step"] == 150 and shared["points_at_data"] is True
    assert shared["seeds"] == [1, 2]
    assert shared["batch"] == {"batch_size": 32, "samples": [4800, 4831]}
    assert "points at the data" in shared["note"]
    assert cmp.config_diff == {"seed": [1, 2]}
    # a spike both take is a shared event, not a parting
    assert cmp.part_ways[1]["step"] is None


def test_two_lrs_config_beside_the_parting(torch_runs: dict[str, Path]) -> None:
    """Two LRs of one config: the config diff is the LR and the sentence puts it beside the
    first parting (the LR itself from step 0, then the loss)."""
    cmp = compare([torch_runs["lr_low"], torch_runs["lr_high"]])
    assert cmp.config_diff == {"lr": [0.003, 0.03]}
    assert cmp.first_parting[1]["metrics"] == ["lr"] and cmp.first_parting[1]["step"] == 0
    assert cmp.first_parting[1]["then"]["metrics"] == ["loss"]
    # (lr_high's value first, as in the line "lr_high vs lr_low: lr 0.03 vs 0.003; ...")
    assert cmp.why[1].startswith(
        "lr 0.03 vs 0.003; the lr parted at step 0 (+900%), the loss at step"
    )
    assert cmp.part_ways[1]["step"] is not None


def test_config_diff_flattens_trainer_configs() -> None:
    """W&B {key: {value: x}} entries, nested HF/Megatron dicts and missing keys."""
    a = {"lr": {"value": 3e-4}, "_wandb": {"value": {"x": 1}}, "model": {"layers": 4}}
    b = {"lr": {"value": 6e-4}, "model": {"layers": 4}, "seed": 2}
    assert config_diff([a, b]) == {"lr": [3e-4, 6e-4], "seed": [None, 2]}


def test_compare_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two real TensorBoard runs: a table on stdout, JSON with both runs, a page with a chart per
    vital sign."""
    a = write_tb_run(tmp_path / "run_a", n=400, spike_at=None)
    b = write_tb_run(tmp_path / "run_b", n=400, spike_at=200, seed=4)
    monkeypatch.chdir(tmp_path)
    before = snapshot(a), snapshot(b)
    res = runner.invoke(app, ["compare", str(a), str(b)])
    assert res.exit_code == 0, res.output
    assert "run_a" in res.stdout and "run_b" in res.stdout
    page = next((tmp_path / "reports").glob("compare-*.html")).read_text()

    class Charts(HTMLParser):
        ids: list[str] = []

        def handle_starttag(self, tag, attrs):  # noqa: ANN001
            d = dict(attrs)
            if tag == "div" and "chart" in (d.get("class") or ""):
                self.ids.append(d["id"])

    p = Charts()
    p.feed(page)
    assert {"chart-loss", "chart-grad_norm", "chart-lr"} <= set(p.ids)
    res = runner.invoke(app, ["compare", str(a), str(b), "--format", "json", "--no-report"])
    doc = json.loads(res.stdout)
    assert [r["label"] for r in doc["runs"]] == ["run_a", "run_b"]
    assert doc["runs"][1]["verdict"] != "healthy"
    assert (snapshot(a), snapshot(b)) == before
    assert runner.invoke(app, ["compare", str(a)]).exit_code == 2


def test_compare_cli_reference_align_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--reference picks the envelope, --json writes the document (outside the runs), --align
    time uses the logged wall time, --align tokens is refused when no run logs tokens; the page
    carries the parting marks, the finding diff and the config diff."""
    a, b = SAMPLES / "healthy", SAMPLES / "param_norm_jump"
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(
        app,
        ["compare", str(b), str(a), "--reference", str(a), "--json", "cmp.json", "-o", "p.html"],
    )
    assert res.exit_code == 0, res.output
    doc = json.loads((tmp_path / "cmp.json").read_text())
    assert doc["schema_version"] == 2 and doc["reference"] == "healthy"
    assert doc["loss_parts_ways"][0]["step"] == 501 and doc["loss_parts_ways"][1] is None
    assert doc["first_parting"][0]["step"] == 500
    assert "param_norm + lr @ 500" in res.stdout or "lr + param_norm @ 500" in res.stdout
    page = (tmp_path / "p.html").read_text()
    assert 'id="finding-diff"' in page and 'id="why"' in page
    assert "param_norm_jump parts at step 501" in page  # the loss chart's mark
    res = runner.invoke(app, ["compare", str(a), str(b), "--align", "time", "--no-report"])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["compare", str(a), str(b), "--align", "tokens", "--no-report"])
    assert res.exit_code != 0 and "not logged" in res.output


def _shared_by_scan(diags, labels):  # type: ignore[no-untyped-def]
    """The grouping as first written: each finding scans every group (the reference)."""
    from forensics.compare import SAME_STEP, SPIKE_KINDS

    groups: list[dict] = []
    for i, d in enumerate(diags):
        for f in d.findings:
            if f.kind.value not in SPIKE_KINDS:
                continue
            g = next(
                (
                    g
                    for g in groups
                    if g["kind"] == f.kind.value and abs(g["step"] - f.start_step) <= SAME_STEP
                ),
                None,
            )
            if g is None:
                groups.append({"kind": f.kind.value, "step": f.start_step, "runs": [i]})
            elif i not in g["runs"]:
                g["runs"].append(i)
    return [(g["kind"], g["step"], g["runs"]) for g in groups if len(g["runs"]) >= 2]


def test_shared_spikes_grouped_by_lookup_as_by_scan() -> None:
    """The groups found by looking up nearby steps are the scan's, on clustered spikes (two
    within SAME_STEP of one group, chains of spikes 2 steps apart, two kinds at one step)."""
    from forensics.compare import shared_spikes
    from forensics.diagnosis import diagnose
    from forensics.findings import Finding, FindingKind

    s = np.arange(0, 400)
    run = run_from_frame(long_frame({"loss": (s, 2 + 0 * s)}))
    rng = np.random.default_rng(7)
    diags = []
    for _ in range(3):
        found = []
        for step in sorted(rng.choice(300, 60, replace=False)):
            kind = FindingKind.LOSS_SPIKE if rng.random() < 0.5 else FindingKind.GRAD_NORM_SPIKE
            found.append(Finding(kind, "info", "loss", int(step), "a spike"))
        found.append(Finding(FindingKind.LOSS_SPIKE, "info", "loss", 350, "a spike"))
        found.append(Finding(FindingKind.LOSS_SPIKE, "info", "loss", 352, "a spike"))
        diags.append(diagnose(run, found))
    labels = ["a", "b", "c"]
    got = [
        (g["kind"], g["step"], [labels.index(r) for r in g["runs"]])
        for g in shared_spikes(diags, labels)
    ]
    assert got == _shared_by_scan(diags, labels)
    assert len(got) > 20


def test_compare_terminal_lists_a_few_shared_spikes(tmp_path: Path) -> None:
    """Two 1M-step copies of one run printed 4,812 "shared:" lines; the terminal shows ten and
    says how many more the report and --json hold."""
    steps = np.arange(0, 30_000)
    rng = np.random.default_rng(3)
    loss = 2 + 8 / (1 + steps / 40) + rng.normal(0, 0.01, len(steps))
    gn = 0.6 * np.exp(rng.normal(0, 0.05, len(steps)))
    gn[300::100] *= 3.0
    paths = []
    for name in ("a", "b"):
        p = tmp_path / name
        p.mkdir()
        with open(p / "metrics.jsonl", "w") as fh:
            for t, lv, g in zip(steps, loss, gn, strict=True):
                fh.write(
                    json.dumps({"step": int(t), "loss": float(lv), "grad_norm": float(g)}) + "\n"
                )
        paths.append(str(p))
    res = runner.invoke(
        app,
        ["compare", *paths, "--out", str(tmp_path / "c.html"), "--no-cache"],
        terminal_width=300,
    )
    assert res.exit_code == 0, res.output
    lines = [ln for ln in res.output.splitlines() if ln.startswith("shared:")]
    assert len(lines) == 10
    more = re.search(r"\.\.\. and ([\d,]+) more spikes shared at the same step", res.output)
    assert more is not None
    cmp = compare(paths)
    assert int(more.group(1).replace(",", "")) == len(cmp.shared_spikes) - 10 > 200


def test_compare_page_folds_a_long_list_of_shared_spikes(tmp_path: Path) -> None:
    """The page shows ten shared spikes, folds the rest (up to 500) and counts them."""
    steps = np.arange(0, 30_000)
    rng = np.random.default_rng(3)
    loss = 2 + 8 / (1 + steps / 40) + rng.normal(0, 0.01, len(steps))
    gn = 0.6 * np.exp(rng.normal(0, 0.05, len(steps)))
    gn[300::100] *= 3.0
    from forensics.compare import compare_diagnoses
    from forensics.pipeline import analyze_run
    from forensics.report.compare_page import render_compare_html

    frame = long_frame({"loss": (steps, loss), "grad_norm": (steps, gn)})
    cmp = compare_diagnoses([analyze_run(run_from_frame(frame)) for _ in range(2)])
    n = len(cmp.shared_spikes)
    page = render_compare_html(cmp, plotlyjs="cdn")
    head, folded = page.split("more spikes shared at the same step</summary>", 1)
    assert head.count("<b>shared:</b>") == 10
    assert f"{n - 10:,} more spikes shared" in page
    assert folded[: folded.index("</details>")].count("<b>shared:</b>") == min(n, 500) - 10


def test_llmc_stdout_beside_main_log_says_the_steps_are_one_apart() -> None:
    """llm.c prints update k as "step k/N" on stdout and logs it as "s:k-1" in main.log. Put
    side by side as logged, the two real GPT-2 runs (one stdout, one main.log) "part" on the
    grad norm at step 2, where it falls fast: 15.24 at stdout step 2 against 14.49 at s:2,
    though s:1 logged 15.18. The comparison says so in a note; two main.log runs get none."""
    from conftest import shared_path

    stdout = shared_path("real_runs", "llmc-gpt2-124M-hectorfcardenas", "gpt2_train.11685414.log")
    main = shared_path("real_runs", "llmc-gpt2-124M-siddanthemani", "main.log")
    cmp = compare([stdout, main])
    (note,) = cmp.notes
    assert note.startswith("gpt2_train.11685414: llm.c stdout, which numbers each training")
    assert f"than llm.c's main.log ({cmp.labels[1]});" in note
    assert "one apart" in note
    assert cmp.to_document()["notes"] == [note]
    other = shared_path("real_runs", "modded-nanogpt", "2024-10-13_llmc", "main.log")
    assert compare([main, other]).notes == []


def test_two_real_runs_of_one_config_do_not_part_by_noise() -> None:
    """Two llm.c GPT-2 124M runs of one recipe (19,552 and 19,560 steps, ending at loss 3.285
    and 3.286): their per-step loss differences leave the band at 2% of the points, and their
    grad norms bump and wobble for 5-20 steps at a time in one run or the other. None of that
    is a parting: the loss ran 3 points out of 5 at step 7,580 and the grad norm 6 in a row at
    step 732 before the level rule. The LR does part: the two cosine schedules end 8 steps
    apart, and their printed LRs (three digits) first differ for five steps in a row at step
    10,677 (+0.37% there)."""
    from conftest import shared_path

    a = shared_path("real_runs", "llmc-gpt2-124M-siddanthemani", "main.log")
    b = shared_path("real_runs", "modded-nanogpt", "2024-10-13_llmc", "main.log")
    cmp = compare([a, b])
    for sign in ("loss", "val_loss", "grad_norm"):
        assert cmp.partings[sign][1]["step"] is None, sign
    lr = cmp.partings["lr"][1]
    assert lr["step"] == 10_677
    assert lr["rel_diff_at_step"] == pytest.approx(0.00368, rel=0.01)
    assert cmp.why[1] == "no config difference logged; the lr parted at step 10,677 (+0.37%)"


def test_compare_table_states_each_runs_unit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The table's end levels of throughput and memory carry the unit each log states (the
    healthy and memory_growth samples log MB and tokens/s): "1169" alone did not say what it
    counted."""
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(
        app,
        ["compare", str(SAMPLES / "healthy"), str(SAMPLES / "memory_growth"), "--no-report"],
    )
    assert res.exit_code == 0, res.output
    rows = {ln.split("│")[1].strip(): ln for ln in res.output.splitlines() if "(end)" in ln}
    mem = Evidence(read_run(SAMPLES / "memory_growth")).series("memory").values
    tail = mem[-max(1, len(mem) // 20) :]
    assert f"{np.median(tail):,.0f} MB" in rows["memory (end)"]  # 1,169 MB: separators
    assert rows["throughput (end)"].count("tokens/s") == 2


def test_a_run_whose_memory_grew_is_not_said_to_have_no_sign_parted() -> None:
    """healthy and memory_growth train identically (one seed; the second run holds on to its
    batches' memory): their training signs never part, but the memory grows 227%. The line
    said "no vital sign parted"; it names what was lined up (the training signs), and the
    memory growth is listed as a finding only the second run has."""
    cmp = compare([SAMPLES / "healthy", SAMPLES / "memory_growth"])
    why = cmp.why[1]
    assert why is not None and "no vital sign parted" not in why
    assert why.endswith(
        "no training sign parted (loss, val loss, grad norm, param norm, LR, loss scale)"
    )
    assert cmp.first_parting[1] is None
    assert [f["kind"] for f in cmp.finding_diff[1]["only_other"]] == ["memory_growth"]


def test_a_run_that_logged_no_step_is_not_said_to_have_no_sign_parted() -> None:
    """llm.c job 11672072 ran out of memory before its first step (the log holds the setup
    and the CUDA error, no metric line); job 11685414 trained 19,560 steps. "no training sign
    parted (loss, val loss, ...)" read as if the two had been lined up: nothing could be."""
    from conftest import shared_path

    folder = ("real_runs", "llmc-gpt2-124M-hectorfcardenas")
    oom = shared_path(*folder, "gpt2_train.11672072.log")
    trained = shared_path(*folder, "gpt2_train.11685414.log")
    cmp = compare([oom, trained])
    assert cmp.first_parting[1] is None
    assert cmp.why[1] == (
        "no config difference logged; "
        "no training sign is logged by both runs, so none could be lined up"
    )


def test_the_signs_lined_up_are_the_ones_both_runs_logged() -> None:
    from forensics.compare import why

    assert why({}, None, 0, 1, ["loss", "lr"]) == (
        "no config difference logged; no training sign parted (loss, LR: the ones both runs logged)"
    )


def _panel_csv(path: Path) -> Path:
    """A W&B UI export of a panel with two runs (formats.md: "<run> - <metric>" columns with
    __MIN / __MAX); calm-sea-2 has a loss spike at step 3,000."""
    import csv

    rng = np.random.default_rng(2)
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        cols = ["brisk-pond-1", "calm-sea-2"]
        w.writerow(
            ["Step"] + [f"{r} - train/loss{x}" for r in cols for x in ("", "__MIN", "__MAX")]
        )
        for s in range(0, 5000, 10):
            a = 2 + np.exp(-s / 1000) + 0.02 * rng.standard_normal()
            b = 2.1 + np.exp(-s / 1000) + 0.02 * rng.standard_normal() + 2.0 * (3000 <= s < 3030)
            w.writerow([s, a, a - 0.05, a + 0.05, b, b - 0.05, b + 0.05])
    return path


def test_compare_puts_the_runs_of_one_exported_file_side_by_side(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One CSV holding two runs: `analyze` asks to point at one of them, which no path can do,
    and `compare` said it needs two runs. It now compares the runs in the file, by name."""
    monkeypatch.chdir(tmp_path)
    csv_file = _panel_csv(tmp_path / "wandb_export.csv")
    res = runner.invoke(app, ["compare", str(csv_file), "--no-report"])
    assert res.exit_code == 0, res.output
    assert "calm-sea-2 vs brisk-pond-1" in res.output
    assert "only in calm-sea-2, info: loss_spike @ 3,000" in res.output
    one = runner.invoke(app, ["compare", str(SAMPLES / "healthy"), "--no-report"])
    assert one.exit_code == 2 and "compare needs at least two runs" in one.output
    # analyze no longer asks to point at one of the runs inside the file
    ana = runner.invoke(app, ["analyze", str(csv_file), "--no-report"])
    assert ana.exit_code == 2 and "point at one of them" not in ana.output
    assert "use --all to analyze each, or compare the file" in ana.output
    # nor when the file is the only one in the folder given (no path inside points at a run)
    for args in (["analyze", str(tmp_path), "--no-report"], ["metrics", str(tmp_path)]):
        res = runner.invoke(app, args)
        assert res.exit_code == 2 and "point at one of them" not in res.output, args
        assert "use --all to analyze each, or compare the folder" in res.output, args
    res = runner.invoke(app, ["compare", str(tmp_path), "--no-report"])
    assert res.exit_code == 0 and "calm-sea-2 vs brisk-pond-1" in res.output


def test_one_run_logged_as_float32_and_as_float64_never_parts(tmp_path: Path) -> None:
    """The same numbers in an event file (float32: 3e-4 reads back as 0.00030000001) and in
    JSONL (float64). The constant LR has no step noise, so the band was 1e-9 of the value
    wide and the storage's rounding "parted the LR at step 1"."""
    from tensorboardX import SummaryWriter

    rng = np.random.default_rng(0)
    w = SummaryWriter(str(tmp_path / "tb"))
    lines = []
    for s in range(1, 801):
        loss, gn = 2 + 2 * np.exp(-s / 300) + 0.02 * rng.standard_normal(), 0.8
        w.add_scalar("train/loss", loss, s)
        w.add_scalar("train/grad_norm", gn, s)
        w.add_scalar("train/lr", 3e-4, s)
        lines.append(json.dumps({"step": s, "loss": loss, "grad_norm": gn, "lr": 3e-4}))
    w.close()
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    ref = Evidence(read_run(tmp_path / "tb"))
    other = Evidence(read_run(tmp_path / "metrics.jsonl"))
    assert float(ref.series("lr").values[0]) != 3e-4  # float32 as stored
    for metric in ("lr", "loss", "grad_norm"):
        (p,) = partings(ref, [other], metric)
        assert p is not None and p["step"] is None, (metric, p)


def test_the_end_value_of_a_climbing_loss_is_where_the_log_ends() -> None:
    """The "loss (end)" row is the median of the last 5% of points, at most 100: a loss that
    climbs by 0.0009 a step to 6.95 at step 12,000 read 6.54 over its last 600 points."""
    from forensics.compare import _vital

    steps = np.arange(1, 12001)
    rising = 2.5 + np.where(steps > 7000, 0.0009 * (steps - 7000), 0.0)
    ev = Evidence(run_from_frame(long_frame({"loss": (steps, rising)})))
    v = _vital(ev, "loss")
    assert v is not None and v["final"] == pytest.approx(float(np.median(rising[-100:])))
    assert rising[-1] - v["final"] < 0.05
    # A short log keeps its 5%: 400 points, the last 20.
    short = Evidence(
        run_from_frame(long_frame({"loss": (steps[:400], rising[:400] + steps[:400])}))
    )
    s = _vital(short, "loss")
    assert s is not None and s["final"] == pytest.approx(float(np.median(2.5 + steps[380:400])))


def _memory_run(folder: Path, onset: int) -> Path:
    """A JSONL log every 10 steps whose memory grows 2 MB a step from ``onset`` (one seed)."""
    rng = np.random.default_rng(1)
    s = np.arange(0, 6000, 10)
    loss = 2 + 3 / (1 + s / 500) + rng.normal(0, 0.01, len(s))
    mem = 20000 + rng.normal(0, 30, len(s)) + np.where(s > onset, (s - onset) * 2.0, 0)
    folder.mkdir()
    rows = [
        {"step": int(a), "loss": float(b), "memory_mb": float(c)}
        for a, b, c in zip(s, loss, mem, strict=True)
    ]
    (folder / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return folder


def test_fitted_onsets_whose_ranges_meet_are_one_finding_in_both(tmp_path: Path) -> None:
    """Two runs whose memory began to grow 40 steps apart (3,000 and 3,040): each onset is a
    bend fitted on bins, known only to a range (2,940-3,050 and 2,995-3,100). The comparison
    said "0 in both at the same step, 1 only in a, 1 only in b", a difference the log cannot
    show. They are now one finding in both, with each run's step and range; onsets whose
    ranges do not meet (3,000 and 3,400) stay apart."""
    import io

    from rich.console import Console

    from forensics.compare import print_comparison

    a = _memory_run(tmp_path / "a", 3000)
    b = _memory_run(tmp_path / "b", 3040)
    c = _memory_run(tmp_path / "c", 3400)
    cmp = compare([a, b, c])
    fa = next(f for f in cmp.diagnoses[0].findings if f.kind.value == "memory_growth")
    fb = next(f for f in cmp.diagnoses[1].findings if f.kind.value == "memory_growth")
    fc = next(f for f in cmp.diagnoses[2].findings if f.kind.value == "memory_growth")
    assert fa.onset_range is not None and fb.onset_range is not None
    assert fc.onset_range is not None
    assert abs(fa.start_step - fb.start_step) > 2  # not "the same step"
    assert fb.onset_range[0] <= fa.onset_range[1] and fa.onset_range[0] <= fb.onset_range[1]
    assert fc.onset_range[0] > fa.onset_range[1]
    ab, ac = cmp.finding_diff[1], cmp.finding_diff[2]
    assert ab is not None and ac is not None
    (both,) = [f for f in ab["both"] if f["kind"] == "memory_growth"]
    assert (both["step"], both["other_step"]) == (fa.start_step, fb.start_step)
    assert both["onset_range"] == list(fa.onset_range)
    assert both["other_onset_range"] == list(fb.onset_range)
    assert not [f for f in ab["only_reference"] + ab["only_other"] if f["kind"] == "memory_growth"]
    assert [f["kind"] for f in ac["only_reference"]] == ["memory_growth"]
    assert [f["kind"] for f in ac["only_other"]] == ["memory_growth"]
    out = io.StringIO()
    print_comparison(cmp, console=Console(file=out, width=300))
    text = out.getvalue()
    lo, hi = fa.onset_range
    assert f"memory_growth @ {fa.start_step:,} (anywhere in {lo:,}-{hi:,})" in text
    lo_b, hi_b = fb.onset_range
    assert (
        f"in both: memory_growth @ {fa.start_step:,} (anywhere in {lo:,}-{hi:,}) in a, "
        f"@ {fb.start_step:,} (anywhere in {lo_b:,}-{hi_b:,}) in b" in text
    ), text
    assert "1 in both (1 by their fitted onsets' ranges), " in text
    lo_c, hi_c = fc.onset_range
    assert (
        f"only in c, warning: memory_growth @ {fc.start_step:,} (anywhere in {lo_c:,}-{hi_c:,})"
        in text
    )
    # The comparison page says the same.
    from forensics.report.compare_page import render_compare_html

    page = " ".join(re.sub(r"<[^>]+>", "", render_compare_html(cmp, plotlyjs="cdn")).split())
    assert (
        f"in both: memory_growth at step {fa.start_step:,} (anywhere in {lo:,}-{hi:,}) in a, "
        f"{fb.start_step:,} (anywhere in {lo_b:,}-{hi_b:,}) in b (fitted onsets whose ranges "
        "meet: the logs cannot tell them apart)" in page
    ), page[:3000]
    assert (
        f"only in c: memory_growth at step {fc.start_step:,} (anywhere in {lo_c:,}-{hi_c:,})"
        in page
    )


def test_a_run_given_twice_is_said_so(tmp_path: Path) -> None:
    """The same folder twice (once with a trailing slash): a note says the second is the
    first again, so "no sign parted" reads as what it is; two copies at different paths get
    no such note."""
    import shutil

    run = write_tb_run(tmp_path / "exp", n=200)
    cmp = compare([run, f"{run}/"])
    assert cmp.notes == [
        f"{cmp.labels[1]} is {cmp.labels[0]} given again (the same path): every value is the same"
    ]
    assert cmp.to_document()["notes"] == cmp.notes
    shutil.copytree(run, tmp_path / "copy" / "exp")
    assert compare([run, tmp_path / "copy" / "exp"]).notes == []
