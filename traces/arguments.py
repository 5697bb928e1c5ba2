"""Parsers for list and boolean option values, shared by every command and scenario file.

One parser for lists (``--ranks 8,16,32``, ``--rates 0.1,0.05``, and the real-run tables'
``8-16-32`` form), so every command reads a list the same way and refuses the same
mistakes with a message that names the option; and one form for a bad cell of an input
table (:func:`cell_error`: the file, the row and its CSV line, the column, the value).
"""

from __future__ import annotations

import csv
import difflib
import numbers
import os
import re
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterable, TypeVar

import numpy as np

T = TypeVar("T")

_SEPARATORS = re.compile(r"[,/\s]+")
#: a comma with nothing before or after it (``8,,16``, ``8,16,``, ``,8``)
_EMPTY_ITEM = re.compile(r"(^|,)\s*(,|$)")


def is_flag(v: Any) -> bool:
    """True or False (numpy's too): a value that ``int()`` and ``float()`` would take as 1 or 0."""
    return isinstance(v, (bool, np.bool_))


def is_real_number(v: Any) -> bool:
    """A real number (numpy's too), not a bool (``True`` would count as 1) nor a string: the test every
    numeric argument and constant of the project passes before it is used."""
    return isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_))


def is_whole_number(v: Any) -> bool:
    """An integer (numpy's too) or a float with no fraction, not a bool: a count given as ``2.0`` is
    accepted, ``2.5`` (which ``int()`` would truncate silently) is not."""
    return (isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_))) or (
        isinstance(v, float) and v.is_integer())


def parse_list(value: Any, cast: Callable[[str], T] = float, name: str = "value",
               minimum: float | None = None, dashes: bool = True) -> list[T]:
    """A list from ``"8,16,32"``, ``"8/16/32"``, ``"8-16-32"`` (the real-run tables' form),
    or an iterable of values. ``minimum`` refuses smaller items. ``dashes=False`` refuses the
    dashed form (on a command line ``8-128`` reads as a range: the caller asks for commas).
    Raises ``ValueError`` naming ``name`` and showing the expected form (an example of its kind: ranks
    8,16,32 for integers, rates 0.4,0.05,0.00625 for a name with "rate", else 0.5,1,2)."""
    ex = "8,16,32" if cast is int else "0.4,0.05,0.00625" if "rate" in name.lower() else "0.5,1,2"
    if value is None:
        raise ValueError(f"{name}: a list is required, e.g. {ex}")
    if isinstance(value, str):
        text = value.strip()
        if _SEPARATORS.sub("", text) and has_empty_item(text):
            raise ValueError(f"{name}: {value!r} has an empty item (two commas in a row, or a comma at an end); "
                             f"give comma-separated values, e.g. {ex}")
        if text.startswith("-") and minimum is not None and minimum >= 0:
            raise ValueError(f"{name}: values must be >= {minimum:g}, got {value!r}")
        parts = [p for p in _SEPARATORS.split(text) if p]
        if len(parts) == 1 and "-" in parts[0][1:] and "e-" not in parts[0].lower():
            if not dashes:
                raise ValueError(f"{name}: {value!r} is ambiguous (a range or a list?); list the values with "
                                 f"commas, e.g. {parts[0].replace('-', ',')}")
            parts = parts[0].split("-")  # the tables' 8-16-32 form
            if not all(parts):  # (-0.4-0.1, 0.4--0.1, 8-16-: a sign or an item the dashes would drop)
                raise ValueError(f"{name}: {value!r} has an empty or negative item (a dash at an end or two in a "
                                 f"row); give positive values joined by single dashes, e.g. 8-16-32")
        items: list[Any] = parts
    elif isinstance(value, (bytes, dict)):
        raise ValueError(f"{name}: expected a list, e.g. {ex}, got {value!r}")
    else:
        try:
            items = list(value)
        except TypeError:
            items = [value]
    if not items:
        raise ValueError(f"{name}: empty list; give comma-separated values, e.g. {ex}")
    out: list[T] = []
    for x in items:
        try:
            if isinstance(x, bool) or (cast is int and isinstance(x, float) and not x.is_integer()):
                raise ValueError(x)
            v = cast(x) if not isinstance(x, str) else cast(x.strip())
            if isinstance(v, float) and v != v:
                raise ValueError(x)
        except (TypeError, ValueError, OverflowError):
            kind = getattr(cast, "__name__", "number")
            raise ValueError(f"{name}: {x!r} is not a valid {kind}; give comma-separated values, "
                             f"e.g. {ex}") from None
        if minimum is not None and v < minimum:  # type: ignore[operator]
            raise ValueError(f"{name}: values must be >= {minimum:g}, got {x!r}")
        out.append(v)
    return out


def cell_error(source: Any, frame: Any, i: int, col: str, problem: str, fix: str, csv_line: bool = True) -> ValueError:
    """The error for the cell of row ``i`` (0-based) and column ``col`` of the table ``frame`` read from
    ``source``: ``SOURCE: row N (line N + 1), column COL: VALUE PROBLEM; FIX``, the value shown as ``an empty
    cell`` when it is missing (``csv_line``: the table came from a CSV file with a header line)."""
    v = frame[col].iloc[i]
    shown = "an empty cell" if v is None or (isinstance(v, float) and v != v) else repr(
        v.item() if hasattr(v, "item") else v)
    line = f" (line {i + 2})" if csv_line else ""
    return ValueError(f"{source}: row {i + 1}{line}, column {col}: {shown} {problem}; {fix}")


def csv_layout_problem(path: str | os.PathLike) -> str | None:
    """What is wrong with the layout of the CSV file ``path`` that pandas read, or None: a header that
    names a column twice (pandas renames the second ``NAME.1``, so its values would be lost or refused
    as an unknown column), or a first data row with more cells than the header (pandas then reads the
    first column as the row labels and shifts every value one column left: a trailing comma on each
    row does it; a later row that long is pandas' own "Expected N fields" error)."""
    try:
        with open(path, encoding="utf-8-sig", newline="") as fh:
            reader = csv.reader(fh)
            rows = (row for row in reader if row)  # (pandas skips blank lines)
            header = next(rows, [])
            names = [h.strip() for h in header]
            twice = next((n for i, n in enumerate(names) if n and n in names[:i]), None)
            if twice is not None:
                return (f"the header names column {twice!r} twice; give every column once (the second one's "
                        f"values would be lost)")
            first = next(rows, None)
            if first is not None and len(first) > len(header):
                return (f"row 1 (line {reader.line_num}) has {len(first)} cells but the header names {len(header)} "
                        f"columns (a trailing comma?); give one cell per column (every value would be read one "
                        f"column to the left)")
    except (OSError, UnicodeDecodeError, csv.Error):
        return None
    return None


def has_empty_item(text: str) -> bool:
    """Whether the comma-separated ``text`` has an empty item (``8,,16``, ``8,16,``, ``,8``)."""
    return bool(_EMPTY_ITEM.search(text))


def first_repeat(values: list[Any]) -> int:
    """The index of the first value that repeats an earlier one, or -1 when all differ (in linear
    time for hashable values and lists of them: a grid file's list of 100,000 seeds is read at once)."""
    seen: set[Any] = set()
    for i, v in enumerate(values):
        try:
            key = _hashable(v)
            if key in seen:
                return i
            seen.add(key)
        except TypeError:  # (a value that cannot be hashed: compared with every earlier one)
            if v in values[:i]:
                return i
    return -1


class RepeatedKey(ValueError):
    """A key given twice in one object of a JSON or YAML file (``json`` and PyYAML keep the last silently; TOML's
    parser refuses it itself); ``where``: the position, e.g. `` (line 3)``, when the parser gives one."""

    def __init__(self, key: Any, where: str = "") -> None:
        super().__init__(key)
        self.key, self.where = key, where


def unique_keys_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads``' ``object_pairs_hook``: a dict, refusing a repeated key (:class:`RepeatedKey`)."""
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise RepeatedKey(k)
        out[k] = v
    return out


def did_you_mean(name: Any, choices: "Iterable[str]") -> str:
    """`` (did you mean 'chameleon'?)`` for a misspelt ``name`` close to one of ``choices`` (difflib's ratio at
    least 0.6), else an empty string: what an unknown-name error puts after the name."""
    close = difflib.get_close_matches(str(name), [str(c) for c in choices], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _hashable(v: Any) -> Any:
    """``v`` with lists (and tuples) as tuples, so that equal lists hash alike (``[8, 16]`` == ``[8.0, 16]``)."""
    return tuple(_hashable(x) for x in v) if isinstance(v, (list, tuple)) else v


def parse_bool(value: Any, name: str = "value") -> bool:
    """``true/false``, ``yes/no``, ``on/off``, ``1/0`` (any case) or a bool."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        v = value.strip().lower()
        if v in ("1", "true", "yes", "on"):
            return True
        if v in ("0", "false", "no", "off"):
            return False
    raise ValueError(f"{name}: expected true or false, got {value!r}")


def _creatable_under(flag: str, given: Any, path: Path) -> None:
    """The nearest existing ancestor of ``path`` is a directory we may write into: checked by
    creating (and removing) a probe directory there, since permission bits do not tell
    (``/proc``, a read-only mount, root's access to everything)."""
    parent = path
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise ValueError(f"{flag} {given}: {parent} is a file, so no directory can be created under it; "
                         f"give another path")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"{flag} {given}: {parent} is not writable; give a path you can write to")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".write-probe-", dir=parent))
    except OSError as e:
        raise ValueError(f"{flag} {given}: nothing can be created in {parent} ({e.strerror or e}); give a path you "
                         f"can write to") from None


def check_writable_dir(flag: str, value: Any) -> Path:
    """An output directory option (``--out``), checked before any work: not empty, not an
    existing file, creatable and writable. Raises ``ValueError`` naming ``flag``."""
    if value is None or not str(value).strip():
        raise ValueError(f"{flag}: empty; give a directory, e.g. {flag} runs/a")
    path = Path(value).expanduser()
    if path.exists() and not path.is_dir():
        raise ValueError(f"{flag} {value}: is an existing file, not a directory; give a directory (new or existing)")
    _creatable_under(flag, value, path)
    return path


def check_writable_file(flag: str, value: Any, suffixes: tuple[str, ...] = ()) -> Path:
    """An output file option (``--plot FILE``), checked before any work: one of ``suffixes``
    (when given), not a directory, its folder creatable and writable."""
    if value is None or not str(value).strip():
        raise ValueError(f"{flag}: empty; give a file name")
    path = Path(value).expanduser()
    if suffixes and path.suffix.lower() not in suffixes:
        raise ValueError(f"{flag} {value}: give a {', '.join(suffixes[:-1])} or {suffixes[-1]} file"
                         if len(suffixes) > 1 else f"{flag} {value}: give a {suffixes[0]} file")
    if path.is_dir():
        raise ValueError(f"{flag} {value}: is a directory; give a file")
    _creatable_under(flag, value, path.parent)
    return path
