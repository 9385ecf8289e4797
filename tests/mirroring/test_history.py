"""History versions equal, at every commit, the table a row-by-row applier holds then."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from pgoutput_spark.mirroring.history import history_changes

from .test_net import KEYED, NAMES, SCHEMA, _normal, per_task, reference, scenario


def _lsn(commit: int) -> int:
    return 1000 * (commit + 1)


def _table(initial, changes, shuffle):
    rows = [{"_op": "pre", "_commit_seq": -1, "_seq": -1, "_old": None, "_unchanged_toast": [], **r}
            for r in initial]  # every current version: a superset of what the job reads is harmless
    epoch = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    for i, c in enumerate(changes):
        rows.append({"_op": c["_op"], "_commit_seq": c["commit"], "_seq": i, "_old": c["_old"],
                     "_commit_lsn": _lsn(c["commit"]), "_commit_ts": epoch + dt.timedelta(seconds=c["commit"]),
                     "_unchanged_toast": c["_unchanged_toast"], **(c["new"] or {})})
    shuffle.shuffle(rows)  # history_changes finds the commit order itself
    table = pa.table({f.name: pa.array([r.get(f.name) for r in rows], f.type) for f in SCHEMA}, schema=SCHEMA)
    # In chunks of a few rows, as a task receives them in batches.
    return pa.Table.from_batches(table.to_batches(max_chunksize=shuffle.randint(1, 4)), schema=SCHEMA)


def _merged(initial, out):
    """The history table after `merge_history`: earlier versions closed, new versions inserted."""
    history = [{**r, "_valid_from_lsn": 0, "_valid_to_lsn": None, "_is_current": True} for r in initial]
    for r in out.to_pylist():
        if r["_action"] == "close":
            for h in history:
                if h["_is_current"] and all(h[k] == r[k] for k in KEYED.key):
                    h.update(_valid_to_lsn=r["_valid_to_lsn"], _is_current=False)
    history += [r for r in out.to_pylist() if r["_action"] == "version"]
    return history


@settings(max_examples=400, deadline=None)
@given(scenario(KEYED), st.randoms(use_true_random=False), st.integers(1, 6), st.integers(1, 3))
def test_versions_valid_at_each_commit_equal_the_row_by_row_state(case, rnd, buckets, tasks):
    """In one task, or in several by key (`rows.by_key`)."""
    initial, changes = case
    parts = per_task(_table(initial, changes, rnd), KEYED, buckets, tasks, rnd.randint(1, 4))
    history = _merged(initial, pa.concat_tables([history_changes(part, KEYED) for part in parts]))
    for commit in sorted({c["commit"] for c in changes} | {-1}):
        lsn = _lsn(commit) if commit >= 0 else 0
        valid = [{n: h[n] for n in NAMES} for h in history
                 if h["_valid_from_lsn"] <= lsn and (h["_valid_to_lsn"] is None or lsn < h["_valid_to_lsn"])]
        expected = reference(initial, [c for c in changes if c["commit"] <= commit], KEYED)
        assert _normal(valid) == _normal(expected), commit
    assert all(h["_is_current"] == (h["_valid_to_lsn"] is None) for h in history)
