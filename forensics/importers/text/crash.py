"""How did the job end? Read the end of a log for the line that says it crashed.

Only the lines after the last metric line (bounded to the file's last few hundred lines)
are read: a traceback printed and survived mid-run is not how the job ended.
"""

from __future__ import annotations

import re

from forensics.findings import Finding, FindingKind, Severity

TAIL_LINES = 400
MAX_LINE = 200

# Reasons that end a job from outside (the scheduler, a person), not by a failure.
STOPPED = frozenset({"time_limit", "cancelled"})

# Most specific first: an OOM also prints a traceback, a time limit is also a cancel.
REASONS: list[tuple[str, re.Pattern[str]]] = [
    (
        "out_of_memory",
        re.compile(
            r"CUDA out of memory|OutOfMemoryError|\bout of memory\b|Cannot allocate memory|"
            r"oom[-_]kill|\bOOM\b|RESOURCE_EXHAUSTED|MemoryError",
            re.I,
        ),
    ),
    (
        "nccl",
        re.compile(
            r"NCCL error|ncclInternalError|ncclSystemError|ncclUnhandledCudaError|ncclRemoteError|"
            r"NCCL communicator was aborted|Watchdog caught collective operation timeout|"
            r"ProcessGroupNCCL.*(?:timeout|timed out|error)|NCCL WARN.*(?:timeout|error|failed)",
            re.I,
        ),
    ),
    (
        "cuda",
        re.compile(
            r"CUDA error|\[CUDA ERROR\]|cuBLAS error|\[cuBLAS ERROR\]|CUBLAS_STATUS_|CUDNN_STATUS_|"
            r"illegal memory access|misaligned address|device-side assert|cudaError\w*|\bXid\b",
            re.I,
        ),
    ),
    ("assertion", re.compile(r"AssertionError|Assertion `.*' failed|Assertion .* failed")),
    (
        "time_limit",
        re.compile(
            r"DUE TO TIME LIMIT|time limit (?:reached|exceeded)|TIMEOUT AT|job timed out", re.I
        ),
    ),
    (
        "cancelled",
        re.compile(
            r"CANCELLED AT|\bscancel\b|received SIGTERM|Received SIGTERM|Signals\.SIGTERM|"
            r"\bKeyboardInterrupt\b|SIGINT received"
        ),
    ),
    # A kill with no cancel before it: the kernel's out-of-memory killer sends SIGKILL too.
    ("killed", re.compile(r"\bSIGKILL\b")),
    (
        "traceback",
        re.compile(r"^Traceback \(most recent call last\)|^\w+(?:\.\w+)*(?:Error|Exception): "),
    ),
]


def find_crash(lines: list[str]) -> tuple[str, str] | None:
    """``(reason, line)`` for the most specific crash sign among ``lines``, or None."""
    for reason, pattern in REASONS:
        hit, start = None, 0
        for i, line in enumerate(lines):
            m = pattern.search(line)
            if m:
                hit, start = i, m.start()  # the last matching line: the final word on how it ended
                if reason != "traceback":
                    break  # the first sign of a crash is the cause; later lines echo it
        if hit is not None:
            return reason, _context(lines, hit, reason, start)
    return None


def _context(lines: list[str], i: int, reason: str, start: int = 0) -> str:
    line = lines[i].strip()
    if len(line) > MAX_LINE and start > MAX_LINE // 2:
        # A message glued to the end of a long line (progress output without a newline):
        # show the message, not the start of the line.
        line = lines[i][max(0, start - 40) :].strip()
    if reason == "traceback":
        # The exception line at the bottom of the traceback says more than its header.
        for j in range(i + 1, min(len(lines), i + 200)):
            s = lines[j].strip()
            if re.match(r"^\w+(?:\.\w+)*(?:Error|Exception|Interrupt)\b", s):
                line = s
    if line.endswith(":") and i + 1 < len(lines) and lines[i + 1].strip():
        line = (
            f"{line} {lines[i + 1].strip()}"  # "[CUDA ERROR] at file x.cu:265:" + "out of memory"
        )
    elif len(line) < 30 and i > 0 and lines[i - 1].strip():
        line = f"{lines[i - 1].strip()} {line}"
    return line[:MAX_LINE]


def crash_finding(tail_text: str, last_step: int | None, where: str = "") -> Finding | None:
    """A ``crash`` finding when the end of a log says the job died."""
    lines = tail_text.splitlines()[-TAIL_LINES:]
    found = find_crash(lines)
    if found is None:
        return None
    reason, line = found
    what = {
        "out_of_memory": "ran out of memory",
        "nccl": "failed in NCCL communication",
        "cuda": "hit a CUDA error",
        "assertion": "stopped on a failed assertion",
        "time_limit": "was stopped by the scheduler's time limit",
        "cancelled": "was cancelled",
        "killed": "was killed with SIGKILL (the kernel's out-of-memory killer, or a hard stop)",
        "traceback": "ended with a Python exception",
    }[reason]
    at = f"after step {last_step:,}" if last_step is not None else "before logging any step"
    # A time limit or a cancel is the scheduler or a person ending the job, not a failure of
    # the training: the run is unfinished (a warning), and nothing in it calls for a fix.
    stopped = reason in STOPPED
    # (What to resume from is the rollback advice's to say: the run may have failed before.)
    then = "; not an error: it was ended from outside, and the run is unfinished" if stopped else ""
    return Finding(
        kind=FindingKind.CRASH,
        severity=Severity.WARNING if stopped else Severity.CRITICAL,
        metric=None,
        start_step=last_step if last_step is not None else 0,
        measures={"reason": reason, "line": line},
        summary=f"The job {what} {at}{f' ({where})' if where else ''}{then}.",
    )
