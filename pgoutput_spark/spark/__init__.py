"""Thin Spark glue: the shared session builder and the `mapInArrow` decode wrapper."""
