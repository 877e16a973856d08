"""What featcache's own JSON and TOML documents must hold, checked when they are read back.

A document featcache wrote (``results.json``, ``run.json``, a fine-tuning ``history.json``, a
pipeline recipe) can be damaged on disk or edited by hand; every reader goes through
:func:`read_document` with the document's schema, so that a string where a number belongs, a
``null`` where a record belongs, a list instead of an object or bytes that are not text end in
one line naming the file, the key and what it holds, and the command that makes the file
again, instead of a ``TypeError`` deep inside a report.

A schema is built from a few pieces: :class:`Text`, :class:`Number`, :class:`Integer`,
:class:`Flag`, :class:`Choice`, :class:`ListOf`, :class:`MapOf` (an object with any keys),
:class:`Record` (an object with named keys, required or optional; keys it does not name are
allowed, so that newer files stay readable) and :func:`nullable`. Checking costs one pass over
the document (a results file of 100,000 classes: milliseconds).
"""

from __future__ import annotations

import json
import math
import os
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from featcache.errors import InputError


class Mismatch(Exception):
    """Where a document differs from its schema (``at``: ``selection.test_map``), and how."""

    def __init__(self, at: str, problem: str):
        super().__init__(f"{at or 'the document'} {problem}")
        self.at, self.problem = at, problem


def describe(value: Any) -> str:
    """How a found value reads in a message: ``the string '87.1'``, ``null``, ``a list``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"{str(value).lower()} (a boolean)"
    if isinstance(value, str):
        shown = value if len(value) <= 30 else value[:27] + "..."
        return f"the string {shown!r}"
    if isinstance(value, (int, float)):
        return f"the number {value!r}"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return f"a {type(value).__name__}"


class Schema:
    """What a value must be; :meth:`check` raises :class:`Mismatch` naming where it is not."""

    #: how the expected value reads in a message ("a number")
    expected = "a value"

    def check(self, value: Any, at: str = "") -> None:
        if not self.accepts(value):
            raise Mismatch(at, f"is {describe(value)}, expected {self.expected}")

    def accepts(self, value: Any) -> bool:
        return True


class Anything(Schema):
    """Any JSON value."""


class Text(Schema):
    expected = "a string"

    def accepts(self, value: Any) -> bool:
        return isinstance(value, str)


class Number(Schema):
    """A JSON number (NaN and infinities included: Python writes them), never a boolean."""

    expected = "a number"

    def accepts(self, value: Any) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool)


class FiniteNumber(Number):
    expected = "a finite number"

    def accepts(self, value: Any) -> bool:
        return super().accepts(value) and math.isfinite(value)


class Integer(Schema):
    expected = "an integer"

    def accepts(self, value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool)


class Flag(Schema):
    expected = "true or false"

    def accepts(self, value: Any) -> bool:
        return isinstance(value, bool)


class Choice(Schema):
    """One of a few strings."""

    def __init__(self, *choices: str):
        self.choices = choices
        self.expected = "one of " + ", ".join(repr(c) for c in choices)

    def accepts(self, value: Any) -> bool:
        return isinstance(value, str) and value in self.choices


class Nullable(Schema):
    """``inner`` or null."""

    def __init__(self, inner: Schema):
        self.inner = inner
        self.expected = f"{inner.expected} or null"

    def check(self, value: Any, at: str = "") -> None:
        if value is not None:
            try:
                self.inner.check(value, at)
            except Mismatch as exc:
                if exc.at != at:  # deeper down: that key's message
                    raise
                raise Mismatch(at, f"is {describe(value)}, expected {self.expected}") from None


def nullable(inner: Schema) -> Nullable:
    return Nullable(inner)


class AnyOf(Schema):
    """Any of several schemas (the first that fits)."""

    def __init__(self, *options: Schema):
        self.options = options
        self.expected = " or ".join(o.expected for o in options)

    def check(self, value: Any, at: str = "") -> None:
        for option in self.options:
            try:
                option.check(value, at)
                return
            except Mismatch:
                continue
        raise Mismatch(at, f"is {describe(value)}, expected {self.expected}")


class ListOf(Schema):
    """A list whose every item is ``item`` (``at least``: the fewest items)."""

    def __init__(self, item: Schema, at_least: int = 0):
        self.item, self.at_least = item, at_least
        self.expected = "a list"

    def check(self, value: Any, at: str = "") -> None:
        if not isinstance(value, list):
            raise Mismatch(at, f"is {describe(value)}, expected a list")
        if len(value) < self.at_least:
            raise Mismatch(at, f"holds {len(value)} items, expected at least {self.at_least}")
        if isinstance(self.item, Anything):
            return
        accepts = type(self.item).accepts
        if type(self.item).check is Schema.check:  # a plain scalar: the fast path
            for index, item in enumerate(value):
                if not accepts(self.item, item):
                    self.item.check(item, f"{at}[{index}]")
            return
        for index, item in enumerate(value):
            self.item.check(item, f"{at}[{index}]")


class MapOf(Schema):
    """A JSON object with any keys, each value ``value``."""

    expected = "an object"

    def __init__(self, value: Schema | None = None):
        self.value = value or Anything()

    def check(self, value: Any, at: str = "") -> None:
        if not isinstance(value, dict):
            raise Mismatch(at, f"is {describe(value)}, expected an object")
        if isinstance(self.value, Anything):
            return
        accepts = type(self.value).accepts
        scalar = type(self.value).check is Schema.check
        for key, item in value.items():
            if scalar and accepts(self.value, item):
                continue
            self.value.check(item, _key(at, key))


class Record(Schema):
    """A JSON object with named keys: ``required`` ones must be there, ``optional`` ones may be;
    other keys are allowed (a newer featcache may add some) unless ``closed``."""

    expected = "an object"

    def __init__(self, required: Mapping[str, Schema] | None = None,
                 optional: Mapping[str, Schema] | None = None, closed: bool = False):
        self.required = dict(required or {})
        self.optional = dict(optional or {})
        self.closed = closed

    def check(self, value: Any, at: str = "") -> None:
        if not isinstance(value, dict):
            raise Mismatch(at, f"is {describe(value)}, expected an object")
        for key, schema in self.required.items():
            if key not in value:
                raise Mismatch(_key(at, key), "is missing")
            schema.check(value[key], _key(at, key))
        for key, schema in self.optional.items():
            if key in value:
                schema.check(value[key], _key(at, key))
        if self.closed:
            other = next((key for key in value
                          if key not in self.required and key not in self.optional), None)
            if other is not None:
                raise Mismatch(_key(at, other), "is not a key this file holds")


def _key(at: str, key: object) -> str:
    return f"{at}.{key}" if at else str(key)


# ------------------------------------------------------------------------------ reading
def read_document(path: str | os.PathLike, schema: Schema, what: str,
                  remake: str | Callable[[], str], kind: str = "json") -> Any:
    """The document in ``path`` (``kind``: ``json`` or ``toml``) checked against ``schema``;
    None when there is no such file. Anything else is one :class:`InputError` line: ``path``,
    that it is not a valid ``what`` ("featcache results file") and why, then ``remake`` (the
    advice, or what makes it, asked only then)."""
    path = Path(path)
    if not path.is_file():
        return None
    data = path.read_bytes()
    try:
        document = parse_document(data, kind)
        schema.check(document)
    except (ValueError, Mismatch) as exc:
        advice = remake() if callable(remake) else remake
        raise InputError(f"{path} is not a valid {what}: {exc}"
                         + (f"; {advice}" if advice else "")) from None
    return document


def parse_document(data: bytes, kind: str = "json") -> Any:
    """JSON or TOML text from ``data``; ValueError with a short reason when it is not."""
    if b"\x00" in data[:4096]:
        raise ValueError("it holds binary data, not text")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"it is not UTF-8 text (byte {exc.start} cannot be decoded)") from None
    if kind == "toml":
        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"it is not valid TOML ({exc})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"it is not valid JSON ({exc.msg} at line {exc.lineno} column "
                         f"{exc.colno})") from None
    except RecursionError:
        raise ValueError("it is not valid JSON (nested too deeply)") from None
