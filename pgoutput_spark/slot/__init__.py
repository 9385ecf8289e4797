"""Landing a pgoutput replication slot's messages as capture files (``pgoutput-spark capture``).

`capture.capture_slot` is the entry point; `source` reads the slot (psycopg),
`landing` writes the Parquet files, `settings` holds the session settings the
type conversion relies on. Only `source` and `capture` import psycopg.
"""
