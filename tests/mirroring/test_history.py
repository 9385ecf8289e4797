"""History versions equal, at every commit, the table a row-by-row applier holds then."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from pgoutput_spark.mirroring.history import TOAST_CONFLICT, history_changes
from pgoutput_spark.mirroring.net import NEW_HALF, OLD_HALF, in_halves, net_changes

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
    _assert_valid_at_each_commit(initial, changes, pa.concat_tables([history_changes(part, KEYED) for part in parts]))


@settings(max_examples=600, deadline=None)
@given(st.data())
def test_versions_in_halves_equal_the_row_by_row_state_or_ask_for_one_task(data):
    """What `history_frame` with ``halves`` does: rows in buckets by the key each looks up, an
    update whose new key is in another bucket in both as halves (its old half ends the old key's
    version, its new half opens the new key's). The buckets' outputs together give the versions
    of one task, unless one says ``conflict`` (only a run in which an update finds no row can
    say that) or `TOAST_CONFLICT` (a key change that leaves a column unchanged)."""
    initial, changes = data.draw(scenario(KEYED, found=data.draw(st.booleans())))
    rnd = data.draw(st.randoms(use_true_random=False))
    table = _table(initial, changes, rnd)
    parts = in_halves(table, KEYED, data.draw(st.integers(1, 5)))
    assert parts is not None
    out = pa.concat_tables([history_changes(part, KEYED, halves=halves) for part, halves in parts])
    skipped = {r["_seq"] for r in net_changes(table, KEYED).to_pylist() if r["_action"] == "skipped"}
    missing = {i for i, c in enumerate(changes) if c["_op"] == "update" and i in skipped}
    toast = {i for i, c in enumerate(changes) if c["_op"] == "update" and c["_old"] is not None
             and c["_unchanged_toast"]}
    conflicts = {r["_version_seq"] for r in out.to_pylist() if r["_action"] == "conflict"}
    toast_conflicts = {r["_version_seq"] for r in out.to_pylist() if r["_action"] == TOAST_CONFLICT}
    assert conflicts <= missing and toast_conflicts <= toast
    if not conflicts and not toast_conflicts:
        _assert_valid_at_each_commit(initial, changes, out)


def test_a_key_change_between_buckets_closes_one_version_and_opens_another_in_two_tasks():
    row = {"id": 1, "k2": 0, "big": "x", "n": 1}
    moves = [{**row, "id": i} for i in range(2, 40)]
    for new in moves:  # a new key in the other bucket of two
        changes = [{"_op": "update", "new": new, "_old": {"id": 1, "k2": 0}, "_unchanged_toast": [], "commit": 1}]
        parts = in_halves(_table([row], changes, _NoShuffle()), KEYED, 2)
        if sorted(int(h) for _, halves in parts for h in halves if h) == [OLD_HALF, NEW_HALF]:
            break
    else:
        raise AssertionError("no key of 2..39 in the other bucket")
    outs = [history_changes(part, KEYED, halves=halves).to_pylist() for part, halves in parts]
    acts = sorted((r["_action"], r["id"], r["_valid_from_lsn"], r["_valid_to_lsn"]) for out in outs for r in out)
    # What one task gives: the old key's version closed, the new key's opened (and any version
    # of the new key closed, a no-op for a key without one).
    whole = history_changes(_table([row], changes, _NoShuffle()), KEYED).to_pylist()
    assert acts == sorted((r["_action"], r["id"], r["_valid_from_lsn"], r["_valid_to_lsn"]) for r in whole)
    assert [a for a in acts if a[0] == "version"] == [("version", new["id"], _lsn(1), None)]
    assert ("close", 1, None, _lsn(1)) in acts
    # The same key change leaving a column unchanged: its value is in the old key's task.
    changes[0].update(new={**new, "big": None}, _unchanged_toast=["big"])
    parts = in_halves(_table([row], changes, _NoShuffle()), KEYED, 2)
    outs = [history_changes(part, KEYED, halves=halves).to_pylist() for part, halves in parts]
    assert [(r["_action"], r["_version_seq"]) for out in outs for r in out if "conflict" in r["_action"]] == \
        [(TOAST_CONFLICT, 0)]


def _passes(table, tasks):
    """`apply`'s history in halves: passes over ``tasks`` buckets, each without the new versions
    of the updates earlier passes found missing their row, until one finds none (or a key change
    that only one task settles). The last pass's output, the seqs it skipped, and the number of
    passes."""
    parts = in_halves(table, KEYED, tasks)
    assert parts is not None
    skipping = np.zeros(0, np.int64)
    for passes in range(1, table.num_rows + 2):
        out = pa.concat_tables([history_changes(part, KEYED, halves=halves, skipping=skipping)
                                for part, halves in parts])
        rows = out.to_pylist()
        found = np.array(sorted({r["_version_seq"] for r in rows if r["_action"] == "conflict"}), np.int64)
        if not found.size or any(r["_action"] == TOAST_CONFLICT for r in rows):
            return out, skipping, passes
        assert not np.isin(found, skipping).any()  # each pass finds others, or none
        skipping = np.union1d(skipping, found)
    raise AssertionError("the passes did not end")


@settings(max_examples=600, deadline=None)
@given(st.data())
def test_versions_in_halves_again_without_the_missing_rows_updates_equal_one_task(data):
    """An update whose row is nowhere: the bucket of its old row says ``conflict``, and `apply`
    computes the versions again with it ``skipping`` (its new version left out where it went),
    until no bucket says so. Then the versions are valid at each commit as the row-by-row
    applier's table is, and the passes skipped only updates one task skips. Only a key change
    that leaves a TOAST column unchanged needs one task."""
    initial, changes = data.draw(scenario(KEYED))
    table = _table(initial, changes, data.draw(st.randoms(use_true_random=False)))
    out, skipping, passes = _passes(table, data.draw(st.integers(2, 5)))
    if any(r["_action"] == TOAST_CONFLICT for r in out.to_pylist()):
        assert any(c["_op"] == "update" and c["_old"] is not None and c["_unchanged_toast"] for c in changes)
        return
    skipped = {r["_seq"] for r in net_changes(table, KEYED).to_pylist() if r["_action"] == "skipped"}
    assert set(skipping.tolist()) <= skipped
    _assert_valid_at_each_commit(initial, changes, out)


def test_an_update_missing_its_row_leaves_out_its_new_version_and_so_can_a_later_one():
    """Two key changes of a row the history lacks, the second moving the first's new row on,
    each to the other bucket of two: the first pass finds the first missing, the second pass the
    second (its row is gone now), the third none; no version is opened, as in one task."""
    kept = {"id": 999, "k2": 0, "big": "x", "n": 1}

    def bucket(key):
        change = {"_op": "insert", "new": {**kept, "id": key}, "_old": None, "_unchanged_toast": [], "commit": 1}
        parts = in_halves(_table([], [change], _NoShuffle()), KEYED, 2)
        return next(i for i, (part, _) in enumerate(parts) if part.num_rows)

    a = 1
    b = next(k for k in range(2, 400) if bucket(k) != bucket(a))
    c = next(k for k in range(2, 400) if bucket(k) == bucket(a))
    changes = [{"_op": "update", "new": {**kept, "id": b}, "_old": {"id": a, "k2": 0}, "_unchanged_toast": [],
                "commit": 1},
               {"_op": "update", "new": {**kept, "id": c}, "_old": {"id": b, "k2": 0}, "_unchanged_toast": [],
                "commit": 2}]
    table = _table([kept], changes, _NoShuffle())
    out, skipping, passes = _passes(table, 2)
    assert (skipping.tolist(), passes) == ([0, 1], 3)
    whole = history_changes(table, KEYED).to_pylist()
    assert [r for r in out.to_pylist() if r["_action"] == "version"] == \
        [r for r in whole if r["_action"] == "version"] == []
    _assert_valid_at_each_commit([kept], changes, out)


class _NoShuffle:
    def shuffle(self, rows):
        pass

    def randint(self, lo, hi):
        return hi


def _assert_valid_at_each_commit(initial, changes, out):
    history = _merged(initial, out)
    for commit in sorted({c["commit"] for c in changes} | {-1}):
        lsn = _lsn(commit) if commit >= 0 else 0
        valid = [{n: h[n] for n in NAMES} for h in history
                 if h["_valid_from_lsn"] <= lsn and (h["_valid_to_lsn"] is None or lsn < h["_valid_to_lsn"])]
        expected = reference(initial, [c for c in changes if c["commit"] <= commit], KEYED)
        assert _normal(valid) == _normal(expected), commit
    assert all(h["_is_current"] == (h["_valid_to_lsn"] is None) for h in history)
