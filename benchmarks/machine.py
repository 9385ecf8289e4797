"""The machine a benchmark ran on: CPU, cores, memory, versions, load."""

from __future__ import annotations

import json
import os
import platform
import resource
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _memory_gib() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 1024**2
    except OSError:
        pass
    return float("nan")


def _version(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return "not installed"


def code_version() -> str:
    """The git commit of the checkout, and the package files that differ from it."""
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True,
                              text=True, check=True).stdout.strip()
        changed = subprocess.run(["git", "status", "--porcelain", "--", "pgoutput_spark"], cwd=root,
                                 capture_output=True, text=True, check=True).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError) as exc:
        return f"unknown ({exc})"
    files = [line[3:] for line in changed]
    return f"{head}" + (f" + uncommitted changes in {', '.join(files)}" if files else "")


def load_average() -> tuple[float, float, float]:
    return os.getloadavg()


def peak_rss_mib() -> float:
    """Peak resident memory of this process (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@dataclass(frozen=True)
class Machine:
    cpu: str
    cores: int
    memory_gib: float
    python: str
    numpy: str
    pyarrow: str
    pyspark: str
    code: str
    load_at_start: tuple[float, float, float]

    @classmethod
    def current(cls) -> Machine:
        return cls(
            cpu=_cpu_model(),
            cores=os.cpu_count() or 0,
            memory_gib=_memory_gib(),
            python=platform.python_version(),
            numpy=_version("numpy"),
            pyarrow=_version("pyarrow"),
            pyspark=_version("pyspark"),
            code=code_version(),
            load_at_start=load_average(),
        )

    def line(self) -> str:
        return (f"{self.cpu}, {self.cores} cores, {self.memory_gib:.1f} GiB; Python {self.python}, "
                f"numpy {self.numpy}, pyarrow {self.pyarrow}, pyspark {self.pyspark}")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def format_load(load: tuple[float, float, float]) -> str:
    return " ".join(f"{x:.2f}" for x in load)


def finish(results: dict[str, Any], argv: Sequence[str] | None, json_path: Path | None) -> int:
    """Stamp ``results`` with the date and arguments; write them to ``json_path`` if given."""
    results["date"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    results["argv"] = list(argv) if argv is not None else sys.argv[1:]
    if json_path:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(results, indent=2, default=str) + "\n")
        print(f"results written to {json_path}")
    return 0
