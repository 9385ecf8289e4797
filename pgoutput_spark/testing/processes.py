"""How many processes this machine has started: the count tests and benchmarks compare."""

from __future__ import annotations

from pathlib import Path


def processes_started() -> int:
    """Processes (and threads: Linux counts both) this machine has started since boot, from
    ``/proc/stat``."""
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("processes "):
            return int(line.split()[1])
    raise RuntimeError("no processes line in /proc/stat")
