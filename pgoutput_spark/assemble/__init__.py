"""Transactions and relation state: decoded messages -> committed, ordered changes."""
