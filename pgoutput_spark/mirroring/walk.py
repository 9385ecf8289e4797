"""The net change's walk over a table's changes in commit order, compiled by numba.

`net.net_changes` applies a run's changes one after the other, the way the
apply worker does; that walk is the only part of the net change that visits
each change by itself, and in a Python loop over dicts it cost about 1.5 us
per change (0.8 s of `bench_wide`'s 518,400 rows, a third of its net change
after the key codes). Here it runs over integer arrays: keys are the dense
codes `keys.key_codes` gives (``0 .. n_codes - 1``), operations the `OPS`
numbers, and a table's state is a few arrays indexed by code.

A truncate empties the state without touching every code: each code records
the *epoch* (truncates seen) in which it last took a value, and a code from an
earlier epoch is absent. ``listed`` keeps the codes in the order they first
took a value in the current epoch, as the dicts of the loop these replace kept
them.

Without numba (`decoder.kernel` falls back to NumPy), the same functions run as
plain Python: slower, same results (`tests/mirroring/test_net.py` runs both).

The key codes themselves come from here too: `hash_words` and `hash_bytes` give
every row a 64-bit hash of its key's values (byte strings read where Arrow keeps
them, eight bytes at a time), `number_hashes` numbers the rows by hash, and
`same_words` / `same_bytes` check every row against the first row of its number.
These read memory by address and need numba; without it `keys.key_codes` combines
per-column codes instead.
"""

from __future__ import annotations

import numpy as np

from ..decoder.kernel import _jit, _peek

#: The change operations, numbered as the walks read them (``_op`` of a change row).
OPS = ("pre", "insert", "update", "delete", "truncate")
PRE, INSERT, UPDATE, DELETE, TRUNCATE = range(len(OPS))


@_jit
def multiset_walk(order, op, new_code, old_code, has_old, n_codes):  # pragma: no cover - compiled
    """A multiset table's changes (identity: the whole row) in ``order``.

    Returns ``(pre, count, rep, last, listed, skipped, truncated_at)``: per code, the
    number of "pre" rows (the mirror's), the number of rows now (meaningful for
    ``listed`` codes), a row holding its values and the change that last touched it;
    the codes that hold a count in the last epoch; the skipped changes (an update or
    delete of a row that is not there); the row of the last truncate, or -1.
    """
    n = order.size
    pre = np.zeros(n_codes, np.int64)
    count = np.zeros(n_codes, np.int64)
    epoch_of = np.full(n_codes, -1, np.int64)
    rep = np.full(n_codes, -1, np.int64)
    last = np.full(n_codes, -1, np.int64)
    listed = np.empty(n_codes, np.int64)
    skipped = np.empty(n, np.int64)
    n_listed = 0
    n_skipped = 0
    epoch = 0
    truncated_at = -1
    for k in range(n):
        i = order[k]
        o = op[i]
        if o == PRE:
            c = new_code[i]
            pre[c] += 1
            if rep[c] < 0:
                rep[c] = i
            continue
        if o == TRUNCATE:
            epoch += 1
            n_listed = 0
            truncated_at = i
            continue
        if o != INSERT:
            src = old_code[i] if has_old[i] else new_code[i]
            if epoch_of[src] == epoch:
                have = count[src]
            elif truncated_at >= 0:
                have = 0
            else:
                have = pre[src]
            if have == 0:
                skipped[n_skipped] = i
                n_skipped += 1
                continue
            if epoch_of[src] != epoch:
                epoch_of[src] = epoch
                listed[n_listed] = src
                n_listed += 1
            count[src] = have - 1
            last[src] = i
            if o == DELETE:
                continue
        c = new_code[i]
        if epoch_of[c] == epoch:
            now = count[c]
        elif truncated_at >= 0:
            now = 0
        else:
            now = pre[c]
        if epoch_of[c] != epoch:
            epoch_of[c] = epoch
            listed[n_listed] = c
            n_listed += 1
        count[c] = now + 1
        rep[c] = i
        last[c] = i
    return pre, count, rep, last, listed[:n_listed], skipped[:n_skipped], truncated_at


@_jit
def keyed_walk(order, op, new_code, old_code, has_old, n_codes, slot, toast_starts, toast_columns,
               sources):  # pragma: no cover - compiled
    """A keyed table's changes in ``order``.

    ``slot[i]``: if row ``i`` has unchanged-TOAST columns, its number among those rows
    (else -1); ``toast_columns[toast_starts[s]:toast_starts[s + 1]]``: the positions of
    the unchanged columns of row number ``s``, one *pair* (row, column) each.
    ``sources`` (one per pair) receives, for every update that is applied, the row
    each of its unchanged columns takes its value from: the row it updates, or the
    row that one took that column from in turn.

    Returns ``(state, last, listed, skipped, truncated_at)``: per code, the row
    holding its values now (-1: no row; meaningful for ``listed`` codes, the codes
    the last epoch touched) and the change that last touched it; the skipped
    changes; the row of the last truncate, or -1. A row's value of column ``j`` comes
    from ``sources`` of its pair for ``j`` if it has one, else from the row itself.
    """
    n = order.size
    pre = np.full(n_codes, -1, np.int64)
    state = np.full(n_codes, -1, np.int64)
    epoch_of = np.full(n_codes, -1, np.int64)
    last = np.full(n_codes, -1, np.int64)
    listed = np.empty(n_codes, np.int64)
    skipped = np.empty(n, np.int64)
    n_listed = 0
    n_skipped = 0
    epoch = 0
    truncated_at = -1
    for k in range(n):
        i = order[k]
        o = op[i]
        if o == PRE:
            pre[new_code[i]] = i
            continue
        if o == TRUNCATE:
            epoch += 1
            n_listed = 0
            truncated_at = i
            continue
        c = new_code[i]
        if o != INSERT:
            src = old_code[i] if has_old[i] else c
            if epoch_of[src] == epoch:
                current = state[src]
            elif truncated_at >= 0:
                current = -1
            else:
                current = pre[src]
            if current < 0:
                skipped[n_skipped] = i
                n_skipped += 1
                continue
            if epoch_of[src] != epoch:
                epoch_of[src] = epoch
                listed[n_listed] = src
                n_listed += 1
            last[src] = i
            state[src] = -1
            if o == DELETE:
                continue
            s = slot[i]
            if s >= 0:
                t = slot[current]
                for m in range(toast_starts[s], toast_starts[s + 1]):
                    j = toast_columns[m]
                    sources[m] = current  # the row's own value of j, unless it took it from another
                    if t >= 0:
                        for m2 in range(toast_starts[t], toast_starts[t + 1]):
                            if toast_columns[m2] == j:
                                sources[m] = sources[m2]
        if epoch_of[c] != epoch:
            epoch_of[c] = epoch
            listed[n_listed] = c
            n_listed += 1
        state[c] = i
        last[c] = i
    return state, last, listed[:n_listed], skipped[:n_skipped], truncated_at


# -- key codes (`keys.key_codes`): rows numbered by a hash of their values, then checked ------------

@_jit(inline="always")
def _mix(h, word):  # pragma: no cover - compiled
    h = (h ^ np.uint64(word)) * np.uint64(0x9E3779B97F4A7C15)
    return h ^ (h >> np.uint64(29))


@_jit(inline="always")
def _tail(address, end):  # pragma: no cover - compiled
    """The 0-7 bytes from ``address`` to ``end`` as one word."""
    word = np.int64(0)
    for q in range(address, end):
        word = (word << np.int64(8)) | _peek(q, 1)
    return word


#: The rows' hashes start from it (`hash_words`, `hash_bytes`).
HASH_SEED = 0x243F6A8885A308D3


@_jit
def hash_words(hashes, words):  # pragma: no cover - compiled
    """Mix one int64 word per row into the rows' ``hashes`` (uint64, in place)."""
    for i in range(hashes.size):
        hashes[i] = _mix(hashes[i], words[i])


@_jit
def hash_bytes(hashes, address, length):  # pragma: no cover - compiled
    """Mix one byte string per row (its memory address, in an Arrow buffer the caller holds, and
    its length, -1 for NULL) into the rows' ``hashes``, eight bytes at a time."""
    for i in range(hashes.size):
        size = length[i]
        h = _mix(hashes[i], size)
        if size > 0:
            p = address[i]
            end = p + size
            while end - p >= 8:
                h = _mix(h, _peek(p, 8))
                p += 8
            h = _mix(h, _tail(p, end))
        hashes[i] = h


@_jit
def number_hashes(hashes, hash_mask):  # pragma: no cover - compiled
    """Dense codes ``0 .. k-1`` of the rows' ``hashes``, numbered in the order first seen, and per
    row the first row with its hash. An open-addressing table, at most half full. ``hash_mask``
    keeps bits of the hash (-1: all; tests make hashes meet with fewer)."""
    n = hashes.size
    size = 2
    while size < 2 * n:
        size *= 2
    mask = np.uint64(size - 1)
    keep = np.uint64(hash_mask)
    table = np.full(size, -1, np.int64)
    final = np.empty(n, np.uint64)
    codes = np.empty(n, np.int64)
    first = np.empty(n, np.int64)
    k = 0
    for i in range(n):
        h = hashes[i]
        h ^= h >> np.uint64(32)
        h *= np.uint64(0xBF58476D1CE4E5B9)
        h ^= h >> np.uint64(31)
        h &= keep
        final[i] = h
        s = h & mask
        while True:
            r = table[s]
            if r < 0:
                table[s] = i
                codes[i] = k
                first[i] = i
                k += 1
                break
            if final[r] == h:
                codes[i] = codes[r]
                first[i] = r
                break
            s = (s + np.uint64(1)) & mask
    return codes, first


@_jit
def same_words(words, first):  # pragma: no cover - compiled
    """Whether every row's word equals the word of row ``first[row]``."""
    for i in range(words.size):
        if words[i] != words[first[i]]:
            return False
    return True


@_jit
def same_bytes(address, length, first):  # pragma: no cover - compiled
    """Whether every row's byte string (see `hash_bytes`) equals the one of row ``first[row]``."""
    for i in range(length.size):
        r = first[i]
        if r == i:
            continue
        size = length[i]
        if length[r] != size:
            return False
        if size <= 0:
            continue
        a, b = address[r], address[i]
        q = 0
        while size - q >= 8:
            if _peek(a + q, 8) != _peek(b + q, 8):
                return False
            q += 8
        if _tail(a + q, a + size) != _tail(b + q, b + size):
            return False
    return True
