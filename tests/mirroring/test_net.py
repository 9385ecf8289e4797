"""The net-change merge equals a row-by-row reference applier on random change sequences."""

from __future__ import annotations

import zlib
from collections import Counter
from unittest import mock

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pgoutput_spark.assemble.typed import change_schema
from pgoutput_spark.decoder import kernel
from pgoutput_spark.mirroring import walk
from pgoutput_spark.mirroring.keys import joined_buckets
from pgoutput_spark.mirroring.net import (NEW_HALF, OLD_HALF, TOAST_CONFLICT_REASON, WHOLE, TableSpec, in_halves,
                                          net_changes)

COLUMNS = [("id", pa.int32()), ("k2", pa.int32()), ("big", pa.string()), ("n", pa.int64())]
NAMES = tuple(name for name, _ in COLUMNS)
SCHEMA = change_schema(COLUMNS)
KEYED = TableSpec("keyed", ("id", "k2"), NAMES)
MULTISET = TableSpec("multiset", NAMES, NAMES)


def _find(table, spec, key):
    for i, row in enumerate(table):
        if tuple(row[k] for k in spec.key) == key:
            return i
    return None


def reference(initial, changes, spec):
    """The apply worker, one change at a time, on a list of rows."""
    table = [dict(r) for r in initial]
    for c in changes:
        op, new, old, unchanged = c["_op"], c["new"], c["_old"], c["_unchanged_toast"] or []
        if op == "truncate":
            table.clear()
            continue
        if op == "insert":
            if spec.mode == "keyed":
                at = _find(table, spec, tuple(new[k] for k in spec.key))
                if at is not None:
                    table.pop(at)
            table.append(dict(new))
            continue
        lookup = old if old is not None else new
        at = _find(table, spec, tuple(lookup[k] for k in spec.key))
        if at is None:
            continue
        found = table.pop(at)
        if op == "update":
            row = {name: (found[name] if name in unchanged else new[name]) for name in NAMES}
            if spec.mode == "keyed":
                clash = _find(table, spec, tuple(row[k] for k in spec.key))
                if clash is not None:  # an upsert, as an insert of an existing key
                    table.pop(clash)
            table.insert(at, row)
    return table


def merged(initial, out, spec):
    """What the MERGE of `net_changes`' output does to the mirror."""
    rows = out.to_pylist()
    table = [dict(r) for r in initial]
    if any(r["_action"] == "truncate" for r in rows):
        table.clear()
    for r in rows:
        value = {name: r[name] for name in NAMES}
        key = tuple(value[k] for k in spec.key)
        if r["_action"] in ("upsert", "delete", "delete_all"):
            table = [t for t in table if tuple(t[k] for k in spec.key) != key]
        if r["_action"] in ("upsert", "insert"):
            table.append(value)
    return table


def needed(changes, spec):
    """The keys whose mirror rows the job reads before the merge (its pre-image)."""
    keys = set()
    for c in changes:
        if c["_old"] is not None:
            keys.add(tuple(c["_old"][k] for k in spec.key))
        elif c["_op"] == "update":
            keys.add(tuple(c["new"][k] for k in spec.key))
    return keys


def to_table(initial, changes, spec, shuffle=None):
    """The rows `net_changes` gets; ``shuffle`` (a `random.Random`) puts them out of commit order
    and cuts them into chunks of a few rows (a task receives them in batches)."""
    pre_keys = needed(changes, spec)
    rows = []
    for r in initial:
        if tuple(r[k] for k in spec.key) in pre_keys:
            rows.append({"_op": "pre", "_commit_seq": -1, "_seq": -1, "_old": None,
                         "_unchanged_toast": [], **r})
    for i, c in enumerate(changes):
        rows.append({"_op": c["_op"], "_commit_seq": c["commit"], "_seq": i, "_old": c["_old"],
                     "_unchanged_toast": c["_unchanged_toast"], **(c["new"] or {})})
    if shuffle is not None:
        shuffle.shuffle(rows)
    arrays = {f.name: pa.array([r.get(f.name) for r in rows], f.type) for f in SCHEMA}
    table = pa.table(arrays, schema=SCHEMA)
    if shuffle is not None:
        table = pa.Table.from_batches(table.to_batches(max_chunksize=shuffle.randint(1, 4)), schema=SCHEMA)
    return table


small = st.integers(0, 3)
values = st.fixed_dictionaries({"id": small, "k2": st.integers(0, 1), "big": st.sampled_from(["x", "y", None]),
                                "n": st.integers(0, 2)})


@st.composite
def scenario(draw, spec, found=False):
    """Initial rows and changes. ``found``: every update and delete looks up a row that is
    there, as in a mirror that has every row of its source."""
    if spec.mode == "keyed":
        initial = list({(r["id"], r["k2"]): r for r in draw(st.lists(values, max_size=5))}.values())
    else:
        initial = draw(st.lists(values, max_size=5))
    live = [dict(r) for r in initial]  # a plausible source state, to draw realistic old rows from
    changes = []
    commit = 0
    for _ in range(draw(st.integers(0, 14))):
        commit += draw(st.integers(0, 1))
        op = draw(st.sampled_from(["insert", "insert", "update", "update", "delete", "truncate"]))
        if op == "truncate":
            changes.append({"_op": op, "new": None, "_old": None, "_unchanged_toast": None, "commit": commit})
            live.clear()
            continue
        new = draw(values)
        if found and not live:
            op = "insert"
        # Old rows: mostly rows that exist, sometimes rows that do not (skipped by the applier).
        old = draw(st.sampled_from(live)) if live and (found or draw(st.booleans())) else draw(values)
        if op == "insert":
            changes.append({"_op": op, "new": new, "_old": None, "_unchanged_toast": [], "commit": commit})
            live.append(new)
            continue
        if spec.mode == "keyed":
            send_old = op == "delete" or draw(st.booleans())
            old_sent = {k: old[k] for k in spec.key} if send_old else None
            if not send_old:
                new = {**new, "id": old["id"], "k2": old["k2"]}
        else:
            old_sent = dict(old)
        toast = ["big"] if op == "update" and draw(st.booleans()) else []
        if toast:
            new = {**new, "big": None}
        if found:  # the source as it is after the change
            live.remove(old)
            if op == "update":
                row = {**new, "big": old["big"]} if toast else new
                if spec.mode == "keyed":  # an upsert: the row it lands on goes
                    live[:] = [r for r in live if (r["id"], r["k2"]) != (row["id"], row["k2"])]
                live.append(row)
        changes.append({"_op": op, "new": new if op == "update" else None, "_old": old_sent,
                        "_unchanged_toast": toast, "commit": commit})
    return initial, changes


def _normal(table):
    return Counter(tuple(sorted(r.items(), key=lambda kv: kv[0])) for r in table)


@settings(max_examples=400, deadline=None)
@given(scenario(KEYED), st.randoms(use_true_random=False))
def test_keyed_net_change_equals_row_by_row_apply(case, rnd):
    initial, changes = case
    out = net_changes(to_table(initial, changes, KEYED, shuffle=rnd), KEYED)
    assert _normal(merged(initial, out, KEYED)) == _normal(reference(initial, changes, KEYED))


@settings(max_examples=400, deadline=None)
@given(scenario(MULTISET), st.randoms(use_true_random=False))
def test_multiset_net_change_equals_row_by_row_apply(case, rnd):
    initial, changes = case
    out = net_changes(to_table(initial, changes, MULTISET, shuffle=rnd), MULTISET)
    assert _normal(merged(initial, out, MULTISET)) == _normal(reference(initial, changes, MULTISET))


@pytest.mark.skipif(not hasattr(walk.keyed_walk, "py_func"), reason="numba is not installed: the walks are Python")
@settings(max_examples=200, deadline=None)
@given(st.sampled_from([KEYED, MULTISET]), st.data())
def test_the_compiled_walks_and_their_python_form_give_the_same_rows(spec, data):
    """Where numba is missing, `walk`'s functions run as Python: the same rows, in the same order."""
    initial, changes = data.draw(scenario(spec))
    table = to_table(initial, changes, spec, shuffle=data.draw(st.randoms(use_true_random=False)))
    compiled = net_changes(table, spec)
    with mock.patch("pgoutput_spark.mirroring.net.keyed_walk", walk.keyed_walk.py_func), \
            mock.patch("pgoutput_spark.mirroring.net.multiset_walk", walk.multiset_walk.py_func), \
            mock.patch.object(kernel, "numba", None):  # key codes combined pairwise, numbered otherwise
        python = net_changes(table, spec)
    assert python.equals(compiled)


def _looks_up(row, spec):
    """The key a change row looks up (its old key or row, else its own), as `rows.by_key`."""
    source = row["_old"] if row["_old"] is not None else row
    return tuple(source[k] for k in spec.key)


def _leaves(row, spec):
    """The key an update leaves its row at (a multiset's unchanged TOAST from the old row)."""
    unchanged = row["_unchanged_toast"] or []
    return tuple(row["_old"][k] if spec.mode == "multiset" and k in unchanged else row[k] for k in spec.key)


def per_task(table, spec, buckets, tasks, chunk):
    """``table``'s rows as `rows.by_key` and `rows.in_tasks` spread them, one table per task
    (in chunks of ``chunk`` rows, the batches a task receives)."""
    rows = table.to_pylist()

    def bucket(key):
        return zlib.crc32(repr(key).encode()) % buckets

    moved = [(bucket(_looks_up(r, spec)), bucket(_leaves(r, spec)))
             for r in rows if r["_op"] == "update" and r["_old"] is not None]
    joined = joined_buckets(buckets, moved)
    parts = [[] for _ in range(tasks)]
    for r in rows:
        for b in range(buckets) if r["_op"] == "truncate" else [bucket(_looks_up(r, spec))]:
            parts[joined[b] % tasks].append(r)
    return [pa.Table.from_batches(pa.Table.from_pylist(part, schema=table.schema).to_batches(max_chunksize=chunk),
                                  schema=table.schema) for part in parts]


@settings(max_examples=400, deadline=None)
@given(st.sampled_from([KEYED, MULTISET]), st.data())
def test_net_change_in_tasks_by_key_equals_row_by_row_apply(spec, data):
    """What `rows.by_key` does in Spark: rows go to tasks by the bucket of the key they look up,
    buckets an update moves a row between go together (`joined_buckets`), every task gets every
    truncate; the tasks' outputs together merge to what the apply worker leaves."""
    initial, changes = data.draw(scenario(spec))
    rnd = data.draw(st.randoms(use_true_random=False))
    parts = per_task(to_table(initial, changes, spec, shuffle=rnd), spec, data.draw(st.integers(1, 6)),
                     data.draw(st.integers(1, 3)), rnd.randint(1, 4))
    out = pa.concat_tables([net_changes(part, spec) for part in parts])
    assert _normal(merged(initial, out, spec)) == _normal(reference(initial, changes, spec))


@settings(max_examples=1000, deadline=None)
@given(st.sampled_from([KEYED, MULTISET]), st.data())
def test_net_change_in_halves_equals_row_by_row_apply_or_asks_for_one_task(spec, data):
    """What `rows.halved_net_frame` and `rows.by_key(halves=True)` do: rows in buckets by the key
    each looks up, an update whose new key is in another bucket in both as halves; the buckets'
    outputs together merge to what the apply worker leaves, unless one says ``conflict``. Only
    a run in which one task skips an update can say that, or, in a keyed table, one whose key
    change leaves a column unchanged (TOAST)."""
    initial, changes = data.draw(scenario(spec, found=data.draw(st.booleans())))
    rnd = data.draw(st.randoms(use_true_random=False))
    table = to_table(initial, changes, spec, shuffle=rnd)
    parts = in_halves(table, spec, data.draw(st.integers(1, 5)))
    assert parts is not None
    assert sum(int((h != NEW_HALF).sum()) for _, h in parts) == table.num_rows + (len(parts) - 1) * sum(
        c["_op"] == "truncate" for c in changes)
    out = pa.concat_tables([net_changes(part, spec, halves=halves) for part, halves in parts])
    whole = net_changes(table, spec).to_pylist()
    asks = {r["_seq"] for r in whole if r["_action"] == "skipped" and r["_op"] == "update"}
    if spec.mode == "keyed":
        asks |= {i for i, c in enumerate(changes) if c["_op"] == "update" and c["_old"] is not None
                 and c["_unchanged_toast"]}
    conflicts = {r["_seq"] for r in out.to_pylist() if r["_action"] == "conflict"}
    assert conflicts <= asks
    if not asks:
        assert not conflicts
    if not conflicts:
        assert _normal(merged(initial, out, spec)) == _normal(reference(initial, changes, spec))


def _passes(table, spec, tasks):
    """`apply`'s net change in halves: passes over ``tasks`` buckets, each pass leaving out the
    new rows of the updates that earlier passes found missing their row, until one finds none
    (or a conflict only one task settles). The last pass's output, the seqs it skipped, and the
    number of passes."""
    parts = in_halves(table, spec, tasks)
    assert parts is not None
    skipping = np.zeros(0, np.int64)
    for passes in range(1, table.num_rows + 2):
        out = pa.concat_tables([net_changes(part, spec, halves=halves, skipping=skipping)
                                for part, halves in parts])
        conflicts = [r for r in out.to_pylist() if r["_action"] == "conflict"]
        if not conflicts or any(r["_reason"] == TOAST_CONFLICT_REASON for r in conflicts):
            return out, skipping, passes
        found = np.array(sorted({r["_seq"] for r in conflicts}), np.int64)
        assert not np.isin(found, skipping).any()  # each pass finds others, or none
        skipping = np.union1d(skipping, found)
    raise AssertionError("the passes did not end")


@settings(max_examples=1000, deadline=None)
@given(st.sampled_from([KEYED, MULTISET]), st.data())
def test_net_change_in_halves_again_without_the_missing_rows_updates_equals_one_task(spec, data):
    """An update whose old row is nowhere (the run's earlier changes and the mirror): the bucket
    of its old row says ``conflict``, and `apply` nets the buckets again with it ``skipping``
    (its new row left out where it went), until no bucket says so. Then the buckets' outputs
    merge to what the apply worker leaves, and skip the same changes as one task. Only a keyed
    table's key change that leaves a TOAST column unchanged needs one task."""
    initial, changes = data.draw(scenario(spec))
    table = to_table(initial, changes, spec, shuffle=data.draw(st.randoms(use_true_random=False)))
    out, skipping, passes = _passes(table, spec, data.draw(st.integers(2, 5)))
    rows = out.to_pylist()
    if any(r["_action"] == "conflict" for r in rows):
        assert spec is KEYED and any(c["_op"] == "update" and c["_old"] is not None and c["_unchanged_toast"]
                                     for c in changes)
        return
    whole = net_changes(table, spec).to_pylist()
    assert set(skipping.tolist()) <= {r["_seq"] for r in whole if r["_action"] == "skipped" and r["_op"] == "update"}
    assert sorted(r["_seq"] for r in rows if r["_action"] == "skipped") == \
        sorted(r["_seq"] for r in whole if r["_action"] == "skipped")
    assert _normal(merged(initial, out, spec)) == _normal(reference(initial, changes, spec))


def test_an_update_missing_its_row_leaves_out_its_new_row_and_so_can_a_later_one():
    """Two updates of rows the mirror lacks, the second moving the first's new row on: the
    first pass finds the first missing (its bucket cannot know that the other bucket applied its
    new row), the second pass the second (that row is gone now), the third none, as one task
    skips both and leaves the mirror as it was."""
    a = {"id": 1, "k2": 0, "big": "x", "n": 1}
    rows = [{**a, "n": n} for n in range(2, 400)]
    buckets = {}
    for row in [a, *rows]:  # the bucket of each row, of two
        parts = in_halves(to_table([], [{"_op": "insert", "new": row, "_old": None, "_unchanged_toast": [],
                                         "commit": 1}], MULTISET), MULTISET, 2)
        buckets[row["n"]] = next(i for i, (part, _) in enumerate(parts) if part.num_rows)
    # a -> b -> c, each in the other bucket than the one before.
    b = next(r for r in rows if buckets[r["n"]] != buckets[1])
    c = next(r for r in rows if buckets[r["n"]] == buckets[1] and r != a)
    kept = {**a, "n": 999}
    changes = [{"_op": "update", "new": b, "_old": a, "_unchanged_toast": [], "commit": 1},
               {"_op": "update", "new": c, "_old": b, "_unchanged_toast": [], "commit": 2}]
    table = to_table([kept], changes, MULTISET)
    out, skipping, passes = _passes(table, MULTISET, 2)
    assert (skipping.tolist(), passes) == ([0, 1], 3)
    assert sorted(r["_seq"] for r in out.to_pylist() if r["_action"] == "skipped") == [0, 1]
    assert _normal(merged([kept], out, MULTISET)) == _normal(reference([kept], changes, MULTISET)) == _normal([kept])


def test_an_update_between_buckets_comes_to_both_as_halves():
    a = {"id": 1, "k2": 0, "big": "x", "n": 1}
    at = {}
    for n in range(2, 40):  # a new row in the other bucket of two
        b = {**a, "n": n}
        parts = in_halves(to_table([], [{"_op": "update", "new": b, "_old": a, "_unchanged_toast": [], "commit": 1}],
                                   MULTISET), MULTISET, 2)
        at[n] = sorted((i, int(h)) for i, (_, halves) in enumerate(parts) for h in halves)
    assert {tuple(sorted(h for _, h in v)) for v in at.values()} == {(WHOLE,), (OLD_HALF, NEW_HALF)}
    b = next({**a, "n": n} for n, v in at.items() if len(v) == 2)
    row = dict(a)
    changes = [{"_op": "update", "new": b, "_old": a, "_unchanged_toast": [], "commit": 1},
               {"_op": "delete", "new": None, "_old": b, "_unchanged_toast": [], "commit": 2},
               {"_op": "insert", "new": b, "_old": None, "_unchanged_toast": [], "commit": 3}]
    parts = in_halves(to_table([row, row], changes, MULTISET), MULTISET, 2)
    out = pa.concat_tables([net_changes(part, MULTISET, halves=halves) for part, halves in parts])
    assert not [r for r in out.to_pylist() if r["_action"] == "conflict"]
    assert _normal(merged([row, row], out, MULTISET)) == _normal([row, b])
    # The same update of a row the mirror does not have: the bucket of its old row cannot know
    # whether the other applied its new row, and says so.
    parts = in_halves(to_table([], changes[:1], MULTISET), MULTISET, 2)
    out = pa.concat_tables([net_changes(part, MULTISET, halves=halves) for part, halves in parts]).to_pylist()
    assert [(r["_action"], r["_seq"]) for r in out if r["_action"] != "insert"] == [("conflict", 0)]


def test_a_multiset_whose_updates_would_join_every_bucket_stays_in_one_task():
    from pgoutput_spark.mirroring.rows import net_tasks

    assert [net_tasks(rows, 0, KEYED, 1000) for rows in (0, 1000, 1001, 5500)] == [1, 1, 2, 6]
    assert net_tasks(5500, 5000, KEYED, 1000) == 6  # keyed: only key changes move rows (measured later)
    assert net_tasks(5500, 0, MULTISET, 1000) == 6  # inserts and deletes only: spread
    # 6 tasks, 96 buckets: about 219 updates at random join them all.
    assert [net_tasks(5500, updates, MULTISET, 1000) for updates in (200, 250)] == [6, 1]


def test_identical_rows_stay_separate_and_one_of_them_changes():
    row = {"id": 1, "k2": 0, "big": "x", "n": 1}
    changes = [{"_op": "update", "new": {**row, "n": 2}, "_old": row, "_unchanged_toast": [], "commit": 1}]
    out = net_changes(to_table([row, row, row], changes, MULTISET), MULTISET)
    assert _normal(merged([row, row, row], out, MULTISET)) == _normal([row, row, {**row, "n": 2}])


def test_key_swap_inside_one_transaction_keeps_unchanged_toast_with_its_row():
    a, b = {"id": 1, "k2": 0, "big": "A" * 10, "n": 1}, {"id": 2, "k2": 0, "big": "B" * 10, "n": 2}
    swap = [
        {"_op": "update", "new": {**a, "id": 3, "big": None}, "_old": {"id": 1, "k2": 0},
         "_unchanged_toast": ["big"], "commit": 1},
        {"_op": "update", "new": {**b, "id": 1, "big": None}, "_old": {"id": 2, "k2": 0},
         "_unchanged_toast": ["big"], "commit": 1},
        {"_op": "update", "new": {**a, "id": 2, "big": None}, "_old": {"id": 3, "k2": 0},
         "_unchanged_toast": ["big"], "commit": 1},
    ]
    out = net_changes(to_table([a, b], swap, KEYED), KEYED)
    assert _normal(merged([a, b], out, KEYED)) == _normal([{**b, "id": 1}, {**a, "id": 2}])


def test_update_of_a_missing_row_is_skipped_with_its_reason():
    change = {"_op": "update", "new": {"id": 9, "k2": 0, "big": None, "n": 1}, "_old": None,
              "_unchanged_toast": ["big"], "commit": 1}
    out = net_changes(to_table([], [change], KEYED), KEYED).to_pylist()
    assert [(r["_action"], r["_op"], r["_seq"]) for r in out] == [("skipped", "update", 0)]
    assert "nowhere to be found" in out[0]["_reason"]


@pytest.mark.parametrize("spec", [KEYED, MULTISET])
def test_rows_inserted_after_a_truncate_survive_it(spec):
    row = {"id": 1, "k2": 0, "big": "x", "n": 1}
    changes = [{"_op": "insert", "new": row, "_old": None, "_unchanged_toast": [], "commit": 1},
               {"_op": "truncate", "new": None, "_old": None, "_unchanged_toast": None, "commit": 2},
               {"_op": "insert", "new": {**row, "n": 5}, "_old": None, "_unchanged_toast": [], "commit": 3}]
    out = net_changes(to_table([{**row, "id": 2}], changes, spec), spec)
    assert _normal(merged([{**row, "id": 2}], out, spec)) == _normal([{**row, "n": 5}])
