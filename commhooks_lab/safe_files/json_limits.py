"""JSON from a file handed around, parsed with bounds: no integer the size of a book, no nesting that exhausts
the parser, and every failure naming the file."""

from __future__ import annotations

import json
from typing import Any

from .errors import UnsafeFileError, shown

__all__ = ["MAX_INT_DIGITS", "parse_json"]

#: The longest integer the lab reads: a uint64 has 20 digits; Python refuses more than 4300 with a bare ValueError.
MAX_INT_DIGITS = 24


class _IntTooLong(Exception):
    def __init__(self, digits: int):
        self.digits = digits


def _bounded_int(text: str) -> int:
    digits = len(text) - text.startswith("-")
    if digits > MAX_INT_DIGITS:
        raise _IntTooLong(digits)
    return int(text)


def parse_json(data: bytes, where: object, advice: str) -> Any:
    """``data`` parsed as JSON; an :class:`UnsafeFileError` naming ``where`` and giving ``advice`` if it is not
    UTF-8 JSON, nests deeper than Python's recursion limit (json's C scanner counts each level against it), or
    holds an integer longer than :data:`MAX_INT_DIGITS` digits."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        problem = f"is not UTF-8 text ({exc.reason} at byte {exc.start})"
        raise UnsafeFileError(f"{shown(where)} {problem}: {advice}") from None
    try:
        return json.loads(text, parse_int=_bounded_int)
    except _IntTooLong as exc:
        problem = f"holds an integer of {exc.digits} digits (the lab writes at most {MAX_INT_DIGITS})"
    except RecursionError:
        problem = "nests its lists and objects deeper than Python's parser goes"
    except json.JSONDecodeError as exc:
        problem = f"is damaged: not JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})"
    raise UnsafeFileError(f"{shown(where)} {problem}: {advice}")
