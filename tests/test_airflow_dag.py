"""The example Airflow DAG loads in a real Airflow ``DagBag`` and its command is one our CLI accepts.

Airflow lives in ``.venv-airflow`` (``./dev test`` creates it: its pins clash with
this project's), so the DAG is loaded in a subprocess there.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path

from pgoutput_spark.cli import _parser

ROOT = Path(__file__).resolve().parents[1]
AIRFLOW_PYTHON = ROOT / ".venv-airflow" / "bin" / "python"

LOAD = """
import json, sys
from airflow.models import DagBag
bag = DagBag(dag_folder=sys.argv[1], include_examples=False)
dag = bag.dags.get("pgoutput_spark_apply")
out = {"errors": {k: str(v) for k, v in bag.import_errors.items()}, "dags": sorted(bag.dags)}
if dag is not None:
    task = dag.get_task("apply_slice")
    class Var:
        class value:
            @staticmethod
            def get(name, default):
                return {"PGOUTPUT_SPARK_TARGET": "/data/mirrors", "PGOUTPUT_SPARK_PARTITION": "landed_date",
                        "PGOUTPUT_SPARK_HOME": "/opt/p"}.get(name, default)
    out.update(retries=task.retries, backoff=task.retry_exponential_backoff, catchup=dag.catchup,
               max_active_runs=dag.max_active_runs,
               command=task.render_template(task.bash_command, {"ds": "2026-11-05", "var": Var}))
print(json.dumps(out))
"""


def test_example_dag_loads_without_import_errors(tmp_path):
    assert AIRFLOW_PYTHON.exists(), "run the tests with ./dev test: it creates .venv-airflow"
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path), "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}
    run = subprocess.run([str(AIRFLOW_PYTHON), "-c", LOAD, str(ROOT / "examples" / "airflow")], env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    loaded = json.loads(run.stdout.strip().splitlines()[-1])
    assert loaded["errors"] == {} and loaded["dags"] == ["pgoutput_spark_apply"]
    assert (loaded["retries"], loaded["backoff"], loaded["catchup"], loaded["max_active_runs"]) == (4, True, True, 1)
    # The rendered command: spark-submit of jobs/apply.py with options our command line accepts.
    argv = shlex.split(loaded["command"])
    assert argv[0] == "spark-submit" and "/opt/p/jobs/apply.py" in argv
    job_args = argv[argv.index("/opt/p/jobs/apply.py") + 1:]
    args = _parser().parse_args(["apply", *job_args])
    assert (args.target, args.slice_where, args.json, args.quiet) == (
        "/data/mirrors", "landed_date = '2026-11-05'", True, True)
