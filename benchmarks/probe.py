"""The reference commands the suite times beside forensics, one process each.

python -m benchmarks.probe tbparse RUN_DIR      # tbparse .scalars -> polars
python -m benchmarks.probe ea RUN_DIR           # TensorBoard EventAccumulator.Reload()
python -m benchmarks.probe ndjson FILE          # polars.read_ndjson
python -m benchmarks.probe read PATH [--no-cache]   # forensics.read_run alone
python -m benchmarks.probe stages PATH          # in-process seconds per stage and detector (JSON)
python -m benchmarks.probe memory PATH          # resident memory per stage and detector (MiB)
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def _tbparse(path: str) -> int:
    import polars as pl
    from tbparse import SummaryReader

    df = SummaryReader(path, extra_columns={"wall_time"}).scalars
    # pl.from_pandas wants pyarrow under pandas 3; numpy columns work everywhere.
    return pl.DataFrame({c: df[c].to_numpy() for c in df.columns}).height


def _ea(path: str) -> int:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    n = 0
    for f in sorted(Path(path).glob("*tfevents*")):
        acc = EventAccumulator(str(f), size_guidance={"scalars": 0})
        acc.Reload()
        n += sum(len(acc.Scalars(t)) for t in acc.Tags()["scalars"])
    return n


def _ndjson(path: str) -> int:
    import polars as pl

    return pl.read_ndjson(path).height


def _read(path: str, no_cache: bool) -> int:
    from forensics.importers import ReadOptions, read_run

    return read_run(path, options=ReadOptions(cache=not no_cache)).frame.height


def _stages(path: str) -> dict[str, float]:
    """CPU seconds per stage in one process (all threads): import, evidence + each detector,
    diagnosis. CPU rather than wall time: on a shared machine it moves less with the load."""
    from forensics.allocator import reusing_freed_pages
    from forensics.config import Config
    from forensics.detectors import build
    from forensics.diagnosis import diagnose
    from forensics.evidence import Evidence
    from forensics.findings import sort_findings
    from forensics.importers import ReadOptions, read_run

    out: dict[str, float] = {}
    t = time.process_time()
    run = read_run(path, options=ReadOptions(cache=False))
    out["import"] = time.process_time() - t
    out["points"] = float(run.frame.height)
    cfg = Config()
    with reusing_freed_pages(run.frame.height):  # (as the analyze command runs the analysis)
        t = time.process_time()
        ev = Evidence(run, cfg.params)
        out["evidence_init"] = time.process_time() - t
        findings = list(run.import_findings)
        total = time.process_time()
        for det in build(ev.params):
            t = time.process_time()
            findings.extend(det.detect(ev))
            out[f"detector:{det.name}"] = time.process_time() - t
        out["detect"] = time.process_time() - total + out["evidence_init"]
        t = time.process_time()
        # The evidence the detectors filled, as analyze_run passes it (no second spike search).
        diagnose(ev, sort_findings(findings), checkpoint_every=cfg.checkpoint_every)
        out["diagnose"] = time.process_time() - t
    return out


class _Rss:
    """Samples the process's resident set in a thread (polars' memory is invisible to
    tracemalloc): the largest seen under each stage label, and where each stage left it."""

    def __init__(self) -> None:
        import os
        import threading

        self.page = os.sysconf("SC_PAGE_SIZE")
        self.label = "start"
        self.peak: dict[str, float] = {}
        self.after: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def rss(self) -> float:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * self.page / 2**20

    def _loop(self) -> None:
        while not self._stop.wait(0.002):
            r, lab = self.rss(), self.label
            if r > self.peak.get(lab, 0.0):
                self.peak[lab] = r

    def stage(self, label: str) -> None:
        self.after[self.label] = self.rss()
        self.peak[self.label] = max(self.peak.get(self.label, 0.0), self.after[self.label])
        self.label = label

    def stop(self) -> None:
        self.stage("end")
        self._stop.set()
        self._thread.join()


def _hwm() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _memory(path: str) -> None:
    """Resident memory (MiB) per stage of ``analyze --no-report``: the largest seen inside each
    stage and what it left; the Run's view is its own stage (labelled where it is built)."""
    import forensics.importers as imp
    import forensics.run as run_mod
    from forensics.allocator import reusing_freed_pages
    from forensics.config import Config
    from forensics.detectors import build
    from forensics.diagnosis import diagnose
    from forensics.evidence import Evidence
    from forensics.findings import sort_findings
    from forensics.importers import ReadOptions, read_run

    rss = _Rss()

    def labelled(name, fn):  # type: ignore[no-untyped-def]
        def wrapper(*a, **k):  # type: ignore[no-untyped-def]
            before = rss.label
            rss.stage(f"{name} (in {before})")
            try:
                return fn(*a, **k)
            finally:
                rss.stage(before)

        return wrapper

    # The import's own stages: the format's reader, then the canonical form, then the merge.
    for name in ("conform", "convert_x_axis", "add_canonical", "merge_job"):
        setattr(imp, name, labelled(name, getattr(imp, name)))
    rss.stage("import")
    run = read_run(path, options=ReadOptions(cache=False))
    points = run.frame.height
    frame_mib = run.frame.estimated_size() / 2**20  # the rows the run holds (constants once)

    # The view's stages, where the run has them (labelled inside whichever stage builds it).
    for name in ("view_plan", "view_and_index"):
        if hasattr(run_mod, name):
            setattr(run_mod, name, labelled(name, getattr(run_mod, name)))
    if hasattr(run_mod.Run, "_reorder"):
        run_mod.Run._reorder = labelled("reorder", run_mod.Run._reorder)  # type: ignore[method-assign]
    cfg = Config()
    with reusing_freed_pages(points):  # (as the analyze command runs the analysis)
        rss.stage("evidence_init")
        ev = Evidence(run, cfg.params)
        findings = list(run.import_findings)
        for det in build(ev.params):
            rss.stage(f"detector:{det.name}")
            findings.extend(det.detect(ev))
        rss.stage("diagnose")
        diagnose(ev, sort_findings(findings), checkpoint_every=cfg.checkpoint_every)
    rss.stop()
    peak = _hwm()
    print(f"points {points:,}; peak (VmHWM) {peak:.0f} MiB = {peak * 2**20 / points:.0f} B/point")
    top = max(rss.peak, key=rss.peak.__getitem__)
    print(
        f"frame {frame_mib:.0f} MiB = {frame_mib * 2**20 / points:.0f} B/point; "
        f"largest sampled stage: {top} ({rss.peak[top]:.0f} MiB)"
    )
    print(f"{'stage':40s} {'peak MiB':>9s} {'after MiB':>9s}")
    for lab, pk in rss.peak.items():
        print(f"{lab:40s} {pk:9.0f} {rss.after.get(lab, float('nan')):9.0f}")


def _like_the_command(command: str) -> None:
    """The process set up as the command line sets up ``command``, before numpy and polars
    load: numpy without its huge-page requests and with one BLAS thread, polars' allocator
    returning freed pages at once, two glibc arenas, the collector run less often. Without
    them the stages are not the command's: at 10M steps the import alone took 31 s here
    (21 s of it system time, the kernel compacting memory for numpy's huge pages) against
    12 s with them."""
    from forensics.cli import _collect_less, _fewer_arenas, _return_freed_memory
    from forensics.cli_quick import _numpy_with_one_blas_thread

    _numpy_with_one_blas_thread([command])
    _return_freed_memory(command)
    _fewer_arenas(command)
    _collect_less(command)


_USAGE = "usage: python -m benchmarks.probe {tbparse|ea|ndjson|read|stages|memory} PATH"


def main(argv: list[str]) -> None:
    if argv[:1] in (["-h"], ["--help"]):
        print(__doc__.strip())
        return
    if len(argv) < 2:
        print(_USAGE, file=sys.stderr)
        raise SystemExit(2)
    what, path = argv[0], argv[1]
    if what == "tbparse":
        print(_tbparse(path))
    elif what == "ea":
        print(_ea(path))
    elif what == "ndjson":
        print(_ndjson(path))
    elif what == "read":
        print(_read(path, "--no-cache" in argv))
    elif what == "stages":
        _like_the_command("analyze")
        print(json.dumps(_stages(path)))
    elif what == "memory":
        _like_the_command("analyze")
        _memory(path)
    else:
        raise SystemExit(f"unknown probe {what!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
