"""Assembling, validating and writing profile JSON files (with their provenance)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from traces.datadir import sha256_file
from twin.perf.profile import KINDS, PROFILE_SCHEMA, Profile




def provenance(directory: Path, files: Iterable[str], command: str, method: str, data_root: Path | None = None,
               extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Which measurements (with SHA-256 of each table, so a re-fit can check it read the same
    data), which command, and how the fit used them. Paths are given relative to the data root."""
    directory = Path(directory)
    root = data_root or directory
    try:
        rel = str(directory.resolve().relative_to(Path(root).resolve()))
    except ValueError:
        rel = directory.name
    out: dict[str, Any] = {
        "measurements": {"directory": rel, "tables": {f: sha256_file(directory / f) for f in sorted(files)
                                                        if (directory / f).exists()}},
        "command": command,
        "code": "calibration.fitting (LoRA Twin); scipy.optimize.curve_fit, trust-region reflective with bounds",
        "method": method,
    }
    if extra:
        out.update(extra)
    return out


def _clean(obj: Any) -> Any:
    """JSON-safe copy: drop private ``_`` keys, numpy scalars to Python, NaN/inf to None."""
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items() if not str(k).startswith("_")}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return [_clean(v) for v in obj.tolist()]
    if isinstance(obj, (np.floating, float)):
        v = float(obj)
        return v if math.isfinite(v) else None
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, np.bool_):
        return bool(obj)
    return obj


def build_profile(name: str, model: str, gpu: str, software: str, description: str, components: dict[str, Any],
                  provenance_: dict[str, Any], lora_targets: Iterable[str], comparison: dict[str, Any] | None = None,
                  notes: list[str] | None = None, version: int = 1) -> dict[str, Any]:
    missing = [k for k in KINDS if k not in components]
    if missing:
        raise ValueError(f"profile {name!r} lacks components {missing}")
    d = {"schema": PROFILE_SCHEMA, "name": name, "version": version, "model": model, "gpu": gpu,
         "software": software, "description": description, "lora_targets": list(lora_targets),
         "provenance": provenance_, "components": {k: components[k] for k in KINDS}}
    if comparison:
        d["comparison_with_published_twin"] = comparison
    if notes:
        d["notes"] = notes
    d = _clean(d)
    Profile.from_dict(d, f"fitted profile {name}")  # must load exactly as the engine will
    return d


def write_profile(d: dict[str, Any], out: str | Path) -> Path:
    """Write profile ``d`` to ``out`` after the checks :func:`twin.perf.profile.load_profile` makes of a file (so
    it writes nothing the loader would refuse), its text built first and renamed into place: a failure leaves
    the previous file whole (``twin calibrate fit`` writes over the shipped profile by default)."""
    out = Path(out)
    Profile.from_dict(d, str(out))._check_gpu_memory(str(out))
    try:
        text = json.dumps(d, indent=1, sort_keys=False, allow_nan=False) + "\n"
    except (TypeError, ValueError) as e:
        raise ValueError(f"profile {d.get('name')!r} cannot be written to {out}: {e} (a value JSON cannot hold: build "
                         f"it with build_profile, which cleans NaN and numpy values)") from None
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out
