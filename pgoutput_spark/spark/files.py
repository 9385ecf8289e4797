"""Files on any file system the Spark session reaches (Hadoop's: ``file:``, ``s3a:``, ``abfss:``, ...).

The capture, snapshot and apply jobs write their Delta tables through Spark, and
their few other files (a chunk or a snapshot's rows staged for Spark to read, a
landing's information file, the files a vacuum deletes) through the same Hadoop
file systems, with the session's settings (``spark.hadoop.*``, credentials): a
path is a local path or a URI, never opened as a local file unless it is one.
A file written on the driver is uploaded (`upload`), so that executors on other
machines read it from the target's storage. In a Spark Connect session, which
has no JVM here, `exists` asks Spark's readers instead and `read_text` reads the
file from this process (what `read_capture` needs); the rest needs a classic session.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlparse

from .connect import is_connect
from .jvm import jvm_class

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["child", "delete", "exists", "hadoop", "is_uri", "local_folder", "read_text", "upload"]

_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def is_uri(path: str) -> bool:
    """Whether ``path`` starts with a URI scheme (``s3a:``, ``file:``, ...), not a local path."""
    return _URI.match(path) is not None


def child(path: str, *names: str) -> str:
    """``path`` / ``names`` (a local path or a URI: ``pathlib`` would fold a URI's ``//``)."""
    return "/".join([path.rstrip("/"), *names])


def local_folder(path: str) -> Path | None:
    """The local folder ``path`` names (a path, or a ``file:`` URI); None for other URIs."""
    if path.startswith("file:"):
        return Path(unquote(urlparse(path).path))
    return None if is_uri(path) else Path(path).absolute()


def hadoop(spark: SparkSession, path: str) -> tuple[Any, Any]:
    """``path`` as a Hadoop path, and its file system, configured as the session's reads are."""
    hadoop_path = jvm_class(spark.sparkContext._jvm, "org.apache.hadoop.fs.Path")(path)
    conf = spark._jsparkSession.sessionState().newHadoopConf()
    return hadoop_path, hadoop_path.getFileSystem(conf)


def exists(spark: SparkSession, path: str) -> bool:
    if is_connect(spark):  # no JVM here: ask Spark's file index (which lists a folder it finds)
        from pyspark.errors import AnalysisException

        try:
            spark.read.format("binaryFile").load(path).schema
        except AnalysisException as exc:
            if exc.getCondition() == "PATH_NOT_FOUND":
                return False
            raise
        return True
    hadoop_path, fs = hadoop(spark, path)
    return bool(fs.exists(hadoop_path))


def read_text(spark: SparkSession, path: str) -> str | None:
    """The UTF-8 text of the file at ``path``, or None where there is none."""
    if is_connect(spark):
        return _client_text(path) if exists(spark, path) else None
    hadoop_path, fs = hadoop(spark, path)
    if not fs.exists(hadoop_path):
        return None
    stream = fs.open(hadoop_path)
    try:
        io_utils = jvm_class(spark.sparkContext._jvm, "org.apache.commons.io.IOUtils")
        return str(io_utils.toString(stream, "UTF-8"))
    finally:
        stream.close()


def _client_text(path: str) -> str:
    """The UTF-8 text of the file at ``path`` (which Spark finds), read by this process: Spark's
    readers skip files named with ``_`` or ``.`` even when named, as a landing's record is."""
    from ..errors import CaptureError
    from ..slot.landing import arrow_filesystem

    try:
        local = local_folder(path)
        if local is not None:
            return local.read_text(encoding="utf-8")
        found = arrow_filesystem(path)
        assert found is not None  # a URI other than file:
        fs, inner = found
        with fs.open_input_stream(inner) as stream:
            return bytes(stream.read()).decode("utf-8")
    except (OSError, CaptureError) as exc:
        raise CaptureError(f"{path}: a Spark Connect session's Spark skips this file, and this process cannot "
                           f"read it either ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__}); "
                           f"read the capture where the file is reachable, or in a classic session") from exc


def upload(spark: SparkSession, local: Path, path: str) -> None:
    """Copy the local file ``local`` to ``path`` (replacing a file there) and delete ``local``."""
    source, source_fs = hadoop(spark, local.resolve().as_uri())
    target, fs = hadoop(spark, path)
    # FileUtil.copy between the two file systems, whatever `file:` is mapped to (copyFromLocalFile
    # goes through FileSystem.getLocal, which must then be a LocalFileSystem).
    copy = jvm_class(spark.sparkContext._jvm, "org.apache.hadoop.fs.FileUtil").copy
    copy(source_fs, source, fs, target, True, True, fs.getConf())


def delete(spark: SparkSession, path: str, *, recursive: bool = True) -> bool:
    """Delete ``path`` (with what is under it); False where there was nothing."""
    hadoop_path, fs = hadoop(spark, path)
    return bool(fs.delete(hadoop_path, recursive))
