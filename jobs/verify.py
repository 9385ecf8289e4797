"""Compare every mirror with its live source table, as a spark-submit job.

    spark-submit --packages io.delta:delta-spark_2.13:4.0.0 \
        --py-files dist/pgoutput_spark-0.1.0-py3-none-any.whl \
        jobs/verify.py --target /data/mirror --landing /data/capture \
        [--dsn "host=db dbname=app user=replicator"] [--keys]

Prints one line per table (equal, differs, not comparable, no source). Exits 3
when a mirror differs from its source (a scheduler sees drift), non-zero with a
one-line reason on failure.
"""

import sys

from pgoutput_spark.cli import main

if __name__ == "__main__":
    sys.exit(main(["verify", *sys.argv[1:]]))
