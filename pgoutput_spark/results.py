"""What an `apply` run did: `ApplyResult` (per run) and `TableResult` (per mirror), as printed."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from .capture import Landed, late_note, repeated_note
from .lsn import Lsn
from .spark.pending import ForgottenStream


@dataclass(frozen=True)
class TableResult:
    table: str
    path: str
    relation_id: int
    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    skipped: int = 0
    truncated: bool = False
    status: str = "merged"  # merged | already applied
    history: int | None = None  # versions written to the table's history (tables.history), if it has one
    tasks: int = 1  # tasks its net change was spread over (`net_task_rows`)


@dataclass(frozen=True)
class ApplyResult:
    lo: int | None
    hi: int | None
    from_lsn: int | None = None
    to_lsn: int | None = None
    messages: int = 0
    transactions: int = 0
    tables: list[TableResult] = field(default_factory=list)
    quarantined_messages: int = 0
    open_rows: int = 0
    redone: bool = False
    skipped: bool = False
    duration_s: float = 0.0
    excluded: tuple[str, ...] = ()  # tables with changes in the slice that tables.include/exclude leave out
    # Mirrors that took changes of a table other than the one they started from, under the same
    # name (the source table was dropped and created again), not re-snapshotted since (`_replaced`).
    replaced: tuple[str, ...] = ()
    # (name, name at its snapshot) of tables renamed after their snapshot and before their first
    # captured change: their changes start a mirror of the new name.
    renamed: tuple[tuple[str, str], ...] = ()
    note: str | None = None  # what a bounded (backfill) slice did besides the plain case
    remaining: bool = False  # max_messages ended the run before the capture (or its slice) ended
    repeated_rows: int = 0  # capture rows left out as repeats of a message (`one_row_per_message`)
    # Capture files no earlier run saw, and their rows at or below the position (`capture.Landed`).
    landed: Landed = field(default_factory=Landed)
    forgotten: tuple[ForgottenStream, ...] = ()  # streamed transactions forgotten (``forget_xids``)
    # When the commit at ``to_lsn`` committed in the source (its Commit message's time, UTC).
    to_commit_ts: datetime | None = None

    def render(self) -> str:
        if self.skipped:
            return self.note or f"nothing new after seq {self.lo}: no Delta commit"
        start = "the start" if self.lo is None else f"seq {self.lo}"
        applied = ("no transaction committed in this slice" if self.from_lsn is None else
                   f"commits {Lsn(self.from_lsn)} .. {Lsn(self.to_lsn or 0)}"
                   + ("" if self.to_commit_ts is None else f" (the last committed {utc_text(self.to_commit_ts)})"))
        lines = [f"capture slice: after {start} up to seq {self.hi}"
                 + (" (redoing an interrupted run)" if self.redone else ""),
                 f"applied: {applied}", f"messages: {self.messages}{repeated_note(self.repeated_rows)}",
                 f"transactions applied: {self.transactions}",
                 f"quarantined messages: {self.quarantined_messages}",
                 f"rows of open transactions carried over: {self.open_rows}"]
        if self.note:
            lines.insert(1, self.note)
        if self.landed.late_rows:
            lines.append(late_note(self.landed))
        lines += [f.note() for f in self.forgotten]
        if self.excluded:
            lines.append(f"not mirrored (tables.include / exclude): {', '.join(self.excluded)}")
        if self.tables:
            width = max(len(t.table) for t in self.tables)
            lines.append(f"{'table':<{width}}  {'inserted':>9} {'updated':>9} {'deleted':>9} "
                         f"{'skipped':>8}  note")
            for t in sorted(self.tables, key=lambda t: t.table):
                note = ", ".join(n for n in (("truncated" if t.truncated else ""),
                                             ("" if t.status == "merged" else t.status),
                                             ("" if t.history is None else f"history +{t.history} versions"),
                                             ("" if t.tasks == 1 else f"net change in {t.tasks} tasks"))
                                 if n)
                lines.append(f"{t.table:<{width}}  {t.inserted:>9} {t.updated:>9} {t.deleted:>9} "
                             f"{t.skipped:>8}  {note}".rstrip())
        missing = sorted(t.table for t in self.tables if t.skipped)
        if missing:
            lines.append(_skipped_hint(missing))
        if self.replaced:
            lines.append(_replaced_hint(list(self.replaced)))
        if self.renamed:
            lines.append(_renamed_hint(list(self.renamed)))
        lines.append(f"took {self.duration_s:.1f} s")
        return "\n".join(lines)


def _skipped_hint(tables: list[str]) -> str:
    """What the run says when updates or deletes found no mirror row (``tables``: where)."""
    return (f"skipped: updates or deletes that found no row in the mirror of {', '.join(tables)} "
            f"(a PostgreSQL subscriber skips them too; each is kept with its reason in "
            f"_pgoutput/skipped under the target). A table added to the publication with rows "
            f"already in it (ALTER PUBLICATION ... ADD TABLE) sends none of those rows, and a "
            f"mirror changed behind the pipeline's back misses some: `verify` shows which mirrors "
            f"differ, a re-snapshot mends them (pgoutput-spark snapshot --table {tables[0]} ...)")


def _replaced_hint(tables: list[str]) -> str:
    """What the run says when a mirror took changes of a new table of its name (``tables``)."""
    return (f"replaced in the source: {', '.join(tables)} took changes of a table that is not the "
            f"one its mirror started from (another relation OID under the same name: the table was "
            f"dropped and created again, or renamed and another created with its name); the mirror "
            f"still holds the old table's rows, as a PostgreSQL subscriber's table would. `verify` "
            f"shows the difference; a re-snapshot starts the mirror from the new table "
            f"(pgoutput-spark snapshot --table {tables[0]} ...)")


def _renamed_hint(tables: list[tuple[str, str]]) -> str:
    """What the run says of tables renamed after their snapshot (``tables``: (name, old name))."""
    names = ", ".join(f"{name} (snapshotted as {old})" for name, old in tables)
    return (f"renamed in the source after the snapshot, before any change of them was captured: {names}. "
            f"Their changes go to a mirror of the name they had when the capture first saw them, which "
            f"lacks the snapshot's rows (updates and deletes of those rows are skipped); the mirror of "
            f"the old name stays as it was. Re-snapshot them under their names now "
            f"(pgoutput-spark snapshot --table {tables[0][0]} ...)")


#: Spark's timestamps count microseconds from it (``unix_micros``).
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def utc_from_micros(micros: int | None) -> datetime | None:
    """A Spark timestamp's ``unix_micros`` as an aware UTC datetime: read so, not as Spark hands a
    timestamp to Python (naive, in the Python process's local time zone)."""
    return None if micros is None else _EPOCH + timedelta(microseconds=micros)


def utc_text(at: datetime) -> str:
    """A source commit's time as the runs print it: UTC to the microsecond, as PostgreSQL keeps it."""
    return f"{at.astimezone(timezone.utc):%Y-%m-%d %H:%M:%S.%f} UTC"


@contextmanager
def timed(log: logging.Logger, what: str) -> Iterator[None]:
    """Log how long one step of a run took, at level INFO (``what: 1.23 s``)."""
    started = time.perf_counter()
    try:
        yield
    finally:
        log.info("%s: %.2f s", what, time.perf_counter() - started)
