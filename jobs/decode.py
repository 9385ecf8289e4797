"""Decode a capture and print its summary, as a spark-submit job.

    spark-submit --packages io.delta:delta-spark_2.13:4.0.0 \
        --py-files dist/pgoutput_spark-0.1.0-py3-none-any.whl \
        jobs/decode.py --config conf/local.yaml [--capture PATH] [--on-error quarantine]

Exits non-zero with a one-line reason on failure.
"""

import sys

from pgoutput_spark.cli import main

if __name__ == "__main__":
    sys.exit(main(["decode", *sys.argv[1:]]))
