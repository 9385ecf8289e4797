"""Helpers for tests, benchmarks and sample captures: a throwaway PostgreSQL
cluster (`pgcluster`), a Parquet writer for captured messages
(`capture_files`) and the machine's count of processes started (`processes`).
Nothing here imports Spark."""
