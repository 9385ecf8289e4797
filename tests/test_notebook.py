"""examples/walkthrough.ipynb, executed cell by cell so that it cannot rot.

The cells run in this process, in one namespace, as a kernel would run them;
the notebook's ``build_spark_session`` then gets the test run's one
SparkSession instead of starting a second JVM.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "examples" / "walkthrough.ipynb"


@pytest.mark.usefixtures("spark", "restore_spark_conf")
def test_walkthrough_notebook_runs_end_to_end(monkeypatch, capsys):
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.chdir(ROOT / "examples")  # where Jupyter starts it
    import matplotlib

    matplotlib.use("Agg")
    cells = [c for c in json.loads(NOTEBOOK.read_text())["cells"] if c["cell_type"] == "code"]
    assert all(not c["outputs"] for c in cells), "commit the notebook without outputs"
    namespace: dict = {"__name__": "__main__"}
    for i, cell in enumerate(cells):
        exec(compile("".join(cell["source"]), f"{NOTEBOOK.name} cell {i}", "exec"), namespace)
    out = capsys.readouterr().out
    # The plot: one line per table with changes, and the points sum to the changes counted.
    ax, by_table = namespace["ax"], namespace["by_table"]
    assert len(ax.get_lines()) == by_table.shape[1] >= 3
    # Its points sum to every committed change of every table.
    assert int(by_table.to_numpy().sum()) == sum(f.count() for f in namespace["frames"].values())
    assert "Insert  Byte1('I')" in out
    assert "consistent read point:" in out
    assert namespace["now"].count() > 0 and namespace["before"].count() == 0
    assert "is inside the commits one run applied at once" in out
    os.environ.pop("MPLBACKEND", None)
