"""The whole pipeline on S3 (`tests/object_storage.py`): moto's S3 server in the test process
(`tests/plugins/s3.py`), the job's Spark with Spark's S3 connector as users add it (``hadoop-aws``
of pyspark's Hadoop version, which brings the AWS SDK's bundle, about 560 MB, from Maven on the
first run), Arrow's S3 client with the ``AWS_*`` environment the `s3` fixture sets."""

from __future__ import annotations

from pathlib import Path

import pytest

from pgoutput_spark.testing.pgcluster import PgCluster

from .object_storage import run_pipeline
from .plugins.s3 import KEY, REGION, SECRET, Bucket

pytestmark = pytest.mark.postgres

PACKAGES = ["io.delta:delta-spark_2.13:4.0.0", "org.apache.hadoop:hadoop-aws:3.4.1"]


def test_snapshot_capture_apply_and_verify_on_s3(pg15: PgCluster, s3: Bucket, s3_endpoint: str,
                                                 tmp_path: Path) -> None:
    conf = {
        "spark.jars.packages": ",".join(PACKAGES),
        "spark.hadoop.fs.s3a.endpoint": s3_endpoint,
        "spark.hadoop.fs.s3a.endpoint.region": REGION,
        "spark.hadoop.fs.s3a.path.style.access": "true",
        "spark.hadoop.fs.s3a.connection.ssl.enabled": "false",
        "spark.hadoop.fs.s3a.access.key": KEY,
        "spark.hadoop.fs.s3a.secret.key": SECRET,
        "spark.hadoop.fs.s3a.aws.credentials.provider": "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider",
        # the driver's upload buffers in the test's folder
        "spark.hadoop.fs.s3a.buffer.dir": str(tmp_path / "s3a-buffer"),
    }
    run_pipeline(pg15, s3, conf, tmp_path)
