"""Airflow DAG: apply one day's slice of a pgoutput capture to the Delta mirrors.

One DAG run per capture partition (``ds``): ``jobs/apply.py`` under
spark-submit with ``--slice-where "<partition column> = '<ds>'"``. Each run
applies everything up to the end of that day's slice, so the runs are safe to
re-run (a slice the target holds already is skipped, and the log says so), to
run late, and to run out of order (a later day run first applies the earlier
days too; their own runs then skip). A day whose partition has not landed yet
fails with "no capture row matches the slice" and is retried.

Copy it to your DAG folder and set these Airflow Variables (or environment
variables of the same names): ``PGOUTPUT_SPARK_HOME`` (where the project's
``jobs/`` and the built wheel are), ``PGOUTPUT_SPARK_CONFIG`` (a
``conf/<env>.yaml``), ``PGOUTPUT_SPARK_TARGET`` (the mirrors' root),
``PGOUTPUT_SPARK_PARTITION`` (the capture's partition column, default
``landed_date``) and ``PGOUTPUT_SPARK_SUBMIT`` (extra spark-submit options,
e.g. ``--master yarn --deploy-mode client``). Only Airflow is imported here:
the scheduler needs neither Spark nor the package.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow import DAG
from airflow.operators.bash import BashOperator


def _setting(name: str, default: str) -> str:
    """``{{ var.value.NAME }}`` at run time, falling back to the environment, then ``default``."""
    return "{{ var.value.get('%s', '%s') }}" % (name, os.environ.get(name, default).replace("'", "\\'"))


HOME = _setting("PGOUTPUT_SPARK_HOME", "/opt/pgoutput-spark")
APPLY = (
    "spark-submit " + _setting("PGOUTPUT_SPARK_SUBMIT", "") +
    " --packages io.delta:delta-spark_2.13:4.0.0"
    " --py-files " + HOME + "/dist/pgoutput_spark-0.1.0-py3-none-any.whl " +
    HOME + "/jobs/apply.py"
    " --config " + _setting("PGOUTPUT_SPARK_CONFIG", "/opt/pgoutput-spark/conf/cluster.yaml") +
    " --target " + _setting("PGOUTPUT_SPARK_TARGET", "/mnt/lake/mirrors/app") +
    " --slice-where \"" + _setting("PGOUTPUT_SPARK_PARTITION", "landed_date") + " = '{{ ds }}'\""
    " --json --quiet"
)

with DAG(
    dag_id="pgoutput_spark_apply",
    description="Apply each day's pgoutput capture slice to the Delta mirrors",
    start_date=datetime(2026, 11, 1),
    schedule="@daily",
    catchup=True,  # backfills: one run per missed day, in any order
    max_active_runs=1,  # runs on one target serialize anyway (a second one fails and retries)
    default_args={
        "retries": 4,  # a partition landing late, a lost executor, a concurrent run
        "retry_delay": timedelta(minutes=5),
        "retry_exponential_backoff": True,
        "max_retry_delay": timedelta(hours=1),
        "execution_timeout": timedelta(hours=6),
    },
    tags=["pgoutput-spark"],
) as dag:
    BashOperator(task_id="apply_slice", bash_command=APPLY)
