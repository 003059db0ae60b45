"""What a `forensics watch` poll costs against a full `analyze` of the same run.

``python -m benchmarks.watch_poll [--size 1M] [--new 1000] [--formats tfevents,jsonl]``

For each format, the synthetic run of :mod:`benchmarks.generate` (``--size`` steps) is copied
into a temporary folder without its last ``--new`` steps (cut at a record / line boundary);
a :class:`~forensics.watch.tail.RunTail` reads it (untimed), the missing steps are appended,
and the poll is timed: the tail's incremental read, the merge into a Run and
:func:`forensics.pipeline.analyze_run` (evidence, detectors, diagnosis) on the updated run,
as the watcher does on each poll, with what the watcher carries from poll to poll
(:mod:`forensics.watch.incremental`: the view, series, spike trend fits and local filters)
filled by an untimed analysis before the append (the previous poll); the same analysis
without any reuse is timed too. The reference is a full analyze of the
complete run: ``read_run`` with the cache off, then ``analyze_run``. Both are timed in this
process (wall
and CPU seconds), in turns, ``--repeat`` times; the ratio quoted is the median of the
pairwise ratios; the read alone is also compared (the tail's poll against ``read_run``, CPU
seconds). The issue's reference, "a full `analyze`", is also timed as the command a user runs
(``python -m forensics analyze RUN --no-cache --out ...``: start-up, read, analysis, report; its
CPU seconds from ``os.wait4``). Target: poll / that command <= 0.25; the in-process ratio
(read_run + analyze_run, no start-up, no report) is the stricter one and is printed beside it.
Nothing asserts a time.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from benchmarks import generate

TARGET = 0.25


def _size(text: str) -> int:
    from benchmarks.__main__ import _size as parse

    return parse(text)


def _cut_before(path: Path, kind: str, n_steps: int, new: int) -> int:
    """Byte offset where the last ``new`` steps of the file begin."""
    data = path.read_bytes()
    if kind == "jsonl":  # one line per step
        pos = len(data)
        for _ in range(new):
            pos = data.rfind(b"\n", 0, pos - 1) + 1
        return pos
    import numpy as np

    from forensics.importers.tfevents_scan import decode_fast_chunked, walk

    fr = walk(data, 1 << 30)
    fast = decode_fast_chunked(np.frombuffer(data, dtype=np.uint8), fr.offs, fr.lens)
    late = fast.rec[fast.matched[fast.rec] & (fast.step >= n_steps - new)]
    return int(fr.offs[int(late.min())])


def _timed(fn) -> tuple[float, float, object]:  # noqa: ANN001
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    return time.perf_counter() - w, time.process_time() - c, out


def measure(kind: str, n_steps: int, new: int, repeat: int, data: Path) -> dict[str, float]:
    from forensics.importers import ReadOptions, read_run
    from forensics.pipeline import analyze_run
    from forensics.watch.incremental import IncrementalAnalysis
    from forensics.watch.tail import RunTail

    folder = generate.build(data, kind, n_steps) / "run"
    (src,) = [p for p in folder.iterdir() if p.is_file()]
    cut = _cut_before(src, kind, n_steps, new)
    full_bytes = src.stat().st_size
    opts = ReadOptions(cache=False)
    import sys

    from benchmarks.measure import run as run_command

    fulls, full_reads, polls, reads, grown = [], [], [], [], []
    commands: list[float] = []
    bare, hits, fits = [], [], []
    with tempfile.TemporaryDirectory(prefix="watch-poll-") as tmp:
        for _ in range(repeat):
            w, c, run = _timed(lambda: read_run(folder, options=opts))
            w2, c2, _ = _timed(lambda r=run: analyze_run(r))
            fulls.append((w + w2, c + c2))
            full_reads.append((w, c))
            del run
            # The command a user runs: a process that starts, reads (no cache), analyses and
            # writes the report (outside the run folder).
            cmd = [sys.executable, "-m", "forensics", "analyze", str(folder), "--no-cache"]
            commands.append(run_command(cmd + ["--out", str(Path(tmp) / "full.html")]).cpu)
            run_dir = Path(tmp) / "run"
            shutil.rmtree(run_dir, ignore_errors=True)
            run_dir.mkdir()
            dst = run_dir / src.name
            with src.open("rb") as fi, dst.open("wb") as fo:
                fo.write(fi.read(cut))
            tail = RunTail(run_dir, opts)
            tail.poll()
            # The previous poll's analysis (untimed): what the watcher carries.
            carry = IncrementalAnalysis()
            assert tail.run is not None  # (the poll read the cut file)
            carry.analyze(tail.run)
            memo = carry.memo
            memo.hits = memo.misses = memo.measure_hits = memo.measure_misses = 0
            before = tail.bytes_read
            with src.open("rb") as fi, dst.open("ab") as fo:
                fi.seek(cut)
                fo.write(fi.read())
            wr, cr, changed = _timed(tail.poll)
            assert changed and tail.run is not None
            wa, ca, _ = _timed(lambda t=tail, c=carry: c.analyze(t.run))
            hits.append(memo.measure_hits)
            fits.append(memo.measure_hits + memo.measure_misses)
            # The same analysis without the memo: what a poll cost before the reuse.
            # (on a copy of the run without its cached view: nothing carried)
            fresh = replace(tail.run, _view=None, _metrics=None, _parts=None, _cached_for=None)
            wb, cb, _ = _timed(lambda r=fresh: analyze_run(r))
            reads.append((wr, cr))
            polls.append((wr + wa, cr + ca))
            bare.append((wr + wb, cr + cb))
            grown.append(tail.bytes_read - before)
            del tail
    return {
        "full_wall": statistics.median(w for w, _ in fulls),
        "full_cpu": statistics.median(c for _, c in fulls),
        "poll_wall": statistics.median(w for w, _ in polls),
        "poll_cpu": statistics.median(c for _, c in polls),
        "read_wall": statistics.median(w for w, _ in reads),
        "full_read_wall": statistics.median(w for w, _ in full_reads),
        "read_ratio": statistics.median(
            p[1] / f[1] for p, f in zip(reads, full_reads, strict=True)
        ),
        "ratio_wall": statistics.median(p[0] / f[0] for p, f in zip(polls, fulls, strict=True)),
        "ratio_cpu": statistics.median(p[1] / f[1] for p, f in zip(polls, fulls, strict=True)),
        "bare_ratio_cpu": statistics.median(p[1] / f[1] for p, f in zip(bare, fulls, strict=True)),
        "command_cpu": statistics.median(commands),
        "command_ratio_cpu": statistics.median(
            p[1] / c for p, c in zip(polls, commands, strict=True)
        ),
        "reused": statistics.median(hits),
        "fits": statistics.median(fits),
        "bytes_new": full_bytes - cut,
        "bytes_read": statistics.median(grown),
        "bytes_file": full_bytes,
    }


def main(argv: list[str] | None = None) -> int:
    from benchmarks.__main__ import _label, default_data_dir

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=_size, default=1_000_000)
    ap.add_argument("--new", type=_size, default=1000, help="steps appended before the poll")
    ap.add_argument("--formats", default="tfevents,jsonl")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--data", type=Path, default=default_data_dir())
    args = ap.parse_args(argv)
    print(
        f"| format | steps | full analyze s (cpu) | of which read s | poll s (cpu) | "
        f"of which read s | bytes read / appended | read: poll / full (cpu) | "
        f"spike measures reused | poll / analyze in process | without reuse (cpu) | "
        f"`forensics analyze` command cpu s | poll / command cpu (target <= {TARGET}) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for kind in args.formats.split(","):
        m = measure(kind, args.size, args.new, args.repeat, args.data)
        print(
            f"| {kind} | {_label(args.size)} (+{args.new}) | {m['full_wall']:.2f} "
            f"({m['full_cpu']:.2f}) | {m['full_read_wall']:.2f} | {m['poll_wall']:.2f} "
            f"({m['poll_cpu']:.2f}) | {m['read_wall']:.2f} | {m['bytes_read']:,.0f} / "
            f"{m['bytes_new']:,} of {m['bytes_file']:,} | {m['read_ratio']:.3f} | "
            f"{m['reused']:,.0f} / {m['fits']:,.0f} | "
            f"{m['ratio_wall']:.3f} (cpu {m['ratio_cpu']:.3f}) | {m['bare_ratio_cpu']:.3f} | "
            f"{m['command_cpu']:.2f} | **{m['command_ratio_cpu']:.3f}** |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
