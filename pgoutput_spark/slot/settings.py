"""The session settings the type conversion relies on, set when reading a slot and checked on apply.

pgoutput renders text values with the output functions of the session that
decodes (the walsender, or the session calling
``pg_logical_slot_peek_binary_changes``), so the text form of a date, an
interval, a float or a bytea depends on that session's settings. The capture
sets `SESSION_SETTINGS` (what PostgreSQL's own subscriber asks for, plus a
fixed time zone and monetary locale), records what the server reports, and
`check_session_settings` tells whether a recorded set is one the conversion
reads correctly (see docs/types.md, "Session settings of a text capture").
"""

from __future__ import annotations

from collections.abc import Mapping

from ..errors import CaptureError

__all__ = ["RECORDED_SETTINGS", "SESSION_SETTINGS", "check_session_settings"]

#: Set on the session that reads the slot, in this order.
SESSION_SETTINGS: dict[str, str] = {
    "client_encoding": "UTF8",
    "DateStyle": "ISO, YMD",
    "IntervalStyle": "postgres",
    "TimeZone": "UTC",
    "extra_float_digits": "3",
    "bytea_output": "hex",
    "lc_monetary": "C",
}

#: Recorded with every landing (what ``SHOW`` reports after `SESSION_SETTINGS`).
RECORDED_SETTINGS: tuple[str, ...] = (*SESSION_SETTINGS, "server_encoding")

_MONETARY_LOCALES = ("C", "POSIX", "en_US")


def _problem(name: str, value: str) -> str | None:
    """Why `value` of setting `name` breaks the conversion, or None when it is fine."""
    if name == "DateStyle" and value.split(",")[0].strip().upper() != "ISO":
        return "dates and timestamps are read in ISO style only: DateStyle must start with ISO"
    if name == "IntervalStyle" and value != "postgres":
        return "intervals are read in IntervalStyle postgres only"
    if name == "extra_float_digits":
        try:
            digits = int(value)
        except ValueError:
            return "not an integer"
        if digits < 1:
            return "floats would be rounded: extra_float_digits must be 1 or more"
    if name == "bytea_output" and value not in ("hex", "escape"):
        return "bytea_output must be hex or escape"
    if name == "client_encoding" and value.upper().replace("-", "") != "UTF8":
        return "text values are read as UTF-8"
    if name == "lc_monetary" and not value.startswith(_MONETARY_LOCALES):
        return "money is read with 2 fraction digits, '.' and ',': lc_monetary must be C, POSIX or en_US"
    return None


def check_session_settings(settings: Mapping[str, str], *, source: str) -> None:
    """Raise `CaptureError` naming `source` and the setting if the conversion can't read its values.

    Settings missing from `settings` are not checked (older landings, or
    captures made by other tools, may record only some of them).
    """
    for name, value in settings.items():
        problem = _problem(name, str(value))
        if problem is not None:
            raise CaptureError(f"{source}: the capture was read with {name} = {value!r}: {problem}")
