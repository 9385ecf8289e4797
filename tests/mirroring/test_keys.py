"""Key codes (equal exactly for equal values, however the arrays came) and key hashes (equal in
every task for equal rows), against Python's equality of the same values."""

from __future__ import annotations

import datetime
import decimal
import struct
from unittest import mock

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pgoutput_spark.decoder import kernel
from pgoutput_spark.mirroring.keys import joined_buckets, key_codes, key_hashes


@pytest.mark.skipif(kernel.numba is None, reason="numba is not installed: rows are not hashed")
@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(-3, 3), st.sampled_from(["", "a", "bb", "a longer string", None])),
                min_size=1, max_size=30), st.randoms(use_true_random=False))
def test_key_hashes_are_equal_for_equal_rows_however_their_arrays_came(rows, rnd):
    """Equal rows hash equal in every task: whatever chunks and order their arrays have."""
    shuffled = list(rows)
    rnd.shuffle(shuffled)
    cut = rnd.randint(0, len(shuffled))

    def hashes(part):
        ints = pa.chunked_array([pa.array([r[0] for r in part[:cut]], pa.int64()),
                                 pa.array([r[0] for r in part[cut:]], pa.int64())])
        texts = pa.array([r[1] for r in part], pa.string())
        return dict(zip(part, key_hashes([ints, texts]).tolist()))

    first, second = hashes(rows), hashes(shuffled)
    assert first == second
    assert len(set(first.values())) == len(first)  # distinct rows apart (64 bits: no meeting expected)


def test_joined_buckets_go_with_the_smallest_bucket_they_are_linked_to():
    assert joined_buckets(6, [(5, 3), (3, 1), (4, 2)]) == [0, 1, 2, 1, 2, 1]
    assert joined_buckets(3, []) == [0, 1, 2]
    assert joined_buckets(4, [(0, 3), (3, 2), (2, 1)]) == [0, 0, 0, 0]


# -- key codes of nested values ---------------------------------------------------------------------

_INTERVAL = pa.struct([("months", pa.int32()), ("days", pa.int32()), ("micros", pa.int64())])
_NESTED = {
    "text[]": (pa.list_(pa.string()),
               st.none() | st.lists(st.none() | st.sampled_from(["", "a", "b", "ab"]), max_size=3)),
    "int[][]": (pa.list_(pa.list_(pa.int32())),
                st.none() | st.lists(st.none() | st.lists(st.none() | st.integers(0, 2), max_size=2),
                                     max_size=2)),
    "interval": (_INTERVAL, st.none() | st.fixed_dictionaries(
        {"months": st.none() | st.integers(0, 1), "days": st.integers(0, 1), "micros": st.integers(0, 1)})),
}


def _python_key(value):
    if isinstance(value, list):
        return ("list", tuple(_python_key(v) for v in value))
    if isinstance(value, dict):
        return ("struct", tuple((k, _python_key(v)) for k, v in sorted(value.items())))
    return value


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_key_codes_are_equal_exactly_for_equal_nested_values(data):
    """Vectorized codes of lists (of lists) and structs: equal codes iff equal Python values, NULL
    apart from empty and from a struct of NULLs; sliced arrays too."""
    kinds = data.draw(st.lists(st.sampled_from(sorted(_NESTED)), min_size=1, max_size=3))
    n = data.draw(st.integers(1, 12))
    skip = data.draw(st.integers(0, 3))
    columns, values = [], []
    for kind in kinds:
        arrow_type, strategy = _NESTED[kind]
        column = data.draw(st.lists(strategy, min_size=n + skip, max_size=n + skip))
        columns.append(pa.array(column, arrow_type).slice(skip))  # an offset into the buffers
        values.append(column[skip:])
    codes = key_codes(columns)
    rows = [tuple(_python_key(v[i]) for v in values) for i in range(n)]
    for i in range(n):
        for j in range(n):
            assert (codes[i] == codes[j]) == (rows[i] == rows[j]), (rows[i], rows[j])


# -- key codes of flat values ----------------------------------------------------------------------

def _bits(value):
    """A float by its bits (-0.0 apart from 0.0, NaNs by payload), as Arrow's hashing sees it."""
    return ("float", struct.pack("<d", value)) if isinstance(value, float) else value


_NAN = struct.unpack("<d", struct.pack("<Q", 0x7FF8000000000001))[0]
_FLAT = {
    "int8": (pa.int8(), st.integers(-1, 1)),
    "int64": (pa.int64(), st.sampled_from([0, 1, -1, 2**62, -(2**63)])),
    "uint16": (pa.uint16(), st.integers(0, 2)),
    "float64": (pa.float64(), st.sampled_from([0.0, -0.0, 1.5, float("nan"), _NAN, float("inf")])),
    "float32": (pa.float32(), st.sampled_from([0.0, -0.0, 1.5, float("inf")])),
    "bool": (pa.bool_(), st.booleans()),
    "numeric": (pa.decimal128(10, 2), st.sampled_from([decimal.Decimal(v) for v in ("0", "1.0", "1.00", "-1.5")])),
    "timestamptz": (pa.timestamp("us", tz="UTC"), st.sampled_from(
        [datetime.datetime(2020, 1, 1, tzinfo=datetime.timezone.utc),
         datetime.datetime(2020, 1, 1, 0, 0, 0, 1, tzinfo=datetime.timezone.utc)])),
    "date": (pa.date32(), st.sampled_from([datetime.date(2000, 1, 1), datetime.date(1970, 1, 1)])),
    "uuid": (pa.binary(16), st.sampled_from([b"\0" * 16, b"\1" * 16, b"\0" * 15 + b"\1"])),
    # Byte strings around the eight-byte steps of the hash and of the comparison.
    "text": (pa.string(),
             st.sampled_from(["", "a", "b", "ab", "abcdefgh", "abcdefgh1", "abcdefgh2", "abcdefgi1", "x" * 17])),
    "bytea": (pa.binary(), st.sampled_from([b"", b"\0", b"\1", b"\0\0", b"12345678", b"12345679"])),
    "large text": (pa.large_string(), st.sampled_from(["", "b", "bbbbbbbbbb"])),
    "point": (pa.struct([("x", pa.float64()), ("y", pa.int32())]), st.fixed_dictionaries(
        {"x": st.none() | st.sampled_from([0.0, -0.0]), "y": st.none() | st.integers(0, 1)})),
}


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_key_codes_are_equal_exactly_for_equal_flat_values(data):
    """Fixed-width values by their bits, byte strings by their bytes, in chunks and sliced, NULL
    apart from empty and from zero: equal codes iff equal values, numbered 0 .. k-1; also where
    the hashes are cut to a few bits so that different rows meet (the codes are then found
    another way)."""
    kinds = data.draw(st.lists(st.sampled_from(sorted(_FLAT)), min_size=1, max_size=4))
    n = data.draw(st.integers(1, 14))
    columns, values = [], []
    for kind in kinds:
        arrow_type, strategy = _FLAT[kind]
        column = data.draw(st.lists(st.none() | strategy, min_size=n, max_size=n))
        cuts = sorted(data.draw(st.lists(st.integers(0, n), max_size=3)))
        parts = [column[a:b] for a, b in zip([0, *cuts], [*cuts, n])]
        # Each chunk with an offset into its buffers.
        columns.append(pa.chunked_array([pa.array([None, *part], arrow_type).slice(1) for part in parts],
                                        arrow_type))
        values.append(column)
    hash_mask = data.draw(st.sampled_from([-1, -1, 0, 1, 3]))
    codes = key_codes(columns, hash_mask=hash_mask)
    rows = [tuple(_python_key(_bits(v[i]) if not isinstance(v[i], dict)
                              else {k: _bits(x) for k, x in v[i].items()}) for v in values) for i in range(n)]
    assert sorted(set(codes.tolist())) == list(range(len(set(rows))))
    for i in range(n):
        for j in range(n):
            assert (codes[i] == codes[j]) == (rows[i] == rows[j]), (rows[i], rows[j])


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_key_codes_of_values_filled_in_from_other_rows_are_the_codes_of_those_values(data):
    """``sources`` (a multiset's unchanged TOAST, coded as its old row's value without copying
    it): the codes tell rows apart exactly as the codes of the columns with the values taken
    from the source rows do; compiled or not, and where the hashes meet."""
    kinds = data.draw(st.lists(st.sampled_from(sorted({**_FLAT, **_NESTED})), min_size=1, max_size=3))
    n = data.draw(st.integers(1, 12))
    columns, sources, taken = [], [], []
    for kind in kinds:
        arrow_type, strategy = {**_FLAT, **_NESTED}[kind]
        cut = data.draw(st.integers(0, n))
        column = data.draw(st.lists(st.none() | strategy, min_size=n, max_size=n))
        chunked = pa.chunked_array([pa.array(column[:cut], arrow_type), pa.array(column[cut:], arrow_type)],
                                   arrow_type)
        source = data.draw(st.none() | st.lists(st.integers(0, n - 1), min_size=n, max_size=n))
        columns.append(chunked)
        sources.append(None if source is None else np.array(source, np.int64))
        taken.append(chunked if source is None else chunked.take(pa.array(source)))
    hash_mask = data.draw(st.sampled_from([-1, -1, 0, 3]))
    expected = key_codes(taken)
    for compiled in (True, False):
        with mock.patch.object(kernel, "numba", kernel.numba if compiled else None):
            codes = key_codes(columns, hash_mask=hash_mask, sources=sources)
        for i in range(n):
            for j in range(n):
                assert (codes[i] == codes[j]) == (expected[i] == expected[j]), (compiled, i, j)


@pytest.mark.parametrize(("arrow_type", "a", "b"), [
    (pa.string(), "a", "b"),  # the same length, apart in the last bytes (not a whole word)
    (pa.string(), "abcdefgh", "abcdefgi"),  # apart in the one word
    (pa.string(), "abcdefgh1", "abcdefgh2"),  # a word alike, apart in the bytes after it
    (pa.string(), "", None),
    (pa.binary(), b"\0", b""),
    (pa.large_binary(), b"12345678" * 3, b"12345678" * 2 + b"12345679"),
    (pa.float64(), 0.0, -0.0),
    (pa.int64(), 0, None),
    (pa.decimal128(20, 0), decimal.Decimal(2**64), decimal.Decimal(0)),  # apart in the second word only
    (pa.struct([("x", pa.int32())]), {"x": None}, None),
])
def test_rows_apart_in_one_column_are_told_apart_when_their_hashes_meet(arrow_type, a, b):
    """Every row is checked against the row its hash numbered it with, column by column and byte by
    byte: with the hash cut to no bits, every row meets the first."""
    same = pa.array(["x" * 9] * 3)
    for hash_mask in (-1, 0):
        codes = key_codes([same, pa.array([a, b, a], arrow_type), same], hash_mask=hash_mask)
        assert codes[0] == codes[2] != codes[1]
