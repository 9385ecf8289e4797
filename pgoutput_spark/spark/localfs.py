"""Local paths without a process per file: a Hadoop file system for ``file:``, compiled once.

pip's pyspark ships no Hadoop native library, so Hadoop's local file system
(``RawLocalFileSystem``) starts ``chmod`` to set the permissions of each file
and directory it creates, and ``readlink`` on both sides of each rename (on
the path's text, ``file:/...``, which never names a link): about 85 processes
in an apply run of a small slice, 14 ms each when the driver JVM starts them.
``jvm/NioRawLocalFileSystem.java`` does both through ``java.nio`` (modes with
set-uid, set-gid or sticky bits, and real symbolic links, stay Hadoop's);
``jvm/NioLocalFileSystem.java`` is the ``file:`` file system, that one inside
Hadoop's ``LocalFileSystem`` with its ``.name.crc`` checksum files off (Hadoop
code that asks for the local file system, such as S3A's upload buffers, wants
a ``LocalFileSystem``), and ``jvm/NioLocalFs.java`` is the raw one for Delta's
``FileContext``.

`local_fs_settings` compiles the two classes with Janino, the Java compiler in
Spark's own jars, into a directory under the user's cache
(``$PGOUTPUT_SPARK_CACHE``, else ``$XDG_CACHE_HOME/pgoutput-spark``, else
``~/.cache/pgoutput-spark``), once per version of the sources and of Spark's
jars, and returns the settings that put them on a new local session's class
path as the ``file:`` file system. Where that fails it logs why and returns no
settings: the session keeps Hadoop's ``LocalFileSystem``.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

__all__ = ["FILE_SYSTEM", "ABSTRACT_FILE_SYSTEM", "local_fs_settings", "compiled_classes"]

_log = logging.getLogger(__name__)

SOURCES = Path(__file__).resolve().parent / "jvm"
FILE_SYSTEM = "pgoutputspark.fs.NioLocalFileSystem"
ABSTRACT_FILE_SYSTEM = "pgoutputspark.fs.NioLocalFs"
#: One of the compiled classes, under the classes' directory (renamed into place whole).
_COMPILED_CLASS = Path("pgoutputspark", "fs", "NioLocalFs.class")
#: Janino's command-line compiler (in ``commons-compiler``, shipped with Spark).
_COMPILER = "org.codehaus.commons.compiler.samples.CompilerDemo"


def local_fs_settings(existing_class_path: str | None = None) -> dict[str, str]:
    """Settings for a new local session's ``file:`` paths through `FILE_SYSTEM`: its classes
    added to the driver's class path after ``existing_class_path``; empty where they cannot be
    compiled (logged)."""
    classes = compiled_classes()
    if classes is None:
        return {}
    class_path = str(classes) if not existing_class_path else f"{existing_class_path}{os.pathsep}{classes}"
    return {
        "spark.hadoop.fs.file.impl": FILE_SYSTEM,
        "spark.hadoop.fs.AbstractFileSystem.file.impl": ABSTRACT_FILE_SYSTEM,
        "spark.driver.extraClassPath": class_path,
    }


def compiled_classes(*, cache: Path | None = None, java: str | None = None,
                     spark_jars: Path | None = None) -> Path | None:
    """The directory holding `FILE_SYSTEM`'s compiled classes, compiled there first if they are
    not yet; None (logged) where they cannot be."""
    try:
        jars = spark_jars or _spark_jars()
        hadoop = sorted(jars.glob("hadoop-client-api-*.jar"))
        compiler = sorted(jars.glob("janino-*.jar")) + sorted(jars.glob("commons-compiler-*.jar"))
        if not hadoop or len(compiler) < 2:
            raise FileNotFoundError(f"no Hadoop client or Janino jar in {jars}")
        sources = sorted(SOURCES.glob("*.java"))
        digest = hashlib.sha256()
        for path in [*sources, *hadoop, *compiler]:  # the jars by name: a new Spark compiles anew
            digest.update(path.name.encode())
            if path.suffix == ".java":
                digest.update(path.read_bytes())
        root = cache or _cache_root()
        target = root / f"localfs-{digest.hexdigest()[:16]}"
        if (target / _COMPILED_CLASS).is_file():
            return target
        root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".localfs-", dir=root))
        try:
            java_bin = java or java_command()
            done = subprocess.run(
                [java_bin, "-cp", os.pathsep.join(map(str, compiler)), _COMPILER, "-d", str(staging),
                 "-classpath", os.pathsep.join(map(str, sorted(jars.glob("*.jar")))), *map(str, sources)],
                capture_output=True, text=True, timeout=120)
            if done.returncode != 0 or not (staging / _COMPILED_CLASS).is_file():
                raise RuntimeError(f"{java_bin} (Janino) exited with {done.returncode}: "
                                   f"{(done.stderr or done.stdout).strip()[-500:]}")
            try:
                staging.rename(target)  # whole or not at all; another session may have won the race
            except OSError:
                if not target.is_dir():
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return target
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        _log.warning("local paths stay on Hadoop's LocalFileSystem (a process per file created "
                     "or renamed): could not compile %s: %s", FILE_SYSTEM, exc)
        return None


def _spark_jars() -> Path:
    from pyspark.find_spark_home import _find_spark_home

    return Path(_find_spark_home()) / "jars"  # type: ignore[no-untyped-call]


def java_command() -> str:
    """The java Spark's launcher runs: ``$JAVA_HOME/bin/java``, else the first on ``PATH``."""
    home = os.environ.get("JAVA_HOME")
    if home:
        return str(Path(home) / "bin" / "java")
    found = shutil.which("java")
    if found is None:
        raise FileNotFoundError("no java on PATH and no JAVA_HOME")
    return found


def _cache_root() -> Path:
    if os.environ.get("PGOUTPUT_SPARK_CACHE"):
        return Path(os.environ["PGOUTPUT_SPARK_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "pgoutput-spark"
