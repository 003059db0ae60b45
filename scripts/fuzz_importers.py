"""Fuzz the importers and the CLI for a bounded time; keep what breaks them as a corpus.

Each round takes a seed log (every format the tool reads, written by the real writers where
they exist, plus the hostile inputs of issue 18 kept in ``tests/fuzz_corpus/``), damages it
(cut, bit flips, inserted or duplicated bytes, a zero-filled tail, NUL bytes, UTF-16, odd
numbers, control characters in names) and checks the guarantees:

* ``read_run`` returns a Run or raises the project's one-line error; nothing else;
* every ``--cli-every``-th input also goes through ``forensics analyze`` in-process: exit 0/1
  with a complete findings document, or exit 2 with one stderr line; stderr holds only the
  project's lines; the run folder is unchanged; no temporary file is left.

An input that breaks a guarantee is saved under ``tests/fuzz_corpus/found/`` (named by its
hash, with the failure next to it); ``tests/test_fuzz_corpus.py`` replays the corpus in CI.

    python scripts/fuzz_importers.py --seconds 60 --seed 1
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import sys
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
CORPUS = ROOT / "tests" / "fuzz_corpus"


# -- seeds ---------------------------------------------------------------------------------
def _jsonl(n: int = 120) -> bytes:
    rows = [
        {"step": i, "loss": 3 - i / 100, "grad_norm": 1 + (i % 7) / 10, "lr": 3e-4}
        for i in range(n)
    ]
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def _nanogpt(n: int = 120) -> bytes:
    return "".join(
        f"iter {i}: loss {3 - i / 100:.4f}, time 10.00ms, mfu 1.00%\n" for i in range(n)
    ).encode()


def _megatron(n: int = 60) -> bytes:
    return "".join(
        f" iteration {i:8d}/ 1000 | consumed samples: {i * 8:10d} | elapsed time per iteration "
        f"(ms): 100.0 | learning rate: 3.000E-04 | global batch size: 8 | lm loss: "
        f"{3 - i / 100:.6E} | loss scale: 65536.0 | grad norm: 1.234 | number of skipped "
        "iterations: 0 | number of nan iterations: 0 |\n"
        for i in range(1, n)
    ).encode()


def _deepspeed_chat(n: int = 60) -> bytes:
    return "".join(
        f"epoch: 0|step: {i}|ppo_ep: 1|act_loss: {0.5 + i / 100}|cri_loss: 0.3|unsuper_loss: 0.0\n"
        for i in range(n)
    ).encode()


def _state(n: int = 80) -> bytes:
    hist = [{"step": i, "loss": 2 - i / 100, "grad_norm": 1.0} for i in range(1, n + 1)]
    return json.dumps({"global_step": n, "log_history": hist}).encode()


def _csv(n: int = 80) -> bytes:
    return (
        "step,train_loss,lr\n" + "".join(f"{i},{3 - i / 100},0.001\n" for i in range(n))
    ).encode()


def _events() -> bytes:
    try:
        from tensorboardX import SummaryWriter
    except ImportError:
        return b""
    with tempfile.TemporaryDirectory() as d:
        w = SummaryWriter(d)
        for s in range(80):
            w.add_scalar("train/loss", 3 - s / 100, s)
            w.add_scalar("train/grad_norm", 1.0, s)
        w.close()
        (f,) = Path(d).glob("events*")
        return f.read_bytes()


def seeds() -> list[tuple[str, bytes]]:
    """(file name, content) pairs: fresh logs of each format plus the kept corpus."""
    out = [
        ("m.jsonl", _jsonl()),
        ("train.log", _nanogpt()),
        ("megatron.log", _megatron()),
        ("chat.log", _deepspeed_chat()),
        ("trainer_state.json", _state()),
        ("metrics.csv", _csv()),
    ]
    ev = _events()
    if ev:
        out.append(("events.out.tfevents.1700000000.host", ev))
    for p in sorted(CORPUS.rglob("*")):
        if p.is_file() and p.suffix != ".txt" and p.name != "README.md" and p.name[0] != ".":
            out.append((corpus_name(p), p.read_bytes()))
    return out


def corpus_name(p: Path) -> str:
    """The log file name a corpus file stands for: ``<hash>__<name>`` -> ``<name>``."""
    return p.name.split("__", 1)[-1]


# -- mutations -------------------------------------------------------------------------------
ODD = [
    b"\x00",
    b"\xff\xfe",
    b"\xef\xbb\xbf",
    b"\xe9",
    b"\x1b]0;t\x07",
    b"\u2028".decode("unicode_escape").encode(),
    b"\x85",
    b"9" * 400,
    str(2**63).encode(),
    str(-(2**63)).encode(),
    b"1e308",
    b"NaN",
    b"-Infinity",
    b'"\\ud800"',
    b"[" * 2000,
    b"\n",
    b"\r",
    b"   ",
    b"{",
    b"}",
    b"|",
    b",",
]


def mutate(rng: random.Random, data: bytes) -> tuple[str, bytes]:
    kind = rng.choice(
        ["cut", "flip", "insert", "odd", "zero_tail", "dup", "utf16", "nul_lines", "stack"]
    )
    n = len(data)
    if kind == "cut":
        return kind, data[: rng.randrange(n + 1)]
    if kind == "flip":
        b = bytearray(data)
        for _ in range(rng.randint(1, 16)):
            if b:
                b[rng.randrange(len(b))] = rng.randrange(256)
        return kind, bytes(b)
    if kind == "insert":
        i = rng.randrange(n + 1)
        return kind, data[:i] + rng.randbytes(rng.randint(1, 64)) + data[i:]
    if kind == "odd":
        b = data
        for _ in range(rng.randint(1, 4)):
            i = rng.randrange(len(b) + 1)
            b = b[:i] + rng.choice(ODD) + b[i:]
        return kind, b
    if kind == "zero_tail":
        i = rng.randrange(n + 1)
        return kind, data[:i] + b"\0" * ((i // 4096 + 1) * 4096 - i)
    if kind == "dup":
        i, j = sorted(rng.randrange(n + 1) for _ in range(2))
        return kind, data[:j] + data[i:j] * rng.randint(1, 3) + data[j:]
    if kind == "utf16":
        return kind, data.decode("utf-8", "replace").encode(rng.choice(["utf-16", "utf-16-le"]))
    if kind == "nul_lines":
        return kind, data.replace(b"\n", b"\n\x00\x00\n", rng.randint(1, 3))
    k1, once = mutate(rng, data)
    k2, twice = mutate(rng, once)
    return f"{k1}+{k2}", twice


# -- checks ----------------------------------------------------------------------------------
def check_read(folder: Path) -> str:
    """ "ok" | "error" (one line) | raises AssertionError on a broken guarantee."""
    from forensics.errors import ForensicsError
    from forensics.importers import read_run

    try:
        read_run(folder)
        return "ok"
    except ForensicsError as exc:
        if "\n" in str(exc):
            raise AssertionError(f"multi-line error: {exc!r}") from None
        return "error"


def _tree(folder: Path) -> dict[str, tuple[int, int, int]]:
    out = {}
    for dirpath, dirs, files in os.walk(folder):
        for f in dirs + files:
            p = Path(dirpath) / f
            s = p.lstat()
            out[str(p.relative_to(folder))] = (s.st_size, s.st_mode, s.st_mtime_ns)
    return out


def check_cli(folder: Path, work: Path) -> str:
    from typer.testing import CliRunner

    from forensics.cli import app

    before = _tree(folder)
    out = work / "out"
    res = CliRunner().invoke(
        app, ["analyze", str(folder), "--json", str(out / "f.json"), "-o", str(out / "r.html")]
    )
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    if res.exit_code not in (0, 1, 2):
        raise AssertionError(f"exit {res.exit_code}: {res.stderr[-500:]} {res.exception!r}")
    if not all(ln.startswith("forensics: ") for ln in lines) or any(
        "internal error" in ln for ln in lines
    ):
        raise AssertionError(f"stderr not ours: {res.stderr[-500:]}")
    if _tree(folder) != before:
        raise AssertionError("the run folder changed")
    if list(work.rglob("*.tmp")):
        raise AssertionError("a temporary file was left behind")
    if res.exit_code == 2:
        if len(lines) != 1:
            raise AssertionError(f"exit 2 with {len(lines)} stderr lines")
        return "error"
    json.loads((out / "f.json").read_text())
    if not (out / "r.html").read_text().rstrip().endswith("</html>"):
        raise AssertionError("partial report")
    return "ok"


def save(name: str, data: bytes, why: str) -> Path:
    digest = hashlib.sha256(data).hexdigest()[:16]
    dest = CORPUS / "found"
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / f"{digest}__{name}"
    path.write_bytes(data)
    (dest / f"{digest}__{name}.txt").write_text(why[-4000:])
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cli-every", type=int, default=10, help="every n-th input through the CLI")
    args = ap.parse_args(argv)
    import warnings

    warnings.simplefilter("ignore")
    rng = random.Random(args.seed)
    pool = seeds()
    counts: Counter[str] = Counter()
    failures = 0
    work = Path(tempfile.mkdtemp(prefix="forensics-fuzz-"))
    end = time.monotonic() + args.seconds
    i = 0
    try:
        while time.monotonic() < end:
            i += 1
            name, seed = rng.choice(pool)
            kind, data = mutate(rng, seed)
            case = work / f"c{i}"
            run = case / "run"
            run.mkdir(parents=True)
            (run / name).write_bytes(data)
            fmt = name.split(".")[-1] if "tfevents" not in name else "tfevents"
            try:
                outcome = check_read(run)
                if i % args.cli_every == 0:
                    outcome = check_cli(run, case) + "+cli"
                counts[f"{fmt} {kind.split('+')[0]} {outcome}"] += 1
            except Exception as exc:  # noqa: BLE001 - a fuzzer reports everything
                failures += 1
                why = "".join(traceback.format_exception(exc))
                path = save(name, data, why)
                counts[f"{fmt} {kind.split('+')[0]} FAILED"] += 1
                print(f"FAILED {path.name}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
            shutil.rmtree(case, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    total = sum(counts.values())
    by_fmt: Counter[str] = Counter()
    by_kind: Counter[str] = Counter()
    by_outcome: Counter[str] = Counter()
    for key, n in counts.items():
        f, k, o = key.split(" ")
        by_fmt[f] += n
        by_kind[k] += n
        by_outcome[o] += n
    print(f"inputs: {total} in {args.seconds:.0f} s (seed {args.seed}, {len(pool)} seeds)")
    print("formats:", ", ".join(f"{k} {v}" for k, v in sorted(by_fmt.items())))
    print("mutations:", ", ".join(f"{k} {v}" for k, v in sorted(by_kind.items())))
    print("outcomes:", ", ".join(f"{k} {v}" for k, v in sorted(by_outcome.items())))
    print(f"failures: {failures}")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
