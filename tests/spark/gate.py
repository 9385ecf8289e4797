"""A gate inside a Spark task: its rows wait there until a driver thread has done something."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def gate_keeper(gate: Path) -> Callable[[Any], Any]:
    """A UDF's function whose first evaluation creates ``gate/started``, then waits (up to a
    minute) for ``gate/done``; every other evaluation passes its value through at once."""
    started, done = str(gate / "started"), str(gate / "done")

    def wait(x: Any) -> Any:
        try:
            os.close(os.open(started, os.O_CREAT | os.O_EXCL))  # the first evaluation only
        except FileExistsError:
            return x
        for _ in range(1200):
            if os.path.exists(done):
                return x
            time.sleep(0.05)
        raise TimeoutError("the other writer never committed")

    return wait
