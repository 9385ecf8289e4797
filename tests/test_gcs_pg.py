"""The whole pipeline on Google Cloud Storage (`tests/object_storage.py`): fake-gcs-server
(`tests/plugins/gcs.py`), the job's Spark with Google's GCS connector as users add it (its shaded
jar), Arrow's GCS client sent to the server by ``STORAGE_EMULATOR_HOST`` (the `gcs` fixture)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pgoutput_spark.testing.pgcluster import PgCluster

from .object_storage import run_pipeline
from .plugins.gcs import spark_conf
from .plugins.s3 import Bucket

pytestmark = pytest.mark.postgres


def test_snapshot_capture_apply_and_verify_on_gcs(pg15: PgCluster, gcs: Bucket, gcs_endpoint: str,
                                                  tmp_path: Path) -> None:
    run_pipeline(pg15, gcs, spark_conf(gcs_endpoint), tmp_path)
