"""Create a pgoutput slot and copy every published table into new Delta mirrors, as a spark-submit job.

    spark-submit --packages io.delta:delta-spark_2.13:4.0.0 \
        --py-files dist/pgoutput_spark-0.1.0-py3-none-any.whl \
        jobs/snapshot.py --config conf/local.yaml --target /data/mirror \
        --slot mirror --publication mirror_pub [--dsn "host=db dbname=app user=replicator"]

The tables are copied inside the snapshot the slot exported, so the mirrors
hold the source as of the slot's consistent point; `jobs/capture.py` then lands
the slot's messages and `jobs/apply.py` merges them. Exits non-zero with a
one-line reason on failure.
"""

import sys

from pgoutput_spark.cli import main

if __name__ == "__main__":
    sys.exit(main(["snapshot", *sys.argv[1:]]))
