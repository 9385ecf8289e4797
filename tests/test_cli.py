"""The pgoutput-spark command line on the committed sample capture."""

from __future__ import annotations

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
