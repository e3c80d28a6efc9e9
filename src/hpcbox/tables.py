"""Reading TOML: one way to load a file, one typed reader of its tables, for every file hpcbox reads.

pyproject's `[tool.hpcbox]` (with its run, steps and resources), a sweep file, a cluster profile, the
locks' TOML and the recorded digests all go through `load_toml` and `Table`, so each error is one line
in one form: the key's full path (`tool.hpcbox.run.args`, `partitions[2].max_time`), what is wrong,
what is allowed. Hand-written rather than a validation library: these files have a handful of shapes,
the messages are hpcbox's own one-line form, and the package takes no dependency for it.
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from hpcbox.errors import FieldError, HpcboxError

# A name in a hpcbox file (a partition, a profile ...): letters, digits, ".", "_", "-".
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_KIND_WORDS = {
    str: "a string",
    int: "a whole number",
    bool: "true or false",
    list: "a list",
    dict: "a table",
}


def toml_value(value: str | bool | int | list[str]) -> str:
    """``value`` as TOML writes it: JSON's strings, numbers, booleans and arrays of them are TOML's."""
    return json.dumps(value, ensure_ascii=False)


def load_toml(path: Path, field_name: str = "", shape: str = "") -> dict[str, Any]:
    """``path``'s TOML. A syntax error, or bytes that are not UTF-8, is one line naming the file (and the
    setting that named the file, where ``field_name`` says); its hint shows the file's ``shape`` where
    given (a file that is not TOML at all, as a list of arguments for a sweep, needs it more than the
    syntax error)."""
    try:
        return tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        problem = f"{path.name if field_name else path} is not valid TOML: {exc}"
        hint = "fix the syntax error it names" + (f"; {shape}" if shape else "")
        if field_name:
            raise FieldError(field_name, problem, hint) from exc
        raise HpcboxError(problem, hint) from exc


class Table:
    """Typed access to one TOML table at ``where`` (its path, for errors; "" at a file's top)."""

    def __init__(self, data: Any, where: str, *, hint: str = "") -> None:
        if not isinstance(data, dict):
            raise FieldError(where, "must be a table", hint)
        self.data: dict[str, Any] = data
        self.where = where
        self.seen: set[str] = set()

    def __contains__(self, key: str) -> bool:
        return key in self.data

    def key(self, key: str) -> str:
        """``key``'s full path, as errors name it."""
        return f"{self.where}.{key}" if self.where else key

    def get(
        self,
        key: str,
        kind: type,
        *,
        required: bool = False,
        default: Any = None,
        hint: str = "",
        must: str = "",
    ) -> Any:
        """The value at ``key``, of ``kind`` (a bool is no int); ``default`` where it is missing. ``must``
        says what it must be, where that is more than its type."""
        self.seen.add(key)
        if key not in self.data:
            if required:
                raise FieldError(self.key(key), "is missing", hint)
            return default
        value = self.data[key]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise FieldError(self.key(key), f"{value!r} must be {must or _KIND_WORDS[kind]}", hint)
        return value

    def string(self, key: str, *, default: str | None = None, hint: str = "") -> str:
        """A non-empty string; required unless a ``default`` is given."""
        value = self.get(key, str, required=default is None, default=default, hint=hint)
        if not value:
            raise FieldError(self.key(key), "is empty", hint)
        return value

    def optional_string(self, key: str) -> str | None:
        return self.get(key, str) or None

    def name(self, key: str, *, default: str | None = None, hint: str = "") -> str:
        """A name: letters, digits, '.', '_' or '-', starting with a letter or digit; required unless a
        ``default`` is given."""
        value = self.string(key, default=default, hint=hint)
        if not NAME.match(value):
            raise FieldError(self.key(key), f"{value!r}: use letters, digits, '.', '_' or '-'", hint)
        return value

    def integer(self, key: str, *, default: int | None = None, minimum: int = 0, hint: str = "") -> int:
        value = self.get(key, int, required=default is None, default=default, hint=hint)
        if value < minimum:
            raise FieldError(self.key(key), f"{value} is below {minimum} (allowed: {minimum} or more)", hint)
        return value

    def boolean(self, key: str, *, default: bool | None = None) -> bool:
        return self.get(key, bool, required=default is None, default=default)

    def choice(self, key: str, allowed: tuple[str, ...], *, default: str | None = None) -> str:
        value = self.get(key, str, required=default is None, default=default)
        if value not in allowed:
            raise FieldError(self.key(key), f"{value!r} (allowed: {', '.join(allowed)})")
        return value

    def str_list(
        self, key: str, *, default: list[str] | None = None, empty_items: bool = False, hint: str = ""
    ) -> list[str]:
        """A list of strings (non-empty ones unless ``empty_items``); required unless a ``default``."""
        must = "a list of strings" if empty_items else "a list of non-empty strings"
        value = self.get(key, list, required=default is None, default=default, hint=hint, must=must)
        if not all(isinstance(item, str) and (item or empty_items) for item in value):
            raise FieldError(self.key(key), f"{value!r} must be {must}", hint)
        return value

    def table(self, key: str, *, required: bool = True, hint: str = "") -> Table:
        return Table(self.get(key, dict, required=required, default={}, hint=hint), self.key(key), hint=hint)

    def tables(self, key: str, *, required: bool = True, hint: str = "") -> list[Table]:
        """``[[key]]``: each table with its index in its path (`partitions[2]`)."""
        value = self.get(key, list, required=required, default=[], hint=hint)
        if not all(isinstance(item, dict) for item in value):
            raise FieldError(self.key(key), f"must be [[{key}]] tables", hint)
        return [Table(item, f"{self.key(key)}[{index}]") for index, item in enumerate(value)]

    def reject_extra(self, also_allowed: Iterable[str] = (), *, what: str = "setting") -> None:
        """A key this table's reader did not ask for is a typo, not something to ignore."""
        allowed = self.seen | set(also_allowed)
        extra = sorted(set(self.data) - allowed)
        if extra:
            words = f"is not a {what} (a typo? allowed: {', '.join(sorted(allowed))})"
            raise FieldError(self.key(extra[0]), words)
