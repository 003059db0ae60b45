"""The reference commands the suite times beside forensics, one process each.

python -m benchmarks.probe tbparse RUN_DIR      # tbparse .scalars -> polars
python -m benchmarks.probe ea RUN_DIR           # TensorBoard EventAccumulator.Reload()
python -m benchmarks.probe ndjson FILE          # polars.read_ndjson
python -m benchmarks.probe read PATH [--no-cache]   # forensics.read_run alone
python -m benchmarks.probe stages PATH          # in-process seconds per stage and detector (JSON)
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


def main(argv: list[str]) -> None:
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
        print(json.dumps(_stages(path)))
    else:
        raise SystemExit(f"unknown probe {what!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
