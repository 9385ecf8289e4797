"""Other pgoutput decoders run on the same messages: pypgoutput 0.0.3.

pypgoutput (https://pypi.org/project/pypgoutput/) decodes one message per
object: ``pypgoutput.decoders.Insert(data)`` and so on, reading through an
``io.BytesIO`` and turning every text value into a ``str``. It has no decoder
for Origin, Type or logical messages; the benchmark capture has none of those.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable, Iterable
from typing import Any

Decoder = Callable[[Iterable[bytes]], list[Any]]


def pypgoutput_decoder() -> tuple[Decoder | None, str]:
    """(decode_all, version) or (None, why it is not available)."""
    try:
        from pypgoutput import decoders
    except Exception as exc:  # ImportError, or its psycopg2 / pydantic imports failing
        return None, f"{type(exc).__name__}: {exc}"
    version = importlib.metadata.version("pypgoutput")
    by_type: dict[int, Callable[[bytes], Any]] = {
        ord("B"): decoders.Begin,
        ord("C"): decoders.Commit,
        ord("R"): decoders.Relation,
        ord("I"): decoders.Insert,
        ord("U"): decoders.Update,
        ord("D"): decoders.Delete,
        ord("T"): decoders.Truncate,
    }

    def decode_all(messages: Iterable[bytes]) -> list[Any]:
        lookup = by_type
        return [lookup[data[0]](data) for data in messages]

    return decode_all, version
