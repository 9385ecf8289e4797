"""The ``pgoutput-spark`` command line.

    pgoutput-spark snapshot --target ROOT --slot NAME --publication NAME [--dsn DSN] [--config ...]
    pgoutput-spark snapshot --target ROOT --table SCHEMA.TABLE --publication NAME [--dsn DSN]
    pgoutput-spark capture --landing PATH --slot NAME --publication NAME [--dsn DSN] [options]
    pgoutput-spark verify --target ROOT --landing PATH [--dsn DSN] [--keys] [--config ...]
    pgoutput-spark decode [--config conf/local.yaml] [--capture PATH] [--output PATH]
    pgoutput-spark changes --target ROOT [--config conf/local.yaml] [--capture PATH]
    pgoutput-spark apply --target ROOT [--config conf/local.yaml] [--capture PATH]
    pgoutput-spark status --target ROOT [--config conf/local.yaml] [--last N|all] [--capture PATH]

Exits 0 on success, 1 with a one-line reason on a pgoutput_spark error, 2 on
bad arguments, 3 when ``verify`` finds a mirror that differs from its source.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

from .capture import CaptureColumns, one_row_per_message, read_capture
from .config import Config, load_config
from .errors import ConfigError, PgoutputSparkError
from .lsn import Lsn
from .version import __version__


def _versions() -> str:
    """``--version``'s line: ours, then what a bug report needs of the stack (the versions installed
    beside the command; a package missing is said so)."""
    from importlib.metadata import PackageNotFoundError, version

    def installed(name: str) -> str:
        try:
            return f"{name} {version(name)}"
        except PackageNotFoundError:
            return f"{name} not installed"

    stack = ", ".join(installed(name) for name in ("pyspark", "delta-spark", "pyarrow", "numpy", "pandas"))
    return f"pgoutput-spark {__version__} (Python {sys.version.split()[0]}, {stack})"


class _VersionAction(argparse.Action):
    """``--version``: `_versions` on one line (argparse's own action wraps it at the terminal's width)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *args: Any) -> None:
        print(_versions())
        parser.exit()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pgoutput-spark", description=__doc__.split("\n")[0].replace("``", ""))
    parser.add_argument("--version", action=_VersionAction,
                        help="print the versions of pgoutput-spark, Python and its stack, and exit")
    sub = parser.add_subparsers(dest="command", required=True)
    snapshot = sub.add_parser("snapshot", help="create a slot and copy the published tables into new mirrors")
    snapshot.add_argument("--config", help="configuration file (default: built-in defaults)")
    snapshot.add_argument("--target", required=True, help="target root (the mirrors the apply job continues)")
    snapshot.add_argument("--slot", help="pgoutput replication slot to create (a new pipeline)")
    snapshot.add_argument("--table", action="append", metavar="SCHEMA.TABLE",
                          help="re-snapshot this table of a running pipeline instead (repeatable)")
    snapshot.add_argument("--publication", action="append", required=True, metavar="NAME",
                          help="publication whose tables are copied (repeatable)")
    snapshot.add_argument("--dsn", help="libpq connection string (default: the PG* environment variables)")
    snapshot.add_argument("--two-phase", action="store_true", help="create the slot with two_phase")
    snapshot.add_argument("--failover", action="store_true",
                          help="create a failover slot, kept on standbys that sync slots (PostgreSQL 17+)")
    snapshot.add_argument("--pipeline", help="pipeline name (Delta txnAppId prefix)")
    snapshot.add_argument("--master", help="Spark master (default from the configuration)")
    snapshot.add_argument("--quiet", action="store_true", help="no progress line per table")
    for hidden in ("--capture", "--format", "--on-error", "--quarantine"):
        snapshot.add_argument(hidden, help=argparse.SUPPRESS)
    verify = sub.add_parser("verify", help="compare each mirror with its live source table")
    verify.add_argument("--config", help="configuration file (default: built-in defaults)")
    verify.add_argument("--target", required=True, help="target root of the mirrors")
    verify.add_argument("--landing", required=True, help="the capture landing (names slot and publications)")
    verify.add_argument("--dsn", help="libpq connection string (default: the PG* environment variables)")
    verify.add_argument("--keys", action="store_true", help="list the keys of differing rows")
    verify.add_argument("--pipeline", help="pipeline name (Delta txnAppId prefix)")
    verify.add_argument("--master", help="Spark master (default from the configuration)")
    for hidden in ("--capture", "--format", "--on-error", "--quarantine"):
        verify.add_argument(hidden, help=argparse.SUPPRESS)
    capture = sub.add_parser("capture", help="land a replication slot's messages as capture files")
    capture.add_argument("--landing", required=True,
                         help="Parquet folder (a path, or a URI: s3://, s3a://, gs://, abfs://, hdfs://)"
                              " or Delta table the capture goes to")
    capture.add_argument("--landing-format", choices=["parquet", "delta"], default="parquet",
                         help="parquet: a folder of chunk files; delta: one append per chunk (starts Spark)")
    capture.add_argument("--config", help="configuration file (Spark settings for a Delta landing)")
    capture.add_argument("--master", help="Spark master (Delta landing; default from the configuration)")
    capture.add_argument("--slot", required=True, help="pgoutput replication slot to read")
    capture.add_argument("--publication", action="append", metavar="NAME",
                         help="publication to decode (repeatable; default: the landing's)")
    capture.add_argument("--dsn", help="libpq connection string (default: the PG* environment variables)")
    capture.add_argument("--create-slot", action="store_true", help="create the slot when it is missing")
    capture.add_argument("--failover", action="store_true",
                         help="a failover slot, kept on standbys that sync slots: created so, or made so"
                              " (PostgreSQL 17+)")
    capture.add_argument("--proto-version", type=int, choices=[1, 2, 3, 4],
                         help="pgoutput protocol version (default: the highest the server speaks)")
    capture.add_argument("--streaming", choices=["on", "off", "parallel"],
                         help="stream large in-progress transactions")
    capture.add_argument("--two-phase", action=argparse.BooleanOptionalAction, default=None,
                         help="decode prepared transactions at PREPARE (a slot with two_phase; PostgreSQL 18+"
                              " turns it on for one without)")
    capture.add_argument("--messages", action=argparse.BooleanOptionalAction, default=None,
                         help="include pg_logical_emit_message messages")
    capture.add_argument("--binary", action=argparse.BooleanOptionalAction, default=None,
                         help="values in binary format")
    capture.add_argument("--origin", choices=["any", "none"], help="replication origins to include")
    capture.add_argument("--chunk-size", type=int, default=100_000,
                         help="messages per chunk file (it ends at a transaction boundary)")
    stop = capture.add_mutually_exclusive_group()
    stop.add_argument("--until-lsn", help="stop at the last transaction ending at or before this LSN")
    stop.add_argument("--max-messages", type=int, help="stop after landing this many messages")
    capture.add_argument("--quiet", action="store_true", help="no progress line per chunk")
    decode = sub.add_parser("decode", help="decode a capture and print a summary")
    decode.add_argument("--config", help="configuration file (default: built-in defaults)")
    decode.add_argument("--capture", help="capture path (Parquet folder or Delta table)")
    decode.add_argument("--format", choices=["auto", "parquet", "delta"])
    decode.add_argument("--on-error", choices=["fail", "quarantine"])
    decode.add_argument("--quarantine", help="Delta table receiving undecodable messages")
    decode.add_argument("--output", help="also write the decoded messages here (Parquet)")
    decode.add_argument("--master", help="Spark master (default from the configuration)")
    changes = sub.add_parser("changes", help="write committed, typed changes to Delta change tables")
    changes.add_argument("--config", help="configuration file (default: built-in defaults)")
    changes.add_argument("--capture", help="capture path (Parquet folder or Delta table)")
    changes.add_argument("--target", required=True, help="target root (change tables, state)")
    changes.add_argument("--pipeline", help="pipeline name (Delta txnAppId prefix)")
    changes.add_argument("--skip-origin", action="append", default=None, metavar="NAME",
                         help="skip transactions from this replication origin (repeatable)")
    changes.add_argument("--format", choices=["auto", "parquet", "delta"])
    changes.add_argument("--on-error", choices=["fail", "quarantine"])
    changes.add_argument("--quarantine", help=argparse.SUPPRESS)
    changes.add_argument("--max-messages", type=_positive, metavar="N",
                         help="write the changes of at most N messages after the last run's; with "
                              "--until-caught-up, run until none remain")
    changes.add_argument("--accept-late-files", action="store_true",
                         help="go on past capture files that landed after runs wrote past their seqs "
                              "(the change tables go on without their messages)")
    changes.add_argument("--forget-xid", action="append", type=int, default=[], metavar="XID",
                         help="forget this streamed transaction, open at the target's position, which "
                              "PostgreSQL reports aborted and will never end (as for apply; repeatable)")
    changes.add_argument("--forget-aborted", action="store_true",
                         help="ask the capture's source server (--dsn) about the streamed transactions open "
                              "at the target's position, and forget those it reports aborted (as for apply)")
    changes.add_argument("--dsn", help="with --forget-aborted: libpq connection string to the capture's source "
                                       "server (default: the PG* environment variables)")
    changes.add_argument("--allow-seq-gaps", action="store_true",
                         help="write a slice that misses seqs of a landing of `capture` (by default a "
                              "missing one fails the run: files deleted or expired)")
    changes.add_argument("--until-caught-up", action="store_true",
                         help="run again after each bounded run until the capture is written")
    changes.add_argument("--master", help="Spark master (default from the configuration)")
    apply = sub.add_parser("apply", help="merge the capture's changes into Delta mirrors of the source tables")
    apply.add_argument("--config", help="configuration file (default: built-in defaults)")
    apply.add_argument("--capture", help="capture path (Parquet folder or Delta table)")
    apply.add_argument("--target", required=True, help="target root (mirror tables, _runs, state)")
    apply.add_argument("--pipeline", help="pipeline name (Delta txnAppId prefix)")
    apply.add_argument("--skip-origin", action="append", default=None, metavar="NAME",
                       help="skip transactions from this replication origin (repeatable)")
    apply.add_argument("--format", choices=["auto", "parquet", "delta"])
    apply.add_argument("--on-error", choices=["fail", "quarantine"])
    apply.add_argument("--quarantine", help=argparse.SUPPRESS)
    apply.add_argument("--parallelism", type=int, help="tables merged at once (default: apply.parallelism)")
    apply.add_argument("--net-task-rows", type=_positive, metavar="N",
                       help="a table with more change rows in a run has its net change computed in several "
                            "tasks by key, N rows each (default: apply.net_task_rows)")
    apply.add_argument("--rebuild", action="append", default=[], metavar="SCHEMA.TABLE",
                       help="rebuild this mirror from the start of the capture (repeatable)")
    apply.add_argument("--forget-xid", action="append", type=int, default=[], metavar="XID",
                       help="forget this streamed transaction, open at the target's position (status lists "
                            "it), which PostgreSQL reports aborted and will never end: its rows are deleted "
                            "unapplied (repeatable)")
    apply.add_argument("--forget-aborted", action="store_true",
                       help="ask the capture's source server (--dsn) about the streamed transactions open at the "
                            "target's position (pg_xact_status), and forget those it reports aborted")
    apply.add_argument("--dsn", help="with --forget-aborted: libpq connection string to the capture's source "
                                     "server (default: the PG* environment variables)")
    apply.add_argument("--accept-late-files", action="store_true",
                       help="go on past capture files that landed after runs applied past their seqs "
                            "(after rebuilding or re-snapshotting the mirrors they miss)")
    apply.add_argument("--allow-seq-gaps", action="store_true",
                       help="apply a slice that misses seqs of a landing of `capture` (whose seqs follow one "
                            "another; by default a missing one fails the run: files deleted or expired)")
    bounded = apply.add_argument_group("backfill slices (the run applies everything up to the slice's end)")
    bounded.add_argument("--until-seq", type=int, metavar="SEQ", help="end the slice at this seq")
    bounded.add_argument("--until-lsn", metavar="LSN", type=_lsn,
                         help="end the slice at the last message at or before this LSN")
    bounded.add_argument("--slice-where", metavar="SQL",
                         help="end the slice at the last capture row matching this predicate, "
                              "e.g. \"landed_date = '2026-11-01'\"")
    apply.add_argument("--max-messages", type=_positive, metavar="N",
                       help="apply at most N messages after the target's position; with "
                            "--until-caught-up, run until none remain")
    apply.add_argument("--until-caught-up", action="store_true",
                       help="run again after each bounded run until the capture (or slice) is applied")
    apply.add_argument("--master", help="Spark master (default from the configuration)")
    status = sub.add_parser("status", help="print a target's runs and its consistent read point")
    status.add_argument("--config", help="configuration file (default: built-in defaults)")
    status.add_argument("--target", required=True, help="target root")
    status.add_argument("--pipeline", help="pipeline name")
    status.add_argument("--capture", metavar="PATH", help="also count this capture's messages after the "
                        "target's position (Parquet folder or Delta table)")
    status.add_argument("--format", choices=["auto", "parquet", "delta"])
    status.add_argument("--on-error", help=argparse.SUPPRESS)
    status.add_argument("--quarantine", help=argparse.SUPPRESS)
    status.add_argument("--last", type=_last_runs, default=10, metavar="N|all",
                        help="the last N runs (default 10; `all`: every run, read whole)")
    status.add_argument("--master", help="Spark master (default from the configuration)")
    for name, command in sub.choices.items():
        command.add_argument("--conf", action="append", type=_spark_setting, default=[], metavar="KEY=VALUE",
                             help="a Spark setting, over the configuration's spark.conf (repeatable), "
                                  "e.g. spark.driver.memory=8g")
        command.add_argument("--json", action="store_true",
                             help="print the result as one JSON object (errors too) for schedulers")
        if name not in ("snapshot", "capture"):  # those two have their own --quiet
            command.add_argument("--quiet", action="store_true", help="no progress lines")
    return parser


#: Spark's loggers that print a failed task's Python and Java traces (three times in a local
#: session, where the driver is the executor) before the command prints its one error line.
_TASK_FAILURE_LOGGERS = ("org.apache.spark.executor.Executor", "org.apache.spark.scheduler.TaskSetManager",
                         "org.apache.spark.storage.BlockManager")


def _spark(config: Config, master: str | None = None) -> Any:
    """The command's SparkSession. In a local session a failed task is reported once: as the
    command's error line, or (an error that is not ours) in the exception Spark raises, which
    carries the task's trace; Spark's own task-failure loggers are turned off."""
    from .spark.jvm import jvm_class
    from .spark.session import build_spark_session

    spark = build_spark_session(master=master or config.spark.master, conf=config.spark.conf)
    if (spark.sparkContext.master or "").startswith("local"):
        jvm = spark.sparkContext._jvm
        configurator = jvm_class(jvm, "org.apache.logging.log4j.core.config.Configurator")
        off = jvm_class(jvm, "org.apache.logging.log4j.Level").OFF
        for name in _TASK_FAILURE_LOGGERS:
            configurator.setLevel(name, off)
    return spark


def run_capture_command(args: argparse.Namespace) -> Any:
    from .slot.capture import capture_slot

    spark = None
    if args.landing_format == "delta":
        config = load_config(args.config)
        spark = _spark(dataclasses.replace(config, spark=_spark_overrides(config, args)))
    progress = None if args.quiet else (lambda chunk: print(chunk.render(), flush=True))
    result = capture_slot(args.landing, slot=args.slot, publications=args.publication, dsn=args.dsn,
                          format=args.landing_format, spark=spark,
                          proto_version=args.proto_version, streaming=args.streaming,
                          two_phase=args.two_phase, messages=args.messages, binary=args.binary,
                          origin=args.origin, create_slot=args.create_slot, failover=args.failover,
                          chunk_size=args.chunk_size,
                          until_lsn=args.until_lsn, max_messages=args.max_messages, progress=progress)
    return result


def run_snapshot_command(config: Config, args: argparse.Namespace) -> Any:
    from .slot.snapshot import snapshot_tables

    spark = _spark(config)
    progress = None if args.quiet else (lambda table: print(table.render(), flush=True))
    if (args.slot is None) == (args.table is None):
        raise ConfigError("snapshot: pass --slot (a new pipeline) or --table (a re-snapshot), not both")
    result = snapshot_tables(spark, args.target, slot=args.slot, tables=args.table,
                             publications=args.publication,
                             dsn=args.dsn, two_phase=args.two_phase, failover=args.failover,
                             pipeline=config.changes.pipeline,
                             table_path=config.apply.table_path, table_name=config.apply.table_name,
                             history_path=config.apply.history_path, progress=progress, selection=config.tables)
    return result


def run_verify_command(config: Config, args: argparse.Namespace) -> Any:
    """The comparison (``differing``: the tables that differ)."""
    from .slot.verify import verify_mirrors

    spark = _spark(config)
    result = verify_mirrors(spark, args.target, args.landing, dsn=args.dsn, pipeline=config.changes.pipeline,
                            table_path=config.apply.table_path, keys=args.keys, selection=config.tables)
    return result


def _capture(config: Config) -> tuple[Any, Any, CaptureColumns]:
    spark = _spark(config)
    capture = read_capture(spark, config.capture.path, format=config.capture.format)  # type: ignore[arg-type]
    xid = config.capture.xid_column if config.capture.xid_column in capture.columns else None
    session = config.capture.session_column if config.capture.session_column in capture.columns else None
    columns = CaptureColumns(config.capture.seq_column, config.capture.lsn_column,
                             config.capture.data_column, xid, session)
    return spark, capture, columns


def _until_caught_up(run: Callable[[], Any], again: bool, say: Callable[[str], None] | None) -> Any:
    """One bounded run (``run``), and with ``again`` (--until-caught-up) the next ones while
    more remains (or the run redid an interrupted slice); the last run's result."""
    while True:
        result = run()
        if not (again and (result.remaining or result.redone)):
            return result
        if say is not None:  # each run's own lines; the last one's are printed as usual
            say(f"run up to seq {result.hi} done ({result.messages} messages); running again")


def run_apply_command(config: Config, args: argparse.Namespace) -> Any:
    from .apply import run_apply

    spark, capture, columns = _capture(config)
    say = _progress(args)
    rebuild = [args.rebuild]  # rebuilt by the first run only
    forget = [args.forget_xid]  # forgotten by the first run only

    def once() -> Any:
        return run_apply(spark, capture, args.target, columns=columns, pipeline=config.changes.pipeline,
                         on_error=config.decode.on_error,
                         skip_origins=config.changes.skip_origins,
                         parallelism=args.parallelism or config.apply.parallelism,
                         table_path=config.apply.table_path, table_name=config.apply.table_name,
                         tables=config.tables, history_path=config.apply.history_path,
                         until_seq=args.until_seq,
                         until_lsn=None if args.until_lsn is None else int(args.until_lsn),
                         slice_where=args.slice_where, max_messages=args.max_messages,
                         net_task_rows=args.net_task_rows or config.apply.net_task_rows, progress=say,
                         rebuild=rebuild.pop() if rebuild else [],
                         forget_xids=forget.pop() if forget else [], forget_aborted=_forget_aborted(args),
                         accept_late_files=args.accept_late_files,
                         seq_gaps="allow" if args.allow_seq_gaps else None)

    return _until_caught_up(once, args.until_caught_up, say)


def run_status_command(config: Config, target: str, last: int | None = 10, capture: bool = False) -> Any:
    """`status` of ``target``; with ``capture``, the configuration's capture's messages after its
    position too."""
    from .reading import status

    if not capture:
        return status(_spark(config), target, config.changes.pipeline, last=last)
    spark, frame, columns = _capture(config)
    return status(spark, target, config.changes.pipeline, last=last, capture=frame, columns=columns)


def run_changes_command(config: Config, args: argparse.Namespace) -> Any:
    from .changefeed import run_changes

    spark, capture, columns = _capture(config)
    say = _progress(args)
    forget = [args.forget_xid]  # forgotten by the first run only
    return _until_caught_up(
        lambda: run_changes(spark, capture, args.target, columns=columns, pipeline=config.changes.pipeline,
                            on_error=config.decode.on_error,
                            skip_origins=config.changes.skip_origins, max_messages=args.max_messages,
                            progress=say, accept_late_files=args.accept_late_files,
                            seq_gaps="allow" if args.allow_seq_gaps else None, tables=config.tables,
                            forget_xids=forget.pop() if forget else [], forget_aborted=_forget_aborted(args)),
        args.until_caught_up, say)


def _forget_aborted(args: argparse.Namespace) -> str | None:
    """``forget_aborted`` of `run_apply` and `run_changes`: the connection string to ask, ``""``
    for the PG* environment variables, None without --forget-aborted (checked with the arguments)."""
    return (args.dsn or "") if args.forget_aborted else None


def _apply_overrides(config: Config, args: argparse.Namespace) -> Config:
    capture = config.capture
    if args.capture:
        capture = dataclasses.replace(capture, path=args.capture)
    if args.format:
        capture = dataclasses.replace(capture, format=args.format)
    decode = config.decode
    if args.on_error:
        decode = dataclasses.replace(decode, on_error=args.on_error)
    if args.quarantine:
        decode = dataclasses.replace(decode, quarantine_path=args.quarantine)
    spark = _spark_overrides(config, args)
    changes = config.changes
    if getattr(args, "pipeline", None):
        changes = dataclasses.replace(changes, pipeline=args.pipeline)
    if getattr(args, "skip_origin", None):
        changes = dataclasses.replace(changes, skip_origins=tuple(args.skip_origin))
    return dataclasses.replace(config, capture=capture, decode=decode, spark=spark, changes=changes)


def _spark_overrides(config: Config, args: argparse.Namespace) -> Any:
    """The configuration's Spark section with ``--master`` and ``--conf`` applied."""
    spark = config.spark
    if args.master:
        spark = dataclasses.replace(spark, master=args.master)
    if args.conf:
        spark = dataclasses.replace(spark, conf={**spark.conf, **dict(args.conf)})
    return spark


def _spark_setting(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip() or not value.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE (a Spark setting), not {text!r}")
    return key.strip(), value.strip()


def run_decode(config: Config, output: str | None = None) -> Any:
    """Decode the configured capture; returns its summary."""
    from .spark.decode import decode, quarantined
    from .spark.session import release
    from .spark.summary import summarize

    spark, capture, columns = _capture(config)
    messages, repeated = one_row_per_message(columns.select(capture))
    decoded = decode(messages, columns=CaptureColumns(xid=None if columns.xid is None else "xid",
                                                      session=None if columns.session is None else "session"),
                     on_error=config.decode.on_error,  # type: ignore[arg-type]
                     framing=config.capture.framing)  # type: ignore[arg-type]
    decoded = decoded.persist()
    try:
        summary = dataclasses.replace(summarize(decoded), repeated_rows=repeated)
        if output:
            decoded.write.mode("overwrite").parquet(output)
        if config.decode.quarantine_path and summary.quarantined:
            quarantined(decoded).write.format("delta").mode("append").save(config.decode.quarantine_path)
    finally:
        release(decoded)
    return summary


def _lsn(text: str) -> Lsn:
    """``--until-lsn``: an LSN as PostgreSQL prints it (``0/16B3748``). argparse words a plain
    ValueError as "invalid Lsn value", without saying what an LSN looks like."""
    try:
        return Lsn(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _last_runs(text: str) -> int | None:
    """``status --last``: a count of runs, or ``all`` (None)."""
    if text == "all":
        return None
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a number of runs or `all`, not {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"a number of runs (0 or more) or `all`, not {text!r}")
    return value


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def _progress(args: argparse.Namespace) -> Callable[[str], None] | None:
    """Progress lines go to stderr (stdout keeps the summary or the JSON), unless --quiet."""
    if args.quiet:
        return None
    return lambda line: print(line, file=sys.stderr, flush=True)


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)
                if not f.name.startswith("_") and f.metadata.get("json", True)}
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)  # timestamps, paths: their text


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command in ("apply", "changes") and args.dsn and not args.forget_aborted:
        parser.error(f"{args.command}: --dsn is for --forget-aborted (the only reason {args.command} connects "
                     f"to PostgreSQL)")
    as_json = getattr(args, "json", False)
    try:
        if args.command == "capture":
            result = run_capture_command(args)
        else:
            config = _apply_overrides(load_config(args.config), args)
            if args.command == "decode":
                result = run_decode(config, args.output)
            elif args.command == "changes":
                result = run_changes_command(config, args)
            elif args.command == "apply":
                result = run_apply_command(config, args)
            elif args.command == "snapshot":
                result = run_snapshot_command(config, args)
            elif args.command == "verify":
                result = run_verify_command(config, args)
            else:
                result = run_status_command(config, args.target, args.last, capture=args.capture is not None)
        if as_json:
            print(json.dumps({"command": args.command, "ok": True, "version": __version__,
                              "result": _jsonable(result)}))
        elif args.command == "status":  # the runs asked for (`--last`), not the render's default 10
            print(result.render(last=len(result.runs)))
        else:
            print(result.render())
        return 3 if args.command == "verify" and result.differing else 0
    except PgoutputSparkError as exc:
        return _failed(args, exc)
    except Exception as exc:  # Spark wraps errors raised inside tasks
        from .spark.failures import spark_failure

        recovered = spark_failure(error=exc)
        if recovered is None:
            raise
        return _failed(args, recovered)


def _failed(args: argparse.Namespace, exc: Exception) -> int:
    """One line on stderr (and, with --json, one JSON object on stdout); exit code 1."""
    reason = " ".join(str(exc).split())
    print(f"pgoutput-spark: error: {reason}", file=sys.stderr)
    if getattr(args, "json", False):
        print(json.dumps({"command": args.command, "ok": False, "version": __version__,
                          "error": type(exc).__name__, "reason": reason}))
    return 1


if __name__ == "__main__":
    sys.exit(main())
