"""Local paths through the compiled `NioLocalFileSystem`: Hadoop's results, without its processes."""

from __future__ import annotations

import logging
import os
import subprocess

import pytest

from pgoutput_spark.spark import localfs
from pgoutput_spark.spark.localfs import ABSTRACT_FILE_SYSTEM, FILE_SYSTEM, compiled_classes, local_fs_settings
from pgoutput_spark.testing.processes import processes_started


@pytest.mark.spark
def test_the_session_writes_local_paths_as_hadoop_does_without_starting_processes(spark, tmp_path):
    jvm = spark._jvm
    conf = spark._jsparkSession.sessionState().newHadoopConf()  # as Delta's and the writers'
    uri = jvm.java.net.URI("file:///")
    ours = jvm.org.apache.hadoop.fs.FileSystem.get(uri, conf)
    assert ours.getClass().getName() == FILE_SYSTEM
    context = jvm.org.apache.hadoop.fs.FileContext.getFileContext(uri, conf)
    assert context.getDefaultFileSystem().getClass().getName() == ABSTRACT_FILE_SYSTEM
    hadoops = jvm.org.apache.hadoop.fs.RawLocalFileSystem()
    hadoops.initialize(uri, conf)
    permission = jvm.org.apache.hadoop.fs.permission.FsPermission
    overwrite = jvm.org.apache.hadoop.fs.Options.Rename.OVERWRITE
    renames = spark.sparkContext._gateway.new_array(jvm.org.apache.hadoop.fs.Options.Rename, 1)
    renames[0] = overwrite

    def work(fs, name: str, n: int) -> int:
        """Processes started while ``fs`` creates ``n`` directories and files and renames them
        over each other as Delta commits its checksum files (through a FileContext)."""
        files = jvm.org.apache.hadoop.fs.FileContext.getFileContext(fs.getUri(), conf) \
            if fs is ours else None
        before = processes_started()
        for i in range(n):
            directory = jvm.org.apache.hadoop.fs.Path(f"file:{tmp_path}/{name}/d{i}")
            fs.mkdirs(directory, permission(0o750))
            written = jvm.org.apache.hadoop.fs.Path(directory, "tmp")
            fs.create(written, permission(0o640), False, 4096, 1, 1 << 20, None).close()
            if files is not None:
                files.rename(written, jvm.org.apache.hadoop.fs.Path(directory, "done"), renames)
            else:
                fs.rename(written, jvm.org.apache.hadoop.fs.Path(directory, "done"))
        return processes_started() - before

    assert work(hadoops, "hadoop", 20) >= 40  # the count sees Hadoop's chmods (the check can fail)
    assert work(ours, "ours", 20) < 10  # no process per file: a thread started elsewhere at most
    for name in ("hadoop", "ours"):
        directory = tmp_path / name / "d3"
        assert oct(directory.stat().st_mode & 0o7777) == oct(0o750)
        assert [p.name for p in directory.iterdir()] == ["done"]
        assert oct((directory / "done").stat().st_mode & 0o7777) == oct(0o640)

    # A sticky or set-id mode is left to Hadoop (chmod); a file's status as a link is Hadoop's.
    sticky = jvm.org.apache.hadoop.fs.Path(f"file:{tmp_path}/ours/d3")
    ours.setPermission(sticky, permission(0o1777))
    assert oct((tmp_path / "ours" / "d3").stat().st_mode & 0o7777) == oct(0o1777)
    ours.setPermission(sticky, permission(0o700))
    assert oct((tmp_path / "ours" / "d3").stat().st_mode & 0o7777) == oct(0o700)
    os.symlink(tmp_path / "ours" / "d3" / "done", tmp_path / "link")
    for path in (f"file:{tmp_path}/ours/d3/done", f"file:{tmp_path}/link", f"{tmp_path}/link"):
        theirs_status = hadoops.getFileLinkStatus(jvm.org.apache.hadoop.fs.Path(path))
        our_status = ours.getFileLinkStatus(jvm.org.apache.hadoop.fs.Path(path))
        assert (our_status.isSymlink(), our_status.isFile(), our_status.getLen(), str(our_status.getPath())) == \
            (theirs_status.isSymlink(), theirs_status.isFile(), theirs_status.getLen(),
             str(theirs_status.getPath())), path
    with pytest.raises(Exception, match="FileNotFoundException"):
        ours.getFileLinkStatus(jvm.org.apache.hadoop.fs.Path(f"file:{tmp_path}/missing"))


@pytest.mark.spark
def test_hadoop_code_that_asks_for_the_local_file_system_gets_it(spark, tmp_path):
    """Hadoop hands out the local file system as a LocalFileSystem (`FileSystem.getLocal`
    casts): S3A buffers its uploads in files from a LocalDirAllocator, which asks for it so.
    The session's ``file:`` file system is one, and still writes no checksum file."""
    jvm = spark._jvm
    conf = spark._jsparkSession.sessionState().newHadoopConf()
    local = jvm.org.apache.hadoop.fs.FileSystem.getLocal(conf)
    assert local.getClass().getName() == FILE_SYSTEM
    conf.set("pgoutput.tests.buffer.dir", str(tmp_path / "buffer"))
    allocator = jvm.org.apache.hadoop.fs.LocalDirAllocator("pgoutput.tests.buffer.dir")
    block = allocator.createTmpFileForWrite("s3ablock-0001-", 1 << 20, conf)  # as S3A's disk blocks
    assert str(block.getParent()) == str(tmp_path / "buffer")
    written = jvm.org.apache.hadoop.fs.Path(f"file:{tmp_path}/written")
    out = local.create(written, True)
    out.write(b"rows")
    out.close()
    assert (tmp_path / "written").read_bytes() == b"rows"
    local.rename(written, jvm.org.apache.hadoop.fs.Path(f"file:{tmp_path}/renamed"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["buffer", "renamed"]  # no .written.crc


def test_the_classes_compile_once_into_the_cache(tmp_path, monkeypatch):
    first = compiled_classes(cache=tmp_path)
    assert first is not None and first.parent == tmp_path
    assert (first / "pgoutputspark" / "fs" / "NioLocalFileSystem.class").is_file()
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # no staging directory left

    def no_compiler(*args, **kwargs):
        raise AssertionError("compiled again")

    monkeypatch.setattr(subprocess, "run", no_compiler)
    assert compiled_classes(cache=tmp_path) == first
    monkeypatch.setenv("PGOUTPUT_SPARK_CACHE", str(tmp_path))
    settings = local_fs_settings("/opt/extra.jar")
    assert settings == {
        "spark.hadoop.fs.file.impl": FILE_SYSTEM,
        "spark.hadoop.fs.AbstractFileSystem.file.impl": ABSTRACT_FILE_SYSTEM,
        "spark.driver.extraClassPath": f"/opt/extra.jar{os.pathsep}{first}",
    }
    assert local_fs_settings(None)["spark.driver.extraClassPath"] == str(first)


def test_without_a_compiler_local_paths_stay_hadoops_and_the_log_says_why(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("PGOUTPUT_SPARK_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-java"))
    with caplog.at_level(logging.WARNING, logger=localfs.__name__):
        assert local_fs_settings() == {}
    assert "stay on Hadoop's LocalFileSystem" in caplog.text and "no-java" in caplog.text
    assert [p.name for p in (tmp_path / "cache").iterdir()] == []  # nothing half-compiled kept

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=localfs.__name__):
        assert compiled_classes(cache=tmp_path / "other", spark_jars=tmp_path) is None
    assert f"no Hadoop client or Janino jar in {tmp_path}" in caplog.text
