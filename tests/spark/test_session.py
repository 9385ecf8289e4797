"""The session's settings: a local driver heap sized to the machine unless chosen elsewhere."""

from __future__ import annotations

import pytest

from pgoutput_spark.spark import session
from pgoutput_spark.spark.session import default_driver_memory, machine_memory, session_settings

GIB = 2**30


@pytest.fixture
def plain_env(monkeypatch, tmp_path):
    """No driver heap chosen by environment or spark-defaults.conf; an 8 GiB machine."""
    for name in ("SPARK_DRIVER_MEMORY", "PYSPARK_SUBMIT_ARGS", "SPARK_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    monkeypatch.setattr(session, "machine_memory", lambda: 8 * GIB)
    return tmp_path


def test_default_driver_memory_is_a_quarter_of_the_machine_within_bounds():
    assert default_driver_memory(24 * GIB) == "6144m"
    assert default_driver_memory(2 * GIB) == "1024m"  # never below Spark's own default
    assert default_driver_memory(256 * GIB) == "16384m"
    assert default_driver_memory(None) == "1024m"


def test_machine_memory_reads_this_machine():
    total = machine_memory()
    assert total is not None and total > 256 * 2**20


def test_a_local_session_gets_the_sized_heap(plain_env):
    assert session_settings("local[2]", None)["spark.driver.memory"] == "2048m"
    assert session_settings("local[*]", {"spark.sql.shuffle.partitions": "8"})["spark.driver.memory"] == "2048m"


@pytest.mark.parametrize("master", [None, "yarn", "spark://head:7077", "k8s://https://api:6443"])
def test_a_cluster_session_keeps_its_own_heap_setting(plain_env, master):
    assert "spark.driver.memory" not in session_settings(master, None)


def test_a_heap_chosen_elsewhere_wins(plain_env, monkeypatch):
    assert session_settings("local[2]", {"spark.driver.memory": "3g"})["spark.driver.memory"] == "3g"
    monkeypatch.setenv("SPARK_DRIVER_MEMORY", "5g")
    assert "spark.driver.memory" not in session_settings("local[2]", None)
    monkeypatch.delenv("SPARK_DRIVER_MEMORY")
    monkeypatch.setenv("PYSPARK_SUBMIT_ARGS", "--driver-memory 5g pyspark-shell")
    assert "spark.driver.memory" not in session_settings("local[2]", None)
    monkeypatch.delenv("PYSPARK_SUBMIT_ARGS")
    defaults = plain_env / "spark-defaults.conf"
    defaults.write_text("# spark.driver.memory 5g\nspark.executor.memory 2g\n")
    assert session_settings("local[2]", None)["spark.driver.memory"] == "2048m"  # a comment is not a setting
    defaults.write_text("spark.driver.memory   5g\n")
    assert "spark.driver.memory" not in session_settings("local[2]", None)
