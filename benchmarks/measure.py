"""Whole-process timing: wall and CPU seconds and peak memory of one command, A/B in turns."""

from __future__ import annotations

import math
import os
import statistics
import subprocess
import time
from dataclasses import dataclass, field


@dataclass
class Sample:
    wall: float
    cpu: float  # user + sys of the process and its children
    peak_mib: float  # largest resident set of the process (ru_maxrss)
    code: int


@dataclass
class Timing:
    samples: list[Sample] = field(default_factory=list)

    @property
    def wall(self) -> float:
        return statistics.median(s.wall for s in self.samples) if self.samples else math.nan

    @property
    def cpu(self) -> float:
        return statistics.median(s.cpu for s in self.samples) if self.samples else math.nan

    @property
    def peak_mib(self) -> float:
        return max((s.peak_mib for s in self.samples), default=math.nan)

    @property
    def ok(self) -> bool:
        return bool(self.samples) and all(s.code == 0 for s in self.samples)


def run(cmd: list[str], env: dict[str, str] | None = None, timeout: float = 3600) -> Sample:
    """Run cmd to completion; its own resource usage via wait4 (not the whole tree's maximum)."""
    full_env = {**os.environ, **(env or {})}
    t0 = time.perf_counter()
    p = subprocess.Popen(
        cmd, env=full_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
    )
    deadline = t0 + timeout
    while True:
        pid, status, ru = os.wait4(p.pid, os.WNOHANG)
        if pid:
            break
        if time.perf_counter() > deadline:
            p.kill()
            pid, status, ru = os.wait4(p.pid, 0)
            break
        time.sleep(0.005)
    wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    err = p.stderr.read().decode(errors="replace") if p.stderr else ""
    if p.returncode != 0:
        tail = "\n".join(err.strip().splitlines()[-5:])
        print(f"    ! exit {p.returncode}: {' '.join(cmd)}\n{tail}")
    return Sample(wall, ru.ru_utime + ru.ru_stime, ru.ru_maxrss / 1024.0, p.returncode)


def pair(
    a: list[str],
    b: list[str] | None,
    repeat: int,
    env_a: dict[str, str] | None = None,
    env_b: dict[str, str] | None = None,
    warmup: bool = True,
) -> tuple[Timing, Timing | None, dict[str, float]]:
    """A and B in turns (A B A B ...), so drifting machine load hits both; median ratios A/B."""
    ta, tb = Timing(), (Timing() if b else None)
    if warmup:
        run(a, env_a)
    for _ in range(repeat):
        ta.samples.append(run(a, env_a))
        if b and tb is not None:
            tb.samples.append(run(b, env_b))
    ratios: dict[str, float] = {}
    if tb is not None and tb.samples:
        ratios["wall"] = statistics.median(
            x.wall / y.wall for x, y in zip(ta.samples, tb.samples, strict=True)
        )
        ratios["cpu"] = statistics.median(
            x.cpu / y.cpu for x, y in zip(ta.samples, tb.samples, strict=True)
        )
    return ta, tb, ratios


def exponent(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of log(y) on log(x): 1 is linear, 2 quadratic."""
    pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys, strict=True) if x > 0 and y > 0]
    if len(pts) < 2:
        return math.nan
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    sxx = sum((p[0] - mx) ** 2 for p in pts)
    return sum((p[0] - mx) * (p[1] - my) for p in pts) / sxx if sxx else math.nan
