"""A Google Cloud Storage server for the tests (fake-gcs-server), for landings and mirrors on GCS.

The server is a Go program, built once from the Go module proxy into the virtualenv
(``./dev test`` builds it before pytest starts; a test that needs it builds it if missing).
Spark reaches it through Google's GCS connector (its shaded jar, fetched once from Maven
Central), Arrow through its GCS client (``STORAGE_EMULATOR_HOST``, as `landing.gcs_emulator`
reads it).
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import tempfile
import time
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from pgoutput_spark.slot.landing import STORAGE_EMULATOR_HOST, gcs_emulator
from pgoutput_spark.testing.pgcluster import free_port

from .downloads import MAVEN, TOOLS, download
from .s3 import Bucket

BUCKET = "pgoutput-tests"
SERVER_MODULE, SERVER_VERSION = "github.com/fsouza/fake-gcs-server", "v1.56.1"
#: Google's GCS connector for Hadoop, shaded (its dependencies renamed inside): Maven coordinates and SHA-1.
CONNECTOR = ("com/google/cloud/bigdataoss/gcs-connector/4.0.4/gcs-connector-4.0.4-shaded.jar",
             "7ffdc04d1cc08c742916c696805761044e36b919")
#: The Go toolchain fetched where the machine has no Go 1.21+ (the server's module asks for 1.26).
GO_TOOLCHAIN, GO_PROXY = "go1.26.8", "https://proxy.golang.org"


def server_binary() -> Path:
    """The emulator's binary, built with ``go install`` when not built yet."""
    binary = TOOLS / f"fake-gcs-server-{SERVER_VERSION}"
    if binary.exists():
        return binary
    TOOLS.mkdir(parents=True, exist_ok=True)
    go = _go()
    with tempfile.TemporaryDirectory(dir=TOOLS) as out:
        env = {**os.environ, "GOBIN": out}
        built = subprocess.run([go, "install", f"{SERVER_MODULE}@{SERVER_VERSION}"], env=env, text=True,
                               capture_output=True, timeout=1800)
        if built.returncode:
            raise RuntimeError(f"go install {SERVER_MODULE}@{SERVER_VERSION} failed:\n{built.stderr[-3000:]}")
        os.replace(Path(out) / "fake-gcs-server", binary)
    return binary


def _go() -> str:
    """The machine's Go if it is 1.21 or newer (which fetches the toolchain a module asks for),
    otherwise `GO_TOOLCHAIN` from the Go module proxy, as Go itself fetches toolchains."""
    go = shutil.which("go")
    if go is not None:
        version = subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True).stdout.strip()
        if re.fullmatch(r"go1\.(2[1-9]|[3-9]\d)(\.\d+)?.*", version):
            return go
    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
    name = f"v0.0.1-{GO_TOOLCHAIN}.linux-{arch}"
    root = TOOLS / name
    if not (root / "bin" / "go").exists():
        with tempfile.TemporaryDirectory(dir=TOOLS) as out:
            archive = Path(out) / "go.zip"
            with urllib.request.urlopen(f"{GO_PROXY}/golang.org/toolchain/@v/{name}.zip", timeout=600) as response:
                archive.write_bytes(response.read())
            with zipfile.ZipFile(archive) as zipped:
                zipped.extractall(out)
            unpacked = Path(out) / f"golang.org/toolchain@{name}"
            for tool in [*unpacked.glob("bin/*"), *unpacked.glob("pkg/tool/*/*")]:
                tool.chmod(0o755)  # module zips keep no modes: Go makes these executable itself
            os.replace(unpacked, root)
    return str(root / "bin" / "go")


def connector_jar() -> Path:
    """The GCS connector's shaded jar, downloaded once and checked against Maven Central's SHA-1."""
    name, sha1 = CONNECTOR
    jar = TOOLS / Path(name).name
    return jar if jar.exists() else download(f"{MAVEN}/{name}", sha1, jar)


def prepare() -> None:
    """What the GCS tests fetch and build, done ahead (``./dev test`` calls this before pytest)."""
    server_binary()
    connector_jar()


@pytest.fixture(scope="session")
def gcs_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A fake-gcs-server on loopback, in memory, with the test bucket."""
    binary = server_binary()
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    log = tmp_path_factory.mktemp("gcs") / "server.log"
    with log.open("wb") as out:
        server = subprocess.Popen([str(binary), "-scheme", "http", "-host", "127.0.0.1", "-port", str(port),
                                   "-backend", "memory", "-external-url", endpoint, "-public-host",
                                   f"127.0.0.1:{port}", "-log-level", "warn"], stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:  # the test bucket, by the JSON API (Arrow's client would want a project for it)
                create = urllib.request.Request(f"{endpoint}/storage/v1/b", data=json.dumps({"name": BUCKET}).encode(),
                                                headers={"Content-Type": "application/json"}, method="POST")
                urllib.request.urlopen(create, timeout=10).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"fake-gcs-server did not start: {log.read_text()[-2000:]}") from None
                time.sleep(0.2)
        yield endpoint
    finally:
        server.terminate()
        server.wait(timeout=30)


@pytest.fixture
def gcs(gcs_endpoint: str, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Bucket:
    """A new folder in the test bucket, with ``STORAGE_EMULATOR_HOST`` set for the test."""
    monkeypatch.setenv(STORAGE_EMULATOR_HOST, gcs_endpoint)
    name = request.node.name.translate({ord(c): "_" for c in "[]/ "})[:60]
    return Bucket(f"gs://{BUCKET}/{name}", gcs_emulator(gcs_endpoint), f"{BUCKET}/{name}")


def spark_conf(endpoint: str) -> dict[str, str]:
    """Spark's settings for the GCS connector against the emulator at ``endpoint``."""
    return {
        "spark.jars": str(connector_jar()),
        "spark.hadoop.fs.gs.impl": "com.google.cloud.hadoop.fs.gcs.GoogleHadoopFileSystem",
        "spark.hadoop.fs.AbstractFileSystem.gs.impl": "com.google.cloud.hadoop.fs.gcs.GoogleHadoopFS",
        "spark.hadoop.fs.gs.storage.root.url": endpoint,
        "spark.hadoop.fs.gs.auth.type": "UNAUTHENTICATED",
        "spark.hadoop.fs.gs.project.id": "pgoutput-tests",
        # The connector renames with GCS's newer move call, which the emulator does not have
        # (HTTP 400): copy and delete, as the connector did before it.
        "spark.hadoop.fs.gs.operation.move.enable": "false",
    }
