"""The package type-checks: it ships ``py.typed``, so users' type checkers read its annotations."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_package_type_checks_with_mypy(tmp_path):
    """mypy over `pgoutput_spark` with the configuration in pyproject.toml (packages without
    type information left out of the check), its cache outside the checkout."""
    done = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "cache")],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Success: no issues found" in done.stdout
