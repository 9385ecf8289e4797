"""Write committed, typed changes of a capture to Delta change tables, as a spark-submit job.

    spark-submit --packages io.delta:delta-spark_2.13:4.0.0 \
        --py-files dist/pgoutput_spark-0.1.0-py3-none-any.whl \
        jobs/changes.py --config conf/local.yaml --target /data/mirror [--capture PATH]

Each run takes the capture rows after the previous run's last seq (at most N
of them with `--max-messages N`; `--until-caught-up` runs again until none
remain); re-running with nothing new makes no Delta commit. Exits non-zero
with a one-line reason on failure.
"""

import sys

from pgoutput_spark.cli import main

if __name__ == "__main__":
    sys.exit(main(["changes", *sys.argv[1:]]))
