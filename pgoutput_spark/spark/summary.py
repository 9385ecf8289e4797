"""A small summary of a decoded capture: what the `decode` command prints."""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from ..capture import repeated_note
from ..lsn import Lsn
from .session import one_row


@dataclass(frozen=True)
class CaptureSummary:
    messages: int
    by_type: dict[str, int]
    transactions: dict[str, int]
    relations: list[tuple[int, str, int]]  # (relation id, schema.name, columns in last Relation)
    lsn_range: tuple[int, int] | None
    quarantined: int
    repeated_rows: int = 0  # capture rows left out as repeats of a message (`one_row_per_message`)

    def render(self) -> str:
        lines = [f"messages: {self.messages}{repeated_note(self.repeated_rows)}"]
        if self.lsn_range:
            lines.append(f"lsn range: {Lsn(self.lsn_range[0])} .. {Lsn(self.lsn_range[1])}")
        lines.append(f"quarantined: {self.quarantined}")
        lines.append("")
        lines.append("messages by type:")
        width = max((len(k) for k in self.by_type), default=0)
        lines += [f"  {name:<{width}}  {count:>9}" for name, count in sorted(self.by_type.items())]
        lines.append("")
        lines.append("transactions:")
        lines += [f"  {name:<22} {count:>9}" for name, count in self.transactions.items()]
        lines.append("")
        lines.append(f"relations ({len(self.relations)}):")
        lines += [f"  {oid:>8}  {name}  ({ncols} columns)" for oid, name, ncols in self.relations]
        return "\n".join(lines)


def summarize(decoded: DataFrame) -> CaptureSummary:
    """Counts by message type, transactions by kind and the relations seen."""
    counts = {row["message_type"] or "(undecodable)": row["count"]
              for row in decoded.groupBy("message_type").count().collect()}
    stats = one_row(decoded.agg(
        F.count(F.lit(1)).alias("messages"),
        F.min("lsn").alias("min_lsn"),
        F.max("lsn").alias("max_lsn"),
        F.count("error").alias("quarantined"),
        F.countDistinct(F.when(F.col("message_type") == "stream_start", F.col("stream_start.xid")))
        .alias("streamed"),
    ))
    latest = F.max_by(
        F.struct(F.col("relation.namespace").alias("namespace"),
                 F.col("relation.relation_name").alias("name"),
                 F.size("relation.columns").alias("ncols")),
        F.col("seq"),
    )
    relations = (
        decoded.where(F.col("relation").isNotNull())
        .groupBy(F.col("relation.relation_id").alias("relation_id"))
        .agg(latest.alias("last"))
        .orderBy("relation_id")
        .collect()
    )
    transactions = {
        "committed (plain)": counts.get("commit", 0),
        "streamed": stats["streamed"],
        "stream commits": counts.get("stream_commit", 0),
        "stream aborts": counts.get("stream_abort", 0),
        "prepared": counts.get("prepare", 0) + counts.get("stream_prepare", 0),
        "commit prepared": counts.get("commit_prepared", 0),
        "rollback prepared": counts.get("rollback_prepared", 0),
    }
    assert stats is not None
    lsn_range = (stats["min_lsn"], stats["max_lsn"]) if stats["messages"] else None
    return CaptureSummary(
        messages=stats["messages"],
        by_type=counts,
        transactions=transactions,
        relations=[(r["relation_id"], f"{r['last']['namespace']}.{r['last']['name']}", r["last"]["ncols"])
                   for r in relations],
        lsn_range=lsn_range,
        quarantined=stats["quarantined"],
    )
