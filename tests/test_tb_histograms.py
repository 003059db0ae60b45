"""Per-layer vitals from TensorBoard histograms: event files written by tensorboardX's and
torch's ``add_histogram`` (and TensorBoard's TF2 ``histogram_pb``) from a real tiny model's
weights, gradients and activations, checked against the exact tensors and against tbparse."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from forensics.importers import read_run
from forensics.importers.tb_histograms import META_KEY, classify, norm_bound
from forensics.schema import ACT_ABSMAX, ACT_STD, GRAD_NORM_LAYER, PARAM_NORM_LAYER

torch = pytest.importorskip("torch")
pytest.importorskip("tensorboardX")


def _model_and_steps(n_steps: int = 4):  # noqa: ANN202
    """A 3-block MLP trained a few SGD steps; per step the exact tensors that get logged."""
    torch.manual_seed(0)
    torch.set_num_threads(1)
    blocks = torch.nn.ModuleList(torch.nn.Linear(16, 16) for _ in range(3))
    opt = torch.optim.SGD(blocks.parameters(), lr=0.1)
    out = []
    for step in range(n_steps):
        x = torch.randn(32, 16)
        acts = {}
        h = x
        for i, b in enumerate(blocks):
            h = torch.tanh(b(h)) * (1 + 3 * i)  # deeper blocks: larger activations
            acts[i] = h.detach().clone()
        loss = h.pow(2).mean()
        opt.zero_grad()
        loss.backward()
        named = {
            f"layers.{i}.{n}": p for i, b in enumerate(blocks) for n, p in b.named_parameters()
        }
        out.append(
            {
                "step": step * 10,
                "weights": {k: p.detach().clone() for k, p in named.items()},
                "grads": {k: p.grad.detach().clone() for k, p in named.items()},
                "acts": acts,
            }
        )
        opt.step()
    return out


def _exact(steps: list[dict]) -> dict[tuple[str, int], dict[int, float]]:
    """(vital, layer) -> {step: exact value} from the tensors themselves (float64)."""
    want: dict[tuple[str, int], dict[int, float]] = {}
    for s in steps:
        for vital, key in ((PARAM_NORM_LAYER, "weights"), (GRAD_NORM_LAYER, "grads")):
            for layer in range(3):
                ss = sum(
                    float(t.double().pow(2).sum())
                    for k, t in s[key].items()
                    if k.startswith(f"layers.{layer}.")
                )
                want.setdefault((vital, layer), {})[s["step"]] = math.sqrt(ss)
        for layer, a in s["acts"].items():
            want.setdefault((ACT_ABSMAX, layer), {})[s["step"]] = float(a.abs().max())
            want.setdefault((ACT_STD, layer), {})[s["step"]] = float(a.double().std(unbiased=False))
    return want


def _write(logdir: Path, steps: list[dict], writer: str) -> None:
    if writer == "tensorboardX":
        from tensorboardX import SummaryWriter
    else:
        from torch.utils.tensorboard import SummaryWriter
    w = SummaryWriter(str(logdir))
    for s in steps:
        w.add_scalar("train/loss", 1.0, s["step"])
        for k, t in s["weights"].items():
            w.add_histogram(k, t, s["step"])
        for k, t in s["grads"].items():
            w.add_histogram(f"{k}.grad", t, s["step"])
        for i, a in s["acts"].items():
            w.add_histogram(f"activations/layers.{i}", a, s["step"])
    w.add_histogram("tok_emb.weight", torch.randn(8), 0)  # no layer index: a raw series
    w.close()


@pytest.mark.parametrize("writer", ["tensorboardX", "torch"])
def test_layer_vitals_equal_the_exact_tensors(tmp_path: Path, writer: str) -> None:
    """Both writers' histograms give each layer's param norm, grad norm (root of the summed
    squared norms of its weight and bias), activation absmax and std as computed from the
    tensors: norms and std to 1e-9 relative, absmax exactly."""
    steps = _model_and_steps()
    _write(tmp_path, steps, writer)
    run = read_run(tmp_path)
    for (vital, layer), by_step in _exact(steps).items():
        got = run.series(vital, layer=layer)
        assert dict(zip(got["step"], got["value"], strict=True)) == pytest.approx(
            by_step, rel=1e-9 if vital != ACT_ABSMAX else 0
        ), (vital, layer)
    assert run.layers(GRAD_NORM_LAYER) == [0, 1, 2]
    tags = run.frame.filter(pl.col("metric") == GRAD_NORM_LAYER).get_column("tag").unique()
    assert tags.sort().to_list() == [
        f"grad_norm_layer[layer {i}] from 2 histograms" for i in range(3)
    ]
    notes = " | ".join(run.notes)
    assert (
        "12 histogram tags read as per-layer vital signs" not in notes
    )  # 6 grad + 6 weight + 3 act
    assert (
        "3 activation, 6 gradient, 6 weight histogram tags read as per-layer vital signs" in notes
    )
    assert "1 histogram tags name no layer index" in notes and "tok_emb.weight" in notes
    assert META_KEY not in run.metadata  # a hand-over, not a fact for the report


def test_histograms_in_a_split_subfolder_keep_its_prefix(tmp_path: Path) -> None:
    """Histograms written in a Keras-style train/ sub-folder are found under their prefixed
    tags (train/layers.0.weight/norm) and still give the layer's param norm."""
    from torch.utils.tensorboard import SummaryWriter

    w = SummaryWriter(str(tmp_path / "train"))
    v = SummaryWriter(str(tmp_path / "validation"))
    for step in range(3):
        w.add_scalar("loss", 1.0, step)
        v.add_scalar("loss", 1.5, step)
        w.add_histogram("layers.0.weight", torch.full((4,), float(step + 1)), step)
    w.close()
    v.close()
    run = read_run(tmp_path)
    s = run.frame.filter(pl.col("metric") == PARAM_NORM_LAYER).sort("step")
    assert s["tag"].unique().to_list() == ["train/layers.0.weight/norm"]
    assert s["layer"].unique().to_list() == [0]
    assert s["value"].to_list() == pytest.approx([2.0, 4.0, 6.0])


@pytest.mark.parametrize("writer", ["tensorboardX", "torch"])
def test_histogram_stats_equal_tbparse(tmp_path: Path, writer: str) -> None:
    """Each histogram's min, max, mean and norm equal tbparse's min, max, sum/num and
    sqrt(sum_squares) for the same records."""
    from tbparse import SummaryReader

    steps = _model_and_steps(2)
    _write(tmp_path, steps, writer)
    ref = SummaryReader(
        str(tmp_path), extra_columns={"min", "max", "num", "sum", "sum_squares"}
    ).histograms
    assert len(ref) == 2 * (12 + 3) + 1
    f = read_run(tmp_path).frame
    ours = {(t, s): v for t, s, v in f.select("tag", "step", "value").iter_rows()}
    for row in ref.itertuples():
        got = {
            st: ours[(f"{row.tag}/{st}", int(row.step))]
            for st in ("min", "max", "mean", "norm", "absmax")
        }
        assert got["min"] == row.min and got["max"] == row.max
        assert got["mean"] == pytest.approx(row.sum / row.num, rel=1e-12)
        assert got["norm"] == pytest.approx(math.sqrt(row.sum_squares), rel=1e-12)
        assert got["absmax"] == max(abs(row.min), abs(row.max))


def _write_tf2(logdir: Path, tensors: dict[str, list[np.ndarray]], buckets: int) -> None:
    """TF2-format histograms ([k, 3] bucket tensors) from TensorBoard's own histogram_pb."""
    from tensorboard.plugins.histogram.summary_v2 import histogram_pb
    from torch.utils.tensorboard import SummaryWriter

    w = SummaryWriter(str(logdir))
    fw = w._get_file_writer()
    for tag, series in tensors.items():
        for step, x in enumerate(series):
            fw.add_summary(histogram_pb(tag, x, buckets=buckets), step * 5)
    w.close()


def test_bucket_only_histograms_estimated_within_the_stated_bound(tmp_path: Path) -> None:
    """TF2 bucket histograms (no sum of squares): the layer grad norm is an estimate within
    the bound the note states, and that bound holds the true error; the bucket tensors equal
    tbparse's."""
    from tbparse import SummaryReader

    steps = _model_and_steps(3)
    grads = {
        f"gradients/{k}": [s["grads"][k].numpy().ravel().astype(np.float64) for s in steps]
        for k in steps[0]["grads"]
        if k.endswith("weight")
    }
    _write_tf2(tmp_path, grads, buckets=30)
    run = read_run(tmp_path)
    note = next(n for n in run.notes if "hold only buckets" in n)
    assert note.startswith("TensorBoard histograms: 3 histogram tags hold only buckets")
    stated = float(note.rsplit("within ", 1)[1].split("%")[0]) / 100
    exact = _exact(steps)
    worst = 0.0
    for layer in range(3):
        got = run.series(GRAD_NORM_LAYER, layer=layer)
        for s, v in zip(got["step"], got["value"], strict=True):
            w = math.sqrt(
                float(steps[s // 5]["grads"][f"layers.{layer}.weight"].double().pow(2).sum())
            )
            worst = max(worst, abs(v / w - 1))
            assert abs(v / w - 1) <= stated + 5e-4
    assert 0 < worst < 0.05 and stated < 0.5  # an estimate: close, not exact
    assert exact  # the exact reference was built from the same tensors
    ref = SummaryReader(str(tmp_path)).tensors
    f = run.frame
    for row in ref.itertuples():
        arr = np.asarray(row.value, dtype=np.float64).reshape(-1, 3)
        c = (arr[:, 0] + arr[:, 1]) / 2
        norm = f.filter((pl.col("tag") == f"{row.tag}/norm") & (pl.col("step") == row.step))
        assert norm["value"][0] == pytest.approx(math.sqrt((arr[:, 2] * c * c).sum()), rel=1e-12)
        assert norm_bound(arr) <= stated + 1e-12


def test_norm_bound_holds_for_values_anywhere_in_their_buckets() -> None:
    """norm_bound is the largest relative error of the centre estimate over every placement of
    the values within their buckets (here: all at the edges that give the extremes)."""
    arr = np.array([[-2.0, -1.0, 3.0], [-1.0, 1.0, 4.0], [1.0, 3.0, 2.0]])
    est = math.sqrt(3 * 1.5**2 + 4 * 0 + 2 * 2**2)
    hi = math.sqrt(3 * 4 + 4 * 1 + 2 * 9)
    lo = math.sqrt(3 * 1 + 0 + 2 * 1)
    assert norm_bound(arr) == pytest.approx(max(hi / est - 1, 1 - lo / est))


def test_scalars_win_over_histograms(tmp_path: Path) -> None:
    """A run logging per-layer grad norms as scalars and as histograms: grad_norm_layer comes
    from the scalars only, the note says so; param norms still come from the histograms."""
    from torch.utils.tensorboard import SummaryWriter

    steps = _model_and_steps(3)
    _write(tmp_path, steps, "torch")
    w = SummaryWriter(str(tmp_path), filename_suffix=".scalars")  # a second file, same job
    for s in steps:
        for layer in range(3):
            w.add_scalar(f"grad_norm/layers.{layer}", 100.0 + layer, s["step"])
    w.close()
    run = read_run(tmp_path)
    g = run.frame.filter(pl.col("metric") == GRAD_NORM_LAYER)
    assert set(g.get_column("value").to_list()) == {100.0, 101.0, 102.0}
    assert any("6 histogram tags not used for grad_norm_layer" in n for n in run.notes)
    assert run.layers(PARAM_NORM_LAYER) == [0, 1, 2]


@pytest.mark.parametrize(
    "tag, kind, layer",
    [
        ("layers.3.mlp.weight", "weight", 3),
        ("layers.3.mlp.weight.grad", "grad", 3),
        ("grad/transformer.h.7.attn.c_proj.weight", "grad", 7),
        ("gradients/model.layers.4.mlp", "grad", 4),
        ("layers.2.attn.in_proj_weight", "weight", 2),
        ("parameters/blocks.1.ln", "weight", 1),
        ("bert.encoder.layer.3.output.dense.weight", "weight", 3),
        ("activations/layers.5", "act", 5),
        ("blocks.0.output", "act", 0),
        ("act/block_2", "act", 2),
        ("tok_emb.weight", "weight", None),
        ("layers.3.attn", None, 3),
    ],
)
def test_classify_histogram_tags(tag: str, kind: str | None, layer: int | None) -> None:
    """Histogram tag names of common codebases map to their kind and layer index."""
    assert classify(tag) == (kind, layer)


def test_embedding_and_head_gradient_histograms(tmp_path: Path) -> None:
    """A tiny language model's gradient histograms named without a layer index: the token
    embedding's (one histogram) and the output head's (weight and bias) are the modules'
    grad norms, exact against the tensors; a norm layer's gradient stays a raw series."""
    from tensorboardX import SummaryWriter

    from forensics.schema import GRAD_NORM_EMBED, GRAD_NORM_HEAD

    torch.manual_seed(0)
    torch.set_num_threads(1)
    embed = torch.nn.Embedding(50, 8)
    block = torch.nn.Linear(8, 8)
    norm = torch.nn.LayerNorm(8)
    head = torch.nn.Linear(8, 50)
    params = [*embed.parameters(), *block.parameters(), *norm.parameters(), *head.parameters()]
    opt = torch.optim.SGD(params, lr=0.1)
    w = SummaryWriter(str(tmp_path))
    want: dict[str, dict[int, float]] = {GRAD_NORM_EMBED: {}, GRAD_NORM_HEAD: {}}
    for step in range(4):
        x = torch.randint(0, 50, (16,))
        logits = head(norm(torch.tanh(block(embed(x)))))
        loss = torch.nn.functional.cross_entropy(logits, torch.roll(x, 1))
        opt.zero_grad()
        loss.backward()
        w.add_scalar("train/loss", float(loss), step)
        w.add_histogram("embed.weight.grad", embed.weight.grad, step)
        w.add_histogram("layers.0.weight.grad", block.weight.grad, step)
        w.add_histogram("ln_f.weight.grad", norm.weight.grad, step)
        for n, p in head.named_parameters():
            w.add_histogram(f"lm_head.{n}.grad", p.grad, step)
        want[GRAD_NORM_EMBED][step] = float(embed.weight.grad.double().norm())
        want[GRAD_NORM_HEAD][step] = math.sqrt(
            sum(float(p.grad.double().pow(2).sum()) for p in head.parameters())
        )
        opt.step()
    w.close()
    run = read_run(tmp_path)
    for vital, by_step in want.items():
        got = run.series(vital)
        assert dict(zip(got["step"], got["value"], strict=True)) == pytest.approx(
            by_step, rel=1e-9
        ), vital
    assert run.metrics()[GRAD_NORM_EMBED] == "embed.weight.grad/norm"
    assert run.metrics()[GRAD_NORM_HEAD] == "grad_norm_head from 2 histograms"
    notes = " | ".join(run.notes)
    assert "grad_norm_embed, grad_norm_head, grad_norm_layer (1 layers)" in notes, notes
    assert "1 histogram tags name no layer index" in notes and "ln_f.weight.grad" in notes
