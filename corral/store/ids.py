"""Row ids as they arrive from outside (a URL path, a query string, a job's dependency): which
numbers can name a stored row at all. Every id column is an SQL ``INTEGER``: 32 bits on
PostgreSQL, which refuses even to compare one with a larger number (an error, not "no row"),
and 64 on SQLite, whose driver cannot bind a larger Python ``int``. A number beyond
``MAX_ID`` therefore names no row, and is answered as such before any query is made.

Every route that takes an id or a cursor goes through here: ``parse_id`` for text (a path
segment such as ``12`` or ``12_3``), ``MAX_ID`` as the bound of integer parameters."""

from __future__ import annotations

MAX_ID = 2**31 - 1  # the largest value of an INTEGER column on PostgreSQL (and SQLite's 64 bits hold it)
_DIGITS = len(str(MAX_ID))


def is_number(text: str) -> bool:
    """ASCII digits only (``str.isdigit`` alone takes '²' and other Unicode digits)."""
    return text.isascii() and text.isdigit()


def storable(value: int, least: int = 1) -> bool:
    """Whether ``value`` fits an id column (ids start at 1; an array index at 0)."""
    return least <= value <= MAX_ID


def parse_id(text: str, least: int = 1) -> int | None:
    """The id ``text`` spells, or None when it spells no number a row could have."""
    if not is_number(text) or len(text.lstrip("0")) > _DIGITS:  # no int() of a million digits
        return None
    value = int(text)
    return value if storable(value, least) else None
