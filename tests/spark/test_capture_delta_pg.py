"""`capture_slot` into a Delta table: one append per chunk, exactly once across a crash.

The landing and the mirrors are behind a ``viewfs://`` URI (the `lake` fixture), as
with object storage: nothing may reach them as local paths.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pgoutput_spark import read_capture
from pgoutput_spark.apply import run_apply
from pgoutput_spark.errors import CaptureError
from pgoutput_spark.slot import source
from pgoutput_spark.slot.capture import capture_slot
from pgoutput_spark.slot.verify import verify_mirrors
from pgoutput_spark.testing.pgcluster import PgCluster

from ..plugins.spark import Lake
from ..slot.test_capture_pg import PUB, _assert_each_transaction_once, _landed, _setup, _streamed_workload

pytestmark = [pytest.mark.spark, pytest.mark.postgres]


def test_a_delta_landing_survives_a_crash_between_commit_and_advance(
        spark: Any, pg15: PgCluster, tmp_path: Path, lake: Lake, monkeypatch: pytest.MonkeyPatch) -> None:
    db = _setup(pg15, slots=("landed", "twin"), two_phase=True)
    _streamed_workload(pg15, db, two_phase=True)
    options = {"proto_version": 3, "streaming": "on", "two_phase": True}
    delta, parquet, target = f"{lake.uri}/delta", tmp_path / "parquet", f"{lake.uri}/target"
    advance, calls = source.SlotSource.advance, []

    def crash_at_the_second_advance(self: source.SlotSource, lsn: Any) -> None:
        calls.append(lsn)
        if len(calls) == 2:  # chunk 1 is committed to Delta, the slot not moved
            raise RuntimeError("crash")
        advance(self, lsn)

    monkeypatch.setattr(source.SlotSource, "advance", crash_at_the_second_advance)
    with pytest.raises(RuntimeError, match="crash"):
        capture_slot(delta, slot=f"{db}_landed", dsn=pg15.conninfo(db), publications=[PUB], chunk_size=40,
                     format="delta", spark=spark, **options)
    monkeypatch.undo()
    resumed = capture_slot(delta, slot=f"{db}_landed", dsn=pg15.conninfo(db), chunk_size=40,
                           format="delta", spark=spark)
    assert resumed.recovered and resumed.caught_up
    capture_slot(str(parquet), slot=f"{db}_twin", dsn=pg15.conninfo(db), publications=[PUB], chunk_size=40,
                 **options)

    landed = read_capture(spark, delta).orderBy("seq").toArrow()
    expected = _landed(parquet)
    assert landed.cast(expected.schema).equals(expected)
    _assert_each_transaction_once(landed)
    appends = spark.sql(f"DESCRIBE HISTORY delta.`{delta}`").where("operation = 'WRITE'").count()
    assert appends == len(list(parquet.glob("part-*.parquet")))  # one commit per chunk
    # the apply reads the Delta landing; verify finds the mirrors equal to the tables
    run_apply(spark, read_capture(spark, delta), target)
    verified = verify_mirrors(spark, target, delta, dsn=pg15.conninfo(db))
    assert [t.state for t in verified.tables] == ["equal", "equal"], verified.render()
    with pytest.raises(CaptureError, match="was landed with options"):
        capture_slot(delta, slot=f"{db}_landed", dsn=pg15.conninfo(db), messages=True,
                     format="delta", spark=spark)
