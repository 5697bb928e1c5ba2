"""``twin configure dataset``: optimum labels from sweep results (one row per scenario)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

from twin.configurator.labels import label_scenarios
from twin.sweep.runner import read_results


def load_runs(sources: Iterable[str | os.PathLike]) -> pd.DataFrame:
    """Runs from sweep directories, shard files or CSV / Parquet tables."""

    frames = []
    for s in sources:
        p = Path(s)
        if p.is_dir() or p.suffix == ".parquet":
            frames.append(read_results(p))
        elif p.suffix == ".csv":
            frames.append(pd.read_csv(p))
        else:
            raise FileNotFoundError(f"{p}: not a sweep directory, .parquet or .csv")
    if not frames:
        raise ValueError("no sweep results given")
    return pd.concat(frames, ignore_index=True)


def sweep_meta(sources: Iterable[str | os.PathLike]) -> dict[str, Any]:
    """Provenance of the sweeps behind a dataset (grid names, digests, profile hashes)."""
    out = []
    for s in sources:
        p = Path(s) / "sweep.json"
        if p.exists():
            m = json.loads(p.read_text())
            out.append({"dir": str(s), "grid": m["grid"].get("name"), "digest": m.get("grid_digest"),
                        "profile": m["grid"].get("profile"), "profile_hash": m.get("profile_hash"),
                        "twin_version": m.get("twin_version"),
                        "served": m["grid"].get("served"), "slots": m["grid"].get("slots")})
    return {"sweeps": out}


def build_dataset(runs: pd.DataFrame, rule: str = "throughput90", **kw: Any) -> pd.DataFrame:
    """Label rows for every scenario of ``runs`` (see :mod:`twin.configurator.labels`).

    A scenario whose walk is incomplete (a task in flight) cannot be here: shards hold whole walks."""
    labels = label_scenarios(runs, rule, **kw)
    if "profile" in runs and "profile" not in labels:
        labels["profile"] = runs["profile"].iloc[0]
    return labels
