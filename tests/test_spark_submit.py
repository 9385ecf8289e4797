"""A job run by ``spark-submit`` itself, with the package shipped as a wheel (``--py-files``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
DELTA = "io.delta:delta-spark_2.13:4.0.0"


def _submit(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    return subprocess.run([str(BIN / "spark-submit"), *args], cwd=cwd, env=env, text=True,
                          capture_output=True, timeout=600)


def test_a_job_runs_under_spark_submit_from_a_wheel(tmp_path):
    # The README's build step.
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path / "dist"),
                    str(ROOT)], check=True, capture_output=True, timeout=300)
    (wheel,) = (tmp_path / "dist").glob("pgoutput_spark-*.whl")
    # Run from elsewhere: the job file, configuration and capture are named by path.
    run = _submit("--master", "local[2]", "--packages", DELTA, "--py-files", str(wheel),
                  str(ROOT / "jobs" / "decode.py"), "--config", str(ROOT / "conf" / "local.yaml"),
                  "--capture", str(ROOT / "examples" / "sample_capture"), "--json", "--quiet", cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    # Every message decoded, and the counts by type equal the raw messages' first bytes.
    import collections

    import pyarrow.parquet as pq

    from pgoutput_spark.decoder.protocol import MessageType

    raw = [m for f in (ROOT / "examples" / "sample_capture").glob("*.parquet")
           for m in pq.read_table(f, columns=["data"]).column("data").to_pylist()]
    assert result["ok"] and result["result"]["messages"] == len(raw) and result["result"]["quarantined"] == 0
    assert result["result"]["by_type"] == dict(collections.Counter(MessageType(m[0]).column_name for m in raw))
    # The shipped wheel comes first on the job's path, before the checkout's editable install.
    where = tmp_path / "where.py"
    where.write_text("import pgoutput_spark\nprint(pgoutput_spark.__file__)\n")
    found = _submit("--master", "local[1]", "--py-files", str(wheel), str(where), cwd=tmp_path)
    assert found.returncode == 0 and wheel.name in found.stdout, found.stdout + found.stderr[-2000:]

    # A failure: exit status 1 and one line saying why.
    bad = _submit("--master", "local[1]", "--py-files", str(wheel), str(ROOT / "jobs" / "decode.py"),
                  "--config", str(tmp_path / "missing.yaml"), cwd=tmp_path)
    assert bad.returncode == 1, bad.stdout + bad.stderr[-3000:]
    # spark-submit's PythonRunner merges the driver's stderr into its own stdout.
    ours = [line for line in bad.stdout.splitlines() if line.startswith("pgoutput-spark")]
    assert ours == [f"pgoutput-spark: error: can't read configuration {tmp_path / 'missing.yaml'}: "
                    f"No such file or directory"]

    # A bad message, found inside a Spark task: the one line, without Spark's traces of the task.
    import pyarrow as pa

    (tmp_path / "bad").mkdir()
    pq.write_table(pa.table({"seq": pa.array([7], pa.int64()), "lsn": pa.array([0x16B3748], pa.int64()),
                             "data": pa.array([b"!"], pa.binary())}), tmp_path / "bad" / "a.parquet")
    bad = _submit("--master", "local[1]", "--packages", DELTA, "--py-files", str(wheel),
                  str(ROOT / "jobs" / "decode.py"), "--capture", str(tmp_path / "bad"), cwd=tmp_path)
    assert bad.returncode == 1, bad.stdout + bad.stderr[-3000:]
    ours = [line for line in bad.stdout.splitlines() if line.startswith("pgoutput-spark")]
    assert ours == ["pgoutput-spark: error: message.type at seq 7 (lsn 0/16B3748): "
                    "unknown message type byte '!' (0x21) at offset 0"]
    output = bad.stdout + bad.stderr
    assert "Traceback" not in output and "Exception in task" not in output and "Lost task" not in output, output


def test_every_command_has_its_job():
    """Each `pgoutput-spark` command has a spark-submit twin ``jobs/<command>.py`` that runs it."""
    from pgoutput_spark.cli import _parser

    commands = set(_parser()._subparsers._group_actions[0].choices)  # type: ignore[union-attr]
    jobs = {p.stem for p in (ROOT / "jobs").glob("*.py")}
    assert jobs == commands
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for job in sorted(jobs):
        done = subprocess.run([sys.executable, str(ROOT / "jobs" / f"{job}.py"), "--help"], env=env, text=True,
                              capture_output=True, timeout=120)
        assert done.returncode == 0 and done.stdout.startswith(f"usage: pgoutput-spark {job} "), done
