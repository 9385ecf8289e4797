pytest_plugins = ["tests.plugins.postgres", "tests.plugins.spark"]

# tests/pending: the end-to-end apply tests against PostgreSQL 15 and 16 (issue 5),
# written at the end of a session and not yet run to completion on a clean machine.
# Not collected until a session has run them green; see the issue 5 note.
collect_ignore = ["pending"]
