"""Where the real data lives: ``$TWIN_DATA_DIR``, else a per-user cache directory."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def sha256_file(path: str | os.PathLike) -> str:
    """Hex SHA-256 of a file (read in 1 MiB chunks): provenance and fetch checksums."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def data_dir(override: str | os.PathLike | None = None) -> Path:
    """The data directory: ``override``, ``$TWIN_DATA_DIR``, or ``~/.cache/lora-twin/data``. An empty
    ``override`` (``--data-dir ''``) is an error, not the default."""
    if override is not None and not str(override).strip():
        raise ValueError("--data-dir: empty; give the data directory, or leave --data-dir out for $TWIN_DATA_DIR")
    if override:
        return Path(override).expanduser()
    env = os.environ.get("TWIN_DATA_DIR")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "lora-twin" / "data"


def shown_path(path: str | os.PathLike) -> str:
    """``path`` as a result file records it, without this machine's directories: ``$TWIN_DATA_DIR/...`` inside
    the data directory, relative to the working directory inside it (e.g. ``twin/configurator/models/...`` from
    the project's root), else as given."""
    p = Path(path)
    try:
        ap = p.expanduser().resolve()
    except (OSError, RuntimeError):  # (an unreadable path: as given)
        return str(path)
    env = os.environ.get("TWIN_DATA_DIR")
    if env:
        try:
            return str(Path("$TWIN_DATA_DIR") / ap.relative_to(Path(env).expanduser().resolve()))
        except ValueError:
            pass
    try:
        return str(ap.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


#: the data directory's top-level folders (../shared/data): a missing path that starts at one of them
#: was most likely written ``$TWIN_DATA_DIR/<folder>/...`` with the variable unset
DATA_FOLDERS = ("validation", "calibration", "traces", "lengths")


def unset_data_dir_hint(path: str | os.PathLike) -> str:
    """For a missing ``path``: "" or a hint that it looks like ``$TWIN_DATA_DIR/...`` with TWIN_DATA_DIR unset
    (``/validation/x.csv``: the shell expanded the unset variable to nothing)."""
    parts = Path(path).parts
    if os.environ.get("TWIN_DATA_DIR") or len(parts) < 2 or parts[0] != "/" or parts[1] not in DATA_FOLDERS:
        return ""
    return (f" (TWIN_DATA_DIR is not set: was it $TWIN_DATA_DIR{path}? set TWIN_DATA_DIR to the data directory, "
            f"e.g. export TWIN_DATA_DIR=../shared/data)")


def require(relpath: str, override: str | os.PathLike | None = None, fetch_hint: str | None = None) -> Path:
    """Path of ``relpath`` inside the data directory, or a FileNotFoundError saying how to get it."""
    root = data_dir(override)
    p = root / relpath
    if not p.exists():
        where = "--data-dir" if override else "TWIN_DATA_DIR" if os.environ.get("TWIN_DATA_DIR") else "the default"
        hint = fetch_hint or (f"give {where} a directory that holds it" if where != "the default"
                              else "set TWIN_DATA_DIR to a directory that holds it")
        state = (" (it is a file, not a directory)" if root.is_file() else
                 " (it does not exist)" if not root.exists() else "")
        raise FileNotFoundError(f"{relpath} not found in the data directory {root}{state} (from {where}); {hint}")
    return p
