"""A disk memo of reproduction points, valid only for the exact code and profiles that made them.

``twin reproduce --cache DIR`` (or ``TWIN_REPRODUCE_CACHE=DIR``) stores each simulated point's
summary under a key made of the point's definition (run configuration, preset, overrides) and a
fingerprint of the twin itself: the bytes of every ``.py`` and ``.json`` file of the packages that
decide a result (``twin``, ``policies``, ``traces``, ``calibration``, profiles included). Any edit
to the code or a profile changes the fingerprint, so a stale point is never read back; it is only
left on disk. A second process (the reproduction notebooks, a re-run of ``all``) reuses the points
the first one simulated instead of simulating them again.

Points are JSON (one small file per point, written to a temporary name and renamed, so an
interrupted run never leaves a half-written point that a later run would read), each with the SHA-256 of
its content: a point edited or damaged on disk since is not read back but simulated again.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from functools import lru_cache
from pathlib import Path
from typing import Any

from traces.arguments import check_writable_dir

#: the packages whose files decide a simulated result
FINGERPRINTED_PACKAGES = ("twin", "policies", "traces", "calibration")
#: the environment variable naming the default cache directory
CACHE_ENV = "TWIN_REPRODUCE_CACHE"


@lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """SHA-256 over the path and bytes of every ``.py``/``.json`` file of :data:`FINGERPRINTED_PACKAGES`
    (read once per process: the code does not change under a running process)."""
    import importlib

    h = hashlib.sha256()
    for pkg in FINGERPRINTED_PACKAGES:
        root = Path(importlib.import_module(pkg).__file__).resolve().parent
        files = sorted(p for p in root.rglob("*") if p.suffix in (".py", ".json") and "__pycache__" not in p.parts)
        for p in files:
            h.update(f"{pkg}/{p.relative_to(root).as_posix()}\0".encode())
            h.update(p.read_bytes())
            h.update(b"\0")
    return h.hexdigest()


def _encode(value: Any) -> Any:
    """JSON-safe: non-finite floats as strings (JSON has no NaN), numpy scalars as Python numbers."""
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return {"__float__": repr(value)}
    return value


def _decode(value: Any) -> Any:
    if isinstance(value, dict) and set(value) == {"__float__"}:
        return float(value["__float__"])
    return value


def _digest(point: dict[str, Any]) -> str:
    """SHA-256 of a stored point's JSON (sorted keys): written with the point, checked when it is read back."""
    return hashlib.sha256(json.dumps(point, sort_keys=True).encode()).hexdigest()


class PointCache:
    """Points on disk under ``directory``, keyed by the point's definition and :func:`code_fingerprint`."""

    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = Path(directory)
        self.hits = 0
        self.misses = 0

    @classmethod
    def from_env(cls) -> "PointCache | None":
        """The cache named by ``$TWIN_REPRODUCE_CACHE``, or None when it is unset or empty."""
        d = os.environ.get(CACHE_ENV, "").strip()
        if not d:
            return None
        try:  # checked before any point is simulated (a path under a file failed at the first point's write)
            return cls(check_writable_dir(f"${CACHE_ENV}", d))
        except ValueError as e:
            msg = str(e).replace(f"${CACHE_ENV} {d}", f"${CACHE_ENV}={d}", 1)
            raise ValueError(f"{msg}; or unset ${CACHE_ENV}") from None

    def path(self, key: tuple) -> Path:
        digest = hashlib.sha256((code_fingerprint() + "\0" + repr(key)).encode()).hexdigest()
        return self.directory / digest[:2] / f"{digest}.json"

    def get(self, key: tuple) -> dict[str, Any] | None:
        """The stored point of ``key``, or None (never stored, or stored by other code)."""
        p = self.path(key)
        try:
            doc = json.loads(p.read_text())
        except (OSError, ValueError):
            self.misses += 1
            return None
        point = doc.get("point") if isinstance(doc, dict) else None
        if not isinstance(point, dict) or doc.get("key") != repr(key) or doc.get("sha256") != _digest(point):
            # a hash collision, a foreign file, or one edited or damaged since it was written (its content no
            # longer hashes to the digest stored with it): ignore it (the point is simulated again)
            self.misses += 1
            return None
        self.hits += 1
        return {k: _decode(v) for k, v in point.items()}

    def put(self, key: tuple, point: dict[str, Any]) -> None:
        """Store ``point`` (atomically: a temporary file renamed into place)."""
        p = self.path(key)
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_suffix(f".{os.getpid()}.tmp")
        body = {k: _encode(v) for k, v in point.items()}
        tmp.write_text(json.dumps({"key": repr(key), "sha256": _digest(body), "point": body}))
        os.replace(tmp, p)
