"""Shared helpers of the benchmarks: machine description, quantiles, Markdown tables, memory.

This module imports neither torch nor duckdb, so `bench_store.py` can time the store without
them. The benchmark scripts print Markdown; docs/benchmarks.md holds the results of full runs.
"""

from __future__ import annotations

import os
import platform
import resource
import sys
import time
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import Any

__all__ = [
    "cpu_model",
    "machine_line",
    "load_line",
    "quantile",
    "median",
    "p90",
    "us",
    "md_table",
    "rss_bytes",
    "peak_rss_bytes",
    "mib",
    "Timer",
    "code_line",
]


def cpu_model() -> str:
    """The CPU model name from /proc/cpuinfo ('unknown' elsewhere)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _version(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "absent"


def machine_line(packages: Sequence[str] = ("torch", "pyarrow", "duckdb")) -> str:
    """One line: CPU, cores, OS, Python and the versions of the packages that matter."""
    cores = os.cpu_count() or 0
    pkgs = ", ".join(f"{p} {_version(p)}" for p in packages)
    py = ".".join(map(str, sys.version_info[:3]))
    return (
        f"{cpu_model()}, {cores} cores (VM shared with other users), {platform.system()} "
        f"{platform.release()}, Python {py}, {pkgs}"
    )


def code_line(paths: Sequence[str] = ("capture",)) -> str:
    """The commit measured, and whether `paths` had uncommitted changes (read-only git)."""
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", *paths],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "code: not a git checkout"
    state = "with uncommitted changes in " + ", ".join(paths) if dirty else "clean"
    return f"commit {sha} ({state})"


def load_line() -> str:
    """The 1/5/15-minute load average (the machine is shared: this says how noisy it was)."""
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:
        return "load average unknown"
    return f"load average {one:.2f} / {five:.2f} / {fifteen:.2f} (1/5/15 min)"


def quantile(values: Sequence[float], q: float) -> float:
    """The q-quantile (nearest rank on the sorted values; q in [0, 1])."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return float(ordered[index])


def median(values: Sequence[float]) -> float:
    """The median (nearest rank)."""
    return quantile(values, 0.5)


def p90(values: Sequence[float]) -> float:
    """The 90th percentile (nearest rank)."""
    return quantile(values, 0.9)


def us(ns: float, digits: int = 2) -> str:
    """Nanoseconds formatted as microseconds."""
    return f"{ns / 1000:.{digits}f}"


def md_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub Markdown table."""
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    for row in rows:
        out.append("| " + " | ".join(str(c) for c in row) + " |")
    return "\n".join(out)


def rss_bytes() -> int:
    """The current resident set size of this process (Linux /proc; 0 elsewhere)."""
    try:
        with open("/proc/self/statm", encoding="utf-8") as f:
            pages = int(f.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 0


def peak_rss_bytes() -> int:
    """The peak resident set size of this process so far (ru_maxrss, KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def mib(n: float) -> str:
    """Bytes formatted as MiB."""
    return f"{n / 2**20:.1f}"


class Timer:
    """Wall-clock seconds of a `with` block (perf_counter)."""

    def __enter__(self) -> Timer:
        self.start = time.perf_counter()
        self.seconds = 0.0
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self.start
