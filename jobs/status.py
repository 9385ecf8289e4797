"""Print a target's runs, its consistent read point and its mirrors, as a spark-submit job.

    spark-submit --packages io.delta:delta-spark_2.13:4.0.0 \
        --py-files dist/pgoutput_spark-0.1.0-py3-none-any.whl \
        jobs/status.py --target /data/mirror [--json]

Exits non-zero with a one-line reason on failure.
"""

import sys

from pgoutput_spark.cli import main

if __name__ == "__main__":
    sys.exit(main(["status", *sys.argv[1:]]))
