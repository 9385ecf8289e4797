"""inet, cidr, macaddr, macaddr8 -> strings in PostgreSQL's text form.

The binary forms are turned into exactly what ``inet_out`` / ``cidr_out`` /
``macaddr_out`` print: IPv4 dotted quads, IPv6 with the first longest run of
two or more zero words shortened to ``::`` and ``::a.b.c.d`` /
``::ffff:a.b.c.d`` for embedded IPv4 (src/port/inet_net_ntop.c), ``/bits``
unless the mask is the full width (always for cidr). Vectorized: the address
words are classified with NumPy and the text assembled column-wise with
``pyarrow.compute`` (eight word slots per address, no per-value loop).
"""

from __future__ import annotations

import functools

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .codec import Codec, Converter, fixed_type, require_match
from .oids import BuiltinType
from .pgtype import PgType
from .raw import RawValues, fail_where, string_from_matrix
from .uuid import hex_pairs

_PGSQL_AF_INET = 2
_PGSQL_AF_INET6 = 3
_INET_TEXT = r"^[0-9a-fA-F:.]+(/[0-9]{1,3})?$"
_STRING = fixed_type(pa.string())


@functools.cache
def _decimal_words(n: int) -> pa.StringArray:
    return pa.array([str(i) for i in range(n)], pa.string())


@functools.cache
def _hex_words() -> pa.StringArray:
    return pa.array([f"{i:x}" for i in range(65536)], pa.string())


def _take(table: pa.StringArray, index: np.ndarray) -> pa.Array:
    return table.take(pa.array(index.astype(np.int32)))


def _constant(text: str, n: int) -> pa.Array:
    return pa.array(np.full(n, text, dtype=object), pa.string())


def _choose(mask: np.ndarray, yes: pa.Array, no: pa.Array) -> pa.Array:
    return pc.if_else(pa.array(mask, pa.bool_()), yes, no)


def _join(*parts: pa.Array) -> pa.Array:
    return pc.binary_join_element_wise(*parts, "")


def _network_text(raw: RawValues, t: PgType) -> pa.Array:
    strings = raw.as_string()
    require_match(raw, strings, _INET_TEXT, f"{t.display_name} text must be an IPv4 or IPv6 address")
    return strings


def _network_binary(cidr: bool) -> Converter:
    def convert(raw: RawValues, t: PgType) -> pa.Array:
        valid, n = raw.valid, raw.n
        what = "cidr" if cidr else "inet"
        fail_where(valid & (raw.lengths < 4), f"{what} binary value is shorter than its 4-byte header")
        family = raw.read(0, "u1")
        bits = raw.read(1, "u1").astype(np.int64)
        size = raw.read(3, "u1").astype(np.int64)
        v4 = family == _PGSQL_AF_INET
        v6 = family == _PGSQL_AF_INET6
        fail_where(valid & ~(v4 | v6), f"{what} has an unknown address family")
        width = np.where(v4, 4, 16)
        fail_where(valid & ((size != width) | (raw.lengths != 4 + width)), f"{what} address length is wrong")
        fail_where(valid & (bits > width * 8), f"{what} mask is longer than the address")
        column = np.arange(16)
        inside = valid[:, None] & (column < width[:, None])
        index = np.minimum(raw.starts[:, None] + 4 + column, max(raw.data.size - 1, 0))
        address = np.where(inside, raw.data[index] if raw.data.size else 0, 0).astype(np.uint8)
        text = _choose(v4, _ipv4(address[:, :4]), _ipv6(address))
        full = np.where(v4, 32, 128)
        with_mask = valid & ((bits != full) | cidr)
        suffix = _choose(with_mask, _join(_constant("/", n), _take(_decimal_words(256), bits)), _constant("", n))
        return pc.if_else(pa.array(valid), _join(text, suffix), pa.nulls(n, pa.string()))

    return convert


def _ipv4(octets: np.ndarray) -> pa.Array:
    words = _decimal_words(256)
    parts = [_take(words, octets[:, k]) for k in range(4)]
    return pc.binary_join_element_wise(*parts, ".")


def _ipv6(address: np.ndarray) -> pa.Array:
    n = address.shape[0]
    words = address.view(">u2").astype(np.int64)  # (n, 8)
    zero = words == 0
    run = np.zeros((n, 9), dtype=np.int64)  # zero-run length starting at each word
    for i in range(7, -1, -1):
        run[:, i] = np.where(zero[:, i], run[:, i + 1] + 1, 0)
    starts = zero & ~np.c_[np.zeros((n, 1), bool), zero[:, :-1]]
    base = np.argmax(np.where(starts, run[:, :8], -1), axis=1)  # first of the longest runs
    length = run[np.arange(n), base]
    shorten = length >= 2
    base = np.asarray(np.where(shorten, base, -1))
    length = np.where(shorten, length, 0)
    embedded_v4 = (base == 0) & ((length == 6) | ((length == 5) & (words[:, 5] == 0xFFFF)))
    dotted = _ipv4(address[:, 12:])
    empty, colon = _constant("", n), _constant(":", n)
    hex_words = _hex_words()
    parts = []
    for i in range(8):
        inside = (i >= base) & (i < base + length)
        sep = colon if i else empty
        token = _join(sep, _take(hex_words, words[:, i]))
        if i == 6:
            token = _choose(embedded_v4, _join(colon, dotted), token)
        if i == 7:
            token = _choose(embedded_v4, empty, token)
        parts.append(_choose(inside, _choose(np.asarray(base == i), colon, empty), token))
    parts.append(_choose(shorten & (base + length == 8), colon, empty))
    return _join(*parts)


# -- macaddr, macaddr8 -------------------------------------------------------------


def _mac_codec(width: int, what: str) -> Codec:
    pattern = rf"^[0-9a-f]{{2}}(:[0-9a-f]{{2}}){{{width - 1}}}$"
    chars_per = 3 * width - 1
    hex_columns = np.array([3 * k + d for k in range(width) for d in (0, 1)])

    def text(raw: RawValues, t: PgType) -> pa.Array:
        strings = raw.as_string()
        require_match(raw, strings, pattern, f"{what} text must be {width} hex pairs separated by ':'")
        return strings

    def binary(raw: RawValues, t: PgType) -> pa.Array:
        chars = np.full((raw.n, chars_per), ord(":"), dtype=np.uint8)
        chars[:, hex_columns] = hex_pairs(raw.fixed(width, what))
        return string_from_matrix(chars, raw.valid)

    return Codec(_STRING, text, binary)


CODECS: dict[int, Codec] = {
    BuiltinType.INET: Codec(_STRING, _network_text, _network_binary(cidr=False)),
    BuiltinType.CIDR: Codec(_STRING, _network_text, _network_binary(cidr=True)),
    BuiltinType.MACADDR: _mac_codec(6, "macaddr"),
    BuiltinType.MACADDR8: _mac_codec(8, "macaddr8"),
}
