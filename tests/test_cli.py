"""The pgoutput-spark command line on the committed sample capture."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pgoutput_spark.cli import main
from pgoutput_spark.config import load_config
from pgoutput_spark.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "examples" / "sample_capture"


@pytest.mark.usefixtures("restore_spark_conf")
def test_decode_prints_summary_of_sample(capsys, tmp_path):
    status = main(["decode", "--config", str(ROOT / "conf" / "local.yaml"),
                   "--capture", str(SAMPLE), "--output", str(tmp_path / "decoded")])
    out = capsys.readouterr().out
    assert status == 0
    assert "messages: 1809" in out
    assert "quarantined: 0" in out
    assert "shop.customers" in out
    assert (tmp_path / "decoded").is_dir()
    # Counts by type equal the first bytes of the raw messages, read without the decoder.
    import collections

    import pyarrow.parquet as pq

    from pgoutput_spark.decoder.protocol import MessageType

    raw = [m for f in sorted(SAMPLE.glob("*.parquet"))
           for m in pq.read_table(f, columns=["data"]).column("data").to_pylist()]
    for kind, count in collections.Counter(MessageType(m[0]).column_name for m in raw).items():
        assert f"  {kind} " in out and out.split(f"  {kind} ")[1].split()[0] == str(count), kind


@pytest.mark.usefixtures("restore_spark_conf")
def test_decode_failure_is_one_line_and_exit_1(capsys, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = tmp_path / "bad"
    folder.mkdir()
    pq.write_table(pa.table({"seq": pa.array([1, 2], pa.int64()), "lsn": pa.array([0, 0], pa.int64()),
                             "data": pa.array([b"E", b"Z"], pa.binary())}), folder / "a.parquet")
    assert main(["decode", "--capture", str(folder)]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == ("pgoutput-spark: error: StreamStop at seq 1 (lsn 0/0): "
                   "Stream Stop outside any stream block")


@pytest.mark.usefixtures("restore_spark_conf")
def test_a_capture_s_session_column_is_read_by_its_configured_name(capsys, tmp_path):
    """Two walsender sessions, the first ending inside a stream block: with the ``session``
    column (``capture.session_column``'s default) the second session's Stream Start begins a
    block of its own; without it, it is one inside a block never stopped."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from .decoder import builders as b

    data = pa.array([b.stream_start(7, True), b.stream_start(7, True), b.stream_stop()], pa.binary())
    for name, columns in (("with", {"session": ["a", "b", "b"]}), ("without", {})):
        (tmp_path / name).mkdir()
        pq.write_table(pa.table({"seq": pa.array([0, 1, 2], pa.int64()), "lsn": pa.array([16, 32, 32], pa.int64()),
                                 "data": data, **columns}), tmp_path / name / "a.parquet")
    assert main(["decode", "--capture", str(tmp_path / "with")]) == 0
    assert "messages: 3" in capsys.readouterr().out
    assert main(["decode", "--capture", str(tmp_path / "without")]) == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "pgoutput-spark: error: StreamStart at seq 1 (lsn 0/20): Stream Start inside a stream block that was "
        "never stopped")


@pytest.mark.usefixtures("restore_spark_conf")
def test_a_failure_inside_a_spark_task_is_the_same_one_line(capsys, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = tmp_path / "bad"
    folder.mkdir()
    pq.write_table(pa.table({"seq": pa.array([2], pa.int64()), "lsn": pa.array([0x16B3748], pa.int64()),
                             "data": pa.array([b"!"], pa.binary())}), folder / "a.parquet")
    assert main(["decode", "--capture", str(folder)]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == ("pgoutput-spark: error: message.type at seq 2 (lsn 0/16B3748): "
                   "unknown message type byte '!' (0x21) at offset 0")


@pytest.mark.usefixtures("restore_spark_conf")
def test_quarantine_table_gets_bad_messages(spark, capsys, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = tmp_path / "mixed"
    folder.mkdir()
    pq.write_table(pa.table({"seq": pa.array([1, 2, 3], pa.int64()), "lsn": pa.array([5, 6, 7], pa.int64()),
                             "data": pa.array([b"E"[:0], b"Z", b"I"], pa.binary())}), folder / "a.parquet")
    quarantine = tmp_path / "quarantine"
    assert main(["decode", "--capture", str(folder), "--on-error", "quarantine",
                 "--quarantine", str(quarantine)]) == 0
    assert "quarantined: 3" in capsys.readouterr().out
    rows = spark.read.format("delta").load(str(quarantine)).orderBy("seq").collect()
    assert [(r["seq"], bytes(r["raw"])) for r in rows] == [(1, b""), (2, b"Z"), (3, b"I")]
    assert rows[2]["error"] == "Insert.relation_id at seq 3 (lsn 0/7): need 4 bytes at offset 1, have 0"


def test_config_errors_name_file_and_key(tmp_path):
    conf = tmp_path / "c.yaml"
    conf.write_text("capture:\n  pathh: x\n")
    with pytest.raises(ConfigError, match=r"c.yaml: unknown key 'capture.pathh'"):
        load_config(conf)
    conf.write_text("decode:\n  on_error: ignore\n")
    with pytest.raises(ConfigError, match=r"decode.on_error is 'ignore', expected one of"):
        load_config(conf)
    conf.write_text("spark:\n  master: 3\n")
    with pytest.raises(ConfigError, match=r"spark.master must be str or NoneType, got 3"):
        load_config(conf)
    conf.write_text("changes:\n  skip_origins: upstream\n")
    with pytest.raises(ConfigError, match=r"changes.skip_origins must be a list of strings"):
        load_config(conf)
    conf.write_text("changes:\n  skip_origins: [upstream, other]\n")
    assert load_config(conf).changes.skip_origins == ("upstream", "other")
    assert load_config(ROOT / "conf" / "local.yaml").spark.conf["spark.sql.shuffle.partitions"] == "4"
    # The embedded default and the file that shows it say the same.
    assert load_config(ROOT / "conf" / "local.yaml").spark.conf == load_config(None).spark.conf
    from pgoutput_spark.mirroring.rows import NET_TASK_ROWS

    assert load_config(ROOT / "conf" / "local.yaml").apply == load_config(None).apply
    assert load_config(None).apply.net_task_rows == NET_TASK_ROWS
    assert load_config(ROOT / "conf" / "cluster.example.yaml").apply.net_task_rows == 2_000_000  # it loads
    conf.write_text("apply:\n  net_task_rows: 0\n")
    with pytest.raises(ConfigError, match=r"apply.net_task_rows must be at least 1, got 0"):
        load_config(conf)
    conf.write_text("apply:\n  parallelism: two\n")
    with pytest.raises(ConfigError, match=r"apply.parallelism must be int, got 'two'"):
        load_config(conf)
    conf.write_text("apply:\n  table_path: '{root}/{scheme}/{table}'\n")
    with pytest.raises(ConfigError, match=r"apply.table_path .* is not a valid template"):
        load_config(conf)
    conf.write_text("apply:\n  parallelism: 2\n  table_path: '{root}/mirrors/{schema}.{table}'\n")
    assert load_config(conf).apply.parallelism == 2
    for bad in ("'mirrors.{schema}'", "'a.b.c.{table}'", "'mirrors..{table}'", "'{tabel}'"):
        conf.write_text(f"apply:\n  table_name: {bad}\n")
        with pytest.raises(ConfigError, match=r"apply.table_name "):
            load_config(conf)
    conf.write_text("apply:\n  table_name: 'mirrors.{schema}__{table}'\n")
    assert load_config(conf).apply.table_name == "mirrors.{schema}__{table}"


@pytest.mark.usefixtures("restore_spark_conf")
def test_apply_then_nothing_new_then_status(capsys, tmp_path):
    from importlib.metadata import version

    import pyarrow.parquet as pq

    from pgoutput_spark import decode_message
    from pgoutput_spark.lsn import Lsn

    import json

    # A relative target (Delta's SQL on a path needs an absolute one: the job makes it so).
    target = os.path.relpath(tmp_path / "mirrors")
    assert not target.startswith("/")
    # The whole capture, as JSON; progress lines on stderr.
    assert main(["apply", "--config", str(ROOT / "conf" / "local.yaml"), "--target", target, "--json"]) == 0
    captured = capsys.readouterr()
    result = json.loads(captured.out)
    assert (result["ok"], result["result"]["lo"], result["result"]["hi"]) == (True, None, 1808)
    assert list(result)[:3] == ["command", "ok", "version"] and result["version"] == version("pgoutput-spark")
    assert {"shop.customers", "shop.orders"} <= {t["table"] for t in result["result"]["tables"]}
    # The files the run saw go to its record in _runs, not to the JSON line.
    assert result["result"]["landed"] == {"late_rows": 0, "unread": 0}
    from pyspark.sql import SparkSession

    spark = SparkSession.getActiveSession()
    run = spark.read.format("delta").load(f"{target}/_runs").first()
    assert sorted(Path(f).name for f in run["new_files"]) == ["part-00000.parquet", "part-00001.parquet",
                                                              "part-00002.parquet"]
    # The run's row and each mirror's commit name the version that wrote them, the one pip installed.
    installed = version("pgoutput-spark")
    assert run["version"] == installed
    commit = spark.sql(f"DESCRIBE HISTORY delta.`{os.path.abspath(target)}/shop/orders`").first()
    assert json.loads(commit["userMetadata"])["pgoutput_spark"]["version"] == installed
    assert "slice claimed: after the start up to seq 1808" in captured.err and "table 1/" in captured.err
    # A slice the target holds already: skipped, and said so.
    assert main(["apply", "--target", target, "--until-seq", "900", "--quiet"]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() == ("the slice ends at seq 900 and the target holds every change up to "
                                    "seq 1808 already: nothing to apply, no Delta commit")
    assert captured.err == ""
    assert main(["apply", "--target", target]) == 0
    assert "nothing new after seq 1808: no Delta commit" in capsys.readouterr().out
    # A failure is one line on stderr and, with --json, one object on stdout.
    assert main(["apply", "--target", target, "--slice-where", "landed_date = '2026-11-01'", "--json"]) == 1
    captured = capsys.readouterr()
    failure = json.loads(captured.out)
    assert (failure["ok"], failure["version"], failure["error"]) == (False, version("pgoutput-spark"), "ConfigError")
    assert failure["reason"].startswith("--slice-where \"landed_date = '2026-11-01'\" is not a predicate")
    ours = [line for line in captured.err.splitlines() if line.startswith("pgoutput-spark")]
    assert len(ours) == 1 and ours[0].startswith("pgoutput-spark: error: --slice-where")
    assert main(["status", "--target", target]) == 0
    out = capsys.readouterr().out
    # The read point is the capture's last commit, read from the raw bytes.
    raw = [m for f in sorted(SAMPLE.glob("*.parquet"))
           for m in pq.read_table(f, columns=["data"]).column("data").to_pylist()]
    last_commit = max(decode_message(m).commit_lsn for m in raw if m[:1] == b"C")
    assert f"consistent read point: {Lsn(last_commit)}" in out
    assert "runs: 1" in out and "mirrors:" in out and "shop.orders" in out
    assert "  after the start up to seq 1808  to " in out  # the run's slice


def test_status_of_a_missing_target_says_nothing_applied(capsys, tmp_path, restore_spark_conf):
    """Not an error (a scheduler may ask before the first run), but said, for a mistyped path."""
    assert main(["status", "--target", str(tmp_path / "none")]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[:2] == [
        "nothing here yet: no run or snapshot has written to this target (is its path right?)",
        "consistent read point: nothing applied yet"]


def test_status_with_a_capture_counts_its_messages_after_the_position(capsys, tmp_path, spark, monkeypatch):
    """``status --capture``: the capture's messages (distinct seqs: a retried upload counts once)
    after the target's position, and its last seq, as the Parquet files hold them. A run made by
    another version of pgoutput-spark than the run before it is said so."""
    import json
    import shutil
    from importlib.metadata import version

    import pyarrow.parquet as pq

    from pgoutput_spark.apply import run_apply, status
    from pgoutput_spark.capture import read_capture

    first, landing, target = tmp_path / "first", tmp_path / "landing", str(tmp_path / "target")
    first.mkdir()
    shutil.copy(SAMPLE / "part-00000.parquet", first)
    shutil.copytree(SAMPLE, landing, ignore=shutil.ignore_patterns("*.md"))
    shutil.copy(SAMPLE / "part-00002.parquet", landing / "part-00002-retried.parquet")
    position = run_apply(spark, read_capture(spark, str(first)), target).hi
    seqs = [s for f in sorted(landing.glob("*.parquet")) for s in pq.read_table(f, columns=["seq"])["seq"].to_pylist()]
    after = {s for s in seqs if s > position}
    assert position is not None and len(seqs) > len(set(seqs)) and after

    assert main(["status", "--target", target, "--capture", str(landing)]) == 0
    assert f"capture position: seq {position}\nlanded after it: {len(after)} messages, up to seq {max(after)}\n" \
        in capsys.readouterr().out
    assert main(["status", "--target", target, "--capture", str(landing), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)["result"]
    assert (shown["landed_after"], shown["landed_to_seq"]) == (len(after), max(after))
    assert main(["status", "--target", target]) == 0 and "landed after" not in capsys.readouterr().out
    monkeypatch.setattr("pgoutput_spark.apply.__version__", "99.0.0")  # an upgrade between the two runs
    run_apply(spark, read_capture(spark, str(landing)), target)
    caught_up = status(spark, target, capture=read_capture(spark, str(landing)))
    assert (caught_up.landed_after, caught_up.position) == (0, max(seqs))
    assert [r["version"] for r in caught_up.runs] == [version("pgoutput-spark"), "99.0.0"]
    shown = caught_up.render()
    assert "landed after it: nothing (the target holds the whole capture)" in shown
    assert shown.count("run by pgoutput-spark") == 1
    assert f"\n      run by pgoutput-spark 99.0.0 (the run before by {version('pgoutput-spark')})\n" in shown


def test_tables_settings_are_checked(tmp_path):
    conf = tmp_path / "c.yaml"
    conf.write_text("tables:\n  keys:\n    public.log: id\n")
    with pytest.raises(ConfigError, match=r"tables.keys.public.log must be a list of strings, got 'id'"):
        load_config(conf)
    conf.write_text("tables:\n  types:\n    public.t:\n      amount: decimal\n")
    with pytest.raises(ConfigError, match=r"tables.types.public.t.amount is 'decimal', expected string, double "
                                          r"or decimal\(p, s\)"):
        load_config(conf)
    conf.write_text("tables:\n  types:\n    public.t:\n      amount: decimal(40, 2)\n")
    with pytest.raises(ConfigError, match=r"tables.types.public.t.amount is 'decimal\(40, 2\)': a decimal needs "
                                          r"1 <= p <= 38 and 0 <= s <= p"):
        load_config(conf)
    conf.write_text("tables:\n  keys:\n    log: [id]\n")
    with pytest.raises(ConfigError, match=r"'log' must be schema.table"):
        load_config(conf)
    conf.write_text("tables:\n  include: [\"shop.*\"]\n  exclude: [\"shop.tmp_*\"]\n"
                    "  keys:\n    shop.log: [id, at]\n  types:\n    shop.t:\n      amount: string\n"
                    "      rate: double\n      price: decimal(12, 2)\n")
    tables = load_config(conf).tables
    assert (tables.selected("shop.orders"), tables.selected("shop.tmp_x"), tables.selected("public.a")) == \
        (True, False, False)
    assert tables.keys == {"shop.log": ("id", "at")}
    assert tables.types == {"shop.t": {"amount": "string", "rate": "double", "price": "decimal(12, 2)"}}


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "conf").glob("*.yaml")))
def test_every_shipped_configuration_loads(name):
    config = load_config(ROOT / "conf" / name)
    assert config.capture.seq_column == "seq"


def test_apply_in_bounded_runs_until_caught_up(capsys, tmp_path, spark):
    """--max-messages with --until-caught-up: runs of at most N messages, one after another,
    to the tables one run gives (the larger tables' net change in tasks of 100 rows)."""
    import json

    from pgoutput_spark.apply import run_apply, status
    from pgoutput_spark.capture import read_capture

    target = str(tmp_path / "bounded")
    assert main(["apply", "--target", target, "--max-messages", "700", "--until-caught-up",
                 "--net-task-rows", "100"]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("capture slice: after seq 1399 up to seq 1808\n")
    assert "net change in 4 tasks" in captured.out  # shop.orders: 305 inserts, 100 rows a task
    assert [line for line in captured.err.splitlines() if "running again" in line] == [
        "run up to seq 699 done (700 messages); running again",
        "run up to seq 1399 done (700 messages); running again"]
    every = status(spark, target)
    assert [r["hi_seq"] for r in every.runs] == [699, 1399, 1808] and every.run_count is None
    # The last runs only, read by Spark: the same rows, every run counted, the same mirrors.
    latest = status(spark, target, last=2)
    assert (latest.runs, latest.run_count, latest.mirrors) == (every.runs[-2:], 3, every.mirrors)
    assert (status(spark, target, last=0).runs, status(spark, target, last=0).run_count) == ([], 3)
    assert main(["status", "--target", target, "--last", "2"]) == 0
    out = capsys.readouterr().out
    assert "runs: 3 (last 2)\n" in out and "after seq 699 up to seq 1399" in out and "after the start" not in out
    assert main(["status", "--target", target, "--last", "all"]) == 0
    out = capsys.readouterr().out
    assert "runs: 3\n" in out and "after the start up to seq 699" in out
    assert main(["status", "--target", target, "--json"]) == 0  # the default: the last 10
    shown = json.loads(capsys.readouterr().out)["result"]
    assert ([r["hi_seq"] for r in shown["runs"]], shown["run_count"]) == ([699, 1399, 1808], 3)
    for bad in ("-1", "ten"):
        with pytest.raises(SystemExit) as usage:
            main(["status", "--target", target, "--last", bad])
        assert usage.value.code == 2 and "a number of runs" in capsys.readouterr().err
    whole = str(tmp_path / "whole")
    run_apply(spark, read_capture(spark, str(SAMPLE)), whole)
    for schema, table in [("shop", "customers"), ("shop", "orders"), ("shop", "products")]:
        rows = [sorted(map(tuple, spark.read.format("delta").load(f"{root}/{schema}/{table}").collect()))
                for root in (target, whole)]
        assert rows[0] == rows[1] and rows[0]
    with pytest.raises(SystemExit) as usage:  # argparse's usage error
        main(["apply", "--target", target, "--max-messages", "0"])
    assert usage.value.code == 2 and "must be at least 1, not 0" in capsys.readouterr().err


def test_until_caught_up_runs_while_more_remains_and_rebuilds_in_the_first_run_only(monkeypatch):
    """The CLI's loop over bounded runs (the runs themselves: the two tests above). The first
    run alone rebuilds and forgets (``--forget-xid``: `test_apply_pg.py`'s forgotten streams)."""
    import types

    from pgoutput_spark import apply, cli

    calls = []

    def fake_run_apply(spark, capture, target, **options):
        calls.append((options["rebuild"], options["forget_xids"], options["forget_aborted"]))
        n = len(calls)
        return types.SimpleNamespace(hi=n * 10, messages=10, remaining=n < 3, redone=False)

    monkeypatch.setattr(apply, "run_apply", fake_run_apply)
    monkeypatch.setattr(cli, "_capture", lambda config: (None, None, None))
    lines = []
    monkeypatch.setattr(cli, "_progress", lambda args: lines.append)
    args = cli._parser().parse_args(["apply", "--target", "t", "--max-messages", "10", "--until-caught-up",
                                     "--rebuild", "shop.customers", "--forget-xid", "7", "--forget-xid", "9",
                                     "--forget-aborted", "--dsn", "dbname=shop"])
    last = cli.run_apply_command(load_config(None), args)
    # Every run asks the server (a bounded run may leave a new transaction open).
    assert calls == [(["shop.customers"], [7, 9], "dbname=shop"), ([], [], "dbname=shop"),
                     ([], [], "dbname=shop")] and last.hi == 30
    assert lines == [f"run up to seq {hi} done (10 messages); running again" for hi in (10, 20)]
    calls.clear()
    args = cli._parser().parse_args(["apply", "--target", "t", "--max-messages", "10"])
    assert cli.run_apply_command(load_config(None), args).hi == 10 and calls == [([], [], None)]  # one run without
    calls.clear()
    args = cli._parser().parse_args(["apply", "--target", "t", "--forget-aborted"])  # the PG* variables
    assert cli.run_apply_command(load_config(None), args).hi == 10 and calls == [([], [], "")]


def test_changes_passes_max_messages_and_runs_until_caught_up(monkeypatch):
    """The changes command's wiring of --max-messages / --until-caught-up (the bounded runs
    themselves: tests/spark/test_changefeed.py), and of --forget-xid, for the first run only."""
    import types

    from pgoutput_spark import changefeed, cli

    bounds = []

    def fake_run_changes(spark, capture, target, **options):
        bounds.append((options["max_messages"], options["forget_xids"], options["forget_aborted"]))
        return types.SimpleNamespace(hi=len(bounds), messages=5, remaining=len(bounds) < 2, redone=False)

    monkeypatch.setattr(changefeed, "run_changes", fake_run_changes)
    monkeypatch.setattr(cli, "_capture", lambda config: (None, None, None))
    args = cli._parser().parse_args(["changes", "--target", "t", "--max-messages", "5", "--until-caught-up",
                                     "--forget-xid", "12", "--forget-aborted"])
    assert cli.run_changes_command(load_config(None), args).hi == 2 and bounds == [(5, [12], ""), (5, [], "")]


@pytest.mark.parametrize("command", ["apply", "changes"])
def test_a_dsn_without_forget_aborted_is_refused(command, capsys):
    """--dsn is for --forget-aborted only: alone, a mistake (the run would not connect)."""
    from pgoutput_spark import cli

    with pytest.raises(SystemExit) as exited:
        cli.main([command, "--target", "t", "--dsn", "dbname=shop"])
    assert exited.value.code == 2
    assert f"{command}: --dsn is for --forget-aborted" in capsys.readouterr().err


def test_conf_sets_spark_settings_over_the_configuration():
    from pgoutput_spark import cli

    config = load_config(ROOT / "conf" / "local.yaml")
    for command in (["apply", "--target", "t"], ["status", "--target", "t"], ["decode"]):
        args = cli._parser().parse_args([*command, "--conf", "spark.driver.memory=8g",
                                         "--conf", "spark.sql.shuffle.partitions = 3"])
        conf = cli._apply_overrides(config, args).spark.conf
        assert conf["spark.driver.memory"] == "8g" and conf["spark.sql.shuffle.partitions"] == "3"
        assert conf["spark.ui.enabled"] == "false"  # the configuration's other settings stay
    args = cli._parser().parse_args(["capture", "--landing", "l", "--slot", "s", "--publication", "p",
                                     "--conf", "spark.driver.memory=2g"])
    assert cli._spark_overrides(config, args).conf["spark.driver.memory"] == "2g"


def test_version_names_ours_and_the_stack_as_installed(capsys):
    import platform
    from importlib.metadata import version

    import pgoutput_spark

    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    # What pip installed from pyproject.toml, which reads the version from the package.
    assert pgoutput_spark.__version__ == version("pgoutput-spark")
    stack = ", ".join(f"{name} {version(name)}" for name in ("pyspark", "delta-spark", "pyarrow", "numpy", "pandas"))
    assert capsys.readouterr().out == (f"pgoutput-spark {version('pgoutput-spark')} "
                                       f"(Python {platform.python_version()}, {stack})\n")


def test_conf_without_a_value_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["apply", "--target", "t", "--conf", "spark.driver.memory"])
    assert exit_.value.code == 2
    assert "expected KEY=VALUE (a Spark setting), not 'spark.driver.memory'" in capsys.readouterr().err


def test_a_bad_lsn_is_a_usage_error_saying_what_an_lsn_looks_like(capsys):
    from pgoutput_spark import cli

    with pytest.raises(SystemExit) as exit_:
        main(["apply", "--target", "t", "--until-lsn", "16B3748"])
    assert exit_.value.code == 2
    assert "argument --until-lsn: can't parse LSN '16B3748': expected 'X/X' in hexadecimal" in capsys.readouterr().err
    assert cli._parser().parse_args(["apply", "--target", "t", "--until-lsn", "0/16B3748"]).until_lsn == 0x16B3748


def test_the_usage_names_the_command_without_markup(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "The pgoutput-spark command line." in capsys.readouterr().out


def test_a_driver_out_of_memory_is_one_line_naming_the_heap_and_the_remedies(tmp_path):
    """A task that runs the driver JVM out of memory ends it (exit code 52): the command says
    so, instead of the errors of a context shut down under it. The run's own process, with a
    small heap, and a slice predicate that builds a 1.6 GB array in a task."""
    import json
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "pgoutput_spark.cli", "apply", "--json", "--quiet", "--target", str(tmp_path / "t"),
         "--conf", "spark.driver.memory=600m", "--slice-where", "size(array_repeat(seq, 200000000)) > 0"],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr[-3000:]
    # pyspark's accumulator server, left running, printed an EOFError trace when the JVM's end
    # of its connection closed: every time, before or after the error line, or cut short in it.
    assert "Exception occurred during processing of request" not in done.stderr, done.stderr[-3000:]
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith("pgoutput-spark: error: Spark's driver JVM ran out of memory "
                           "(java.lang.OutOfMemoryError, spark.driver.memory 600m) and stopped"), line
    assert "--conf spark.driver.memory=8g" in line and "--max-messages N --until-caught-up" in line
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["ok"] is False and report["reason"] == line.removeprefix("pgoutput-spark: error: ")


# A Java 8 as Spark's launcher meets it (no Java 8 is installed here): its version, and Spark's
# launcher classes, built for Java 17, refused.
_JAVA_8 = """#!/bin/sh
if [ "$1" = "-version" ]; then
  echo 'java version "1.8.0_392"' >&2
  exit 0
fi
echo 'Exception in thread "main" java.lang.UnsupportedClassVersionError: org/apache/spark/launcher/Main has been' \\
  'compiled by a more recent version of the Java Runtime (class file version 61.0)' >&2
exit 1
"""


# Where the suite's Java has no jlink (a JRE), a stand-in for a runtime cut down with it: the
# suite's java for its version and modules, less the one Spark's launcher asks for, and that
# java's refusal of a module it does not have.
_JAVA_CUT_DOWN = """#!/bin/sh
case "$1" in
  -version) exec {java} -version ;;
  --list-modules) {java} --list-modules | grep -v '^jdk.incubator.vector@'; exit 0 ;;
esac
echo 'Error occurred during initialization of boot layer'
echo 'java.lang.module.FindException: Module jdk.incubator.vector not found'
exit 1
"""


def _cut_down_java(home: Path, java: str) -> None:
    """A Java runtime at ``home`` without the module jdk.incubator.vector: built by the suite's
    JDK's jlink from its own modules, as users cut runtimes down for images (about 5 s), or,
    without a jlink, `_JAVA_CUT_DOWN`."""
    import subprocess

    jdk = Path(java).resolve().parent.parent
    if (jdk / "bin" / "jlink").is_file() and (jdk / "jmods").is_dir():
        subprocess.run([str(jdk / "bin" / "jlink"), "--add-modules",
                        "java.se,jdk.unsupported,jdk.management,jdk.zipfs,jdk.security.auth,jdk.crypto.ec",
                        "--output", str(home), "--no-header-files", "--no-man-pages"], check=True, timeout=300)
        return
    _java_script(home, _JAVA_CUT_DOWN.format(java=java))


def _java_script(home: Path, script: str) -> None:
    """``script`` as ``home``'s ``bin/java``, a stand-in for a Java not installed here."""
    (home / "bin").mkdir(parents=True)
    (home / "bin" / "java").write_text(script)
    (home / "bin" / "java").chmod(0o755)


@pytest.mark.parametrize("jdk", ["missing", "java-8", "no-vector", "bad-heap"])
def test_a_jvm_that_does_not_start_is_one_line_naming_the_java(tmp_path, jdk):
    """Spark's JVM not started (no java where JAVA_HOME says; a Java Spark does not run on; one
    without a module Spark asks for; the suite's own Java given a heap size it refuses): one
    line naming the java and what to do, not pyspark's "Java gateway process exited"."""
    import json
    import subprocess
    import sys

    import pyspark

    from pgoutput_spark.spark.localfs import java_command
    from pgoutput_spark.spark.session import java_version

    home = tmp_path / "jdk"
    env, args = {**os.environ, "JAVA_HOME": str(home)}, []
    if jdk == "java-8":
        _java_script(home, _JAVA_8)
    elif jdk == "no-vector":
        _cut_down_java(home, java_command())
    elif jdk == "bad-heap":
        env, args = {**os.environ}, ["--conf", "spark.driver.memory=abc"]
    done = subprocess.run(
        [sys.executable, "-m", "pgoutput_spark.cli", "apply", "--json", "--target", str(tmp_path / "t"), *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr[-3000:]
    java = home / "bin" / "java"
    why = {"missing": f": there is no {java} (JAVA_HOME={home})",
           "java-8": f": {java} is Java 8, and Spark {pyspark.__version__} runs on Java 17 or 21 only; set "
                     f"JAVA_HOME to one of those",
           "no-vector": f": {java} (Java {java_version(java_command())}) has no module jdk.incubator.vector, which "
                        f"Spark {pyspark.__version__}'s launcher adds to every JVM it starts (a Java runtime cut down "
                        f"with jlink); set JAVA_HOME to a whole JDK or JRE, or to a runtime built with that module",
           "bad-heap": f" with {java_command()} (Java {java_version(java_command())}): its output, above, says why",
           }[jdk]
    line = done.stderr.strip().splitlines()[-1]
    assert line == f"pgoutput-spark: error: Spark's JVM did not start{why}", done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["error"] == "SparkStartError" and report["reason"] == line.removeprefix("pgoutput-spark: error: ")
    if jdk == "bad-heap":  # the JVM's own output, above the line
        assert "Invalid maximum heap size: -Xmxabc" in done.stderr, done.stderr[-3000:]
    if jdk == "no-vector":  # the JVM's refusal (on its stdout, which the command shares)
        assert "Module jdk.incubator.vector not found" in done.stdout + done.stderr, done.stdout[-3000:]


def test_the_java_spark_runs_here_is_one_it_supports():
    """`java_version` reads the version of the java Spark's launcher runs (the suite's own)."""
    from pgoutput_spark.spark.localfs import java_command
    from pgoutput_spark.spark.session import SPARK_JAVA_VERSIONS, java_version

    assert java_version(java_command()) in SPARK_JAVA_VERSIONS


def test_a_capture_file_cut_short_is_named_with_what_to_do(capsys, tmp_path):
    """A landing with a file cut short (an upload that failed): one line naming the file and
    Parquet's complaint, nothing applied."""
    import shutil

    landing = tmp_path / "landing"
    shutil.copytree(SAMPLE, landing)
    (landing / "part-00003.parquet").write_bytes((SAMPLE / "part-00001.parquet").read_bytes()[:3000])
    target = tmp_path / "mirrors"
    assert main(["apply", "--config", str(ROOT / "conf" / "local.yaml"), "--capture", str(landing),
                 "--target", str(target), "--quiet"]) == 1
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith(f"pgoutput-spark: error: can't read capture file file://{landing}/part-00003.parquet: "
                           f"file:{landing}/part-00003.parquet is not a Parquet file"), line
    assert "Move it out of the landing, or land it again, and re-run" in line
    assert not (target / "shop").exists()
