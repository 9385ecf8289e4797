"""Mirrors rebuilt from the start of the capture (``apply --rebuild``): every change of the
tables replayed up to the run's end, each mirror replaced in one commit."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from .assemble.relations import RelationHistory
from .assemble.typed import change_schema
from .capture import one_row_per_message
from .config import TablesConfig
from .errors import ConfigError
from .ledger import Ledger
from .mirroring.deltalog import user_metadata
from .mirroring.names import quote
from .mirroring.schema import SchemaPlan
from .mirroring.table import converted_net, mirror_spec
from .results import TableResult
from .spark.assemble import ScanState, assemble
from .spark.changes import CHANGE_ROW_COLUMNS
from .spark.decode import OnError, decode
from .spark.session import one_row, release
from .spark.sessions import find_sessions


def _cannot_rebuild(name: str, reason: str) -> ConfigError:
    return ConfigError(f"rebuild: {name} cannot be rebuilt from the capture: {reason}; "
                       f"re-snapshot it instead (snapshot --table {name}); nothing was written")


@dataclass(frozen=True)
class Rebuild:
    """Tables to rebuild from the start of the capture (`run_apply`'s ``rebuild``)."""

    capture: DataFrame  # the whole capture, canonical columns
    tables: tuple[str, ...]
    on_error: OnError

    def relations(self, history: RelationHistory, tables: TablesConfig,
                  snapshotted: Callable[[int], bool]) -> list[int]:
        """The relation OIDs to rebuild; `ConfigError` for a table that cannot be rebuilt
        (``snapshotted``: whether a relation's mirror holds a snapshot's rows)."""
        out = []
        for name in dict.fromkeys(self.tables):
            oids = [oid for oid in history.relations if history.first_name(oid) == name]
            if not oids:
                known = ", ".join(sorted({history.first_name(oid) for oid in history.relations})) or "none"
                raise ConfigError(f"rebuild: no table {name} in the capture's relations (known: {known})")
            if len(oids) > 1:
                raise ConfigError(f"rebuild: several relations were named {name} (dropped and created again); "
                                  f"re-snapshot it instead")
            reason = ("it started from a snapshot, whose rows are not in the capture" if snapshotted(oids[0])
                      else "it keeps a history table, which a rebuild would not match" if
                      tables.keeps_history(name) else "tables.include / exclude leave it out" if
                      not tables.selected(name) else None)
            if reason:
                raise _cannot_rebuild(name, reason)
            out.append(oids[0])
        return out

    def check_capture(self, ledger: Ledger, lo: int | None, names: list[str]) -> None:
        """`ConfigError` when the capture holds fewer messages up to ``lo`` than the finished runs
        read there (their ``_runs`` rows): files deleted or expired from the landing, whose
        changes a replay would leave out of the rebuilt mirrors. Counts the capture's seqs up
        to ``lo``, one Spark job (a replay reads them all anyway). Rows of files accepted late
        (``accept_late_files``) count too, so they can hide as many missing ones."""
        if lo is None:
            return
        read = sum(messages or 0 for _, hi, messages in ledger.slices() if hi <= lo)
        held, first = one_row(self.capture.where(F.col("seq") <= lo).agg(F.count_distinct("seq"), F.min("seq")))
        if held >= read:
            return
        starts = "nothing" if first is None else f"seq {first} onwards"
        reason = (f"the capture no longer holds every message the runs read: up to seq {lo} the runs read "
                  f"{read} messages and the capture holds {held} ({starts}); {read - held} are gone "
                  f"(capture files deleted or expired from the landing?), and a replay without them would "
                  f"leave their changes out")
        tables = " ".join(f"--table {name}" for name in names)
        raise ConfigError(f"rebuild: {', '.join(names)} cannot be rebuilt from the capture: {reason}; "
                          f"re-snapshot {'it' if len(names) == 1 else 'them'} instead (snapshot {tables}); "
                          f"nothing was written")

    def run(self, ledger: Ledger, hi: int, skip_origins: tuple[str, ...], history: RelationHistory,
            plans: dict[int, SchemaPlan], tables: TablesConfig, say: Callable[[str], None]) -> list[TableResult]:
        """Replay every change of the tables up to ``hi`` and replace their mirrors, one commit each."""
        replayed, _ = one_row_per_message(self.capture.where(F.col("seq") <= hi))
        sessions = find_sessions(replayed, None)
        everything = decode(replayed, on_error=self.on_error, tuples=False, positions=ScanState(),
                            raw_as_string=True, sessions=sessions).persist()
        assembled = assemble(everything, ScanState(), skip_origins=skip_origins, sessions=sessions)
        committed = assembled.committed.select(*CHANGE_ROW_COLUMNS).persist()
        out = []
        try:
            to_lsn = one_row(committed.agg(F.max("commit_lsn")))[0]
            for oid, plan in plans.items():
                latest = history.latest(oid)
                name = f"{latest.namespace}.{latest.name}"
                spec = mirror_spec(history, oid, plan, tables)
                arrow_schema = change_schema(plan.columns)
                net = converted_net(ledger.spark, committed, oid, history, spec, arrow_schema, tuples=False)
                rows = net.where(F.col("_action").isin("upsert", "insert")).select(
                    *[F.col(quote(c)) for c in spec.columns]).persist()
                try:
                    n_rows = rows.count()
                    app_id = f"{ledger.pipeline}:rebuild:{oid}"
                    meta = {"pipeline": ledger.pipeline, "rebuild": True, "hi_seq": hi, "to_lsn": to_lsn}
                    # One commit: readers see the old mirror or the rebuilt one. A rerun rebuilds the same.
                    (rows.write.format("delta").mode("overwrite").option("overwriteSchema", "true")
                     .option("userMetadata", user_metadata(meta, app_id)).save(plan.path))
                finally:
                    release(rows)
                out.append(TableResult(name, plan.path, oid, inserted=n_rows, status="rebuilt"))
                say(f"rebuilt {name}: {n_rows} rows from the start of the capture")
        finally:
            release(committed)
            assembled.release()
            release(everything)
        return out
