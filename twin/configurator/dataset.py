"""``twin configure dataset``: optimum labels from sweep results (one row per scenario)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

from twin.configurator.labels import label_scenarios
from twin.sweep.runner import read_results


#: the columns of a sweep's run rows that labelling reads (``twin sweep`` writes them)
RUN_COLUMNS = ("scenario", "served_adapters", "adapter_slots", "status", "offered_tok_s", "total_tok_s")


def load_runs(sources: Iterable[str | os.PathLike]) -> pd.DataFrame:
    """Runs from sweep directories, shard files or CSV / Parquet tables; a table without the run
    columns (:data:`RUN_COLUMNS`) is refused, naming what it lacks."""

    frames = []
    for s in sources:
        p = Path(s)
        if not p.exists():
            raise FileNotFoundError(f"{p}: no such sweep directory or run table; give the --out directory of "
                                    f"`twin sweep` (or its results as .parquet / .csv)")
        if p.is_dir() or p.suffix == ".parquet":
            f = read_results(p)
        elif p.suffix == ".csv":
            f = pd.read_csv(p)
        else:
            raise FileNotFoundError(f"{p}: not a sweep directory, .parquet or .csv")
        missing = [c for c in RUN_COLUMNS if c not in f.columns]
        if missing:
            raise ValueError(f"{p}: not a sweep's run table (missing columns {missing}); give the --out directory "
                             f"of `twin sweep` (labels for `twin configure train` are its own CSV)")
        frames.append(f)
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


def combine_labels(parts: list[tuple[str, pd.DataFrame]]) -> pd.DataFrame:
    """Label tables from several sources (``(source, labels)`` pairs: sweep directories labelled
    here, label files of ``configure dataset``) as one, so a model can be trained on a sample
    swept in several places (e.g. labels kept from an earlier sweep plus a new sweep of the
    scenarios it did not reach). Refused, naming the sources: labels under different rules or
    for different profiles, and a scenario labelled twice (the same scenario, policy, seed and
    maximum rank in two sources, or twice in one)."""
    if not parts:
        raise ValueError("no labels given")
    for col in ("rule", "profile"):
        seen: dict[str, list[str]] = {}
        for src, lab in parts:
            if col in lab:
                for v in pd.unique(lab[col].astype(str)):
                    seen.setdefault(v, []).append(src)
        if len(seen) > 1:
            what = "; ".join(f"{v} in {', '.join(s)}" for v, s in seen.items())
            fix = ("label every source with the same --rule" if col == "rule"
                   else "train one model per profile")
            raise ValueError(f"the labels mix {col}s ({what}): {fix}")
    lab = pd.concat([lab.assign(_source=src) for src, lab in parts], ignore_index=True)
    key = [c for c in ("scenario", "policy", "seed", "max_lora_rank") if c in lab]
    if "scenario" in key:
        dup = lab[lab.duplicated(key, keep=False)]
        if len(dup):
            first = dup.iloc[0]
            where = sorted(set(dup.loc[(dup[key] == first[key]).all(axis=1), "_source"]))
            raise ValueError(f"{dup[key].drop_duplicates().shape[0]} scenario(s) labelled more than once, e.g. "
                             f"{first['scenario']} in {', '.join(where)}: give each scenario's labels once "
                             f"(sweep the rest with `twin sweep --exclude` of the labelled scenarios)")
    return lab.drop(columns="_source")


def build_dataset(runs: pd.DataFrame, rule: str = "throughput90", **kw: Any) -> pd.DataFrame:
    """Label rows for every scenario of ``runs`` (see :mod:`twin.configurator.labels`).

    A scenario whose walk is incomplete (a task in flight) cannot be here: shards hold whole walks."""
    labels = label_scenarios(runs, rule, **kw)
    if "profile" in runs and "profile" not in labels:
        labels["profile"] = runs["profile"].iloc[0]
    return labels
