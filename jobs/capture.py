"""Land a pgoutput replication slot's messages as capture files, as a spark-submit job.

    spark-submit --py-files dist/pgoutput_spark-0.1.0-py3-none-any.whl \
        jobs/capture.py --landing /data/capture --slot mirror --publication mirror_pub \
        [--dsn "host=db dbname=app user=replicator"] [--create-slot] [--chunk-size N]

The capture needs no Spark: it reads the slot with psycopg and writes Parquet
from the driver. Each chunk is stored before the slot is advanced past it, so
a killed run, re-run, lands every message exactly once. Exits non-zero with a
one-line reason on failure.
"""

import sys

from pgoutput_spark.cli import main

if __name__ == "__main__":
    sys.exit(main(["capture", *sys.argv[1:]]))
