"""An S3 server in the test process (moto's), for landings on object storage."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow.fs as pafs
import pytest

BUCKET = "pgoutput-tests"
#: What moto accepts: any key, one region.
KEY, SECRET, REGION = "test", "test", "us-east-1"
_CREDENTIALS = {"AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_REGION": REGION,
                "AWS_DEFAULT_REGION": REGION, "AWS_EC2_METADATA_DISABLED": "true"}


def _filesystem(endpoint: str, **options: Any) -> pafs.S3FileSystem:
    return pafs.S3FileSystem(endpoint_override=endpoint, access_key=KEY, secret_key=SECRET, region=REGION,
                             **options)


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    _filesystem(endpoint, allow_bucket_creation=True).create_dir(BUCKET)
    yield endpoint
    server.stop()


@dataclass(frozen=True)
class Bucket:
    """A test's folder in the bucket: ``uri`` as the package takes it, ``fs`` and ``root`` for checks."""

    uri: str
    fs: Any
    root: str


@pytest.fixture
def s3(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Bucket:
    """A new folder in the test bucket, and the environment Arrow's S3 client reads (endpoint,
    credentials) set for the test. Its URI is spelled as Spark's S3 connector spells it (``s3a://``)."""
    for key, value in {**_CREDENTIALS, "AWS_ENDPOINT_URL": s3_endpoint}.items():
        monkeypatch.setenv(key, value)
    name = request.node.name.translate({ord(c): "_" for c in "[]/ "})[:60]
    return Bucket(f"s3a://{BUCKET}/{name}", _filesystem(s3_endpoint), f"{BUCKET}/{name}")
