"""Decoding of pgoutput messages: vectorized over Arrow batches, no Spark import."""
