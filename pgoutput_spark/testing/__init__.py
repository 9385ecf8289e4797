"""Helpers for tests, benchmarks and sample captures: a throwaway PostgreSQL
cluster (`pgcluster`) and a Parquet writer for captured messages
(`capture_files`). Nothing here imports Spark."""
