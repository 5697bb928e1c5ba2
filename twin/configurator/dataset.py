"""``twin configure dataset``: optimum labels from sweep results (one row per scenario)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

from traces.arguments import cell_error, csv_layout_problem, did_you_mean
from twin.configurator.labels import FEATURES, RULES, TARGETS, describe_engine, engines_of, label_scenarios
from twin.sweep.runner import ForeignShards, read_results


#: the columns of a sweep's run rows that labelling reads (``twin sweep`` writes them)
RUN_COLUMNS = ("scenario", "served_adapters", "adapter_slots", "status", "offered_tok_s", "total_tok_s")
#: the columns every run row of a sweep has, a run that did not start too (the others: a run's results)
RUN_KEY_COLUMNS = ("scenario", "served_adapters", "adapter_slots", "status")
#: the columns of a labels table (``twin configure dataset``) that training reads beside its features
LABEL_COLUMNS = ("scenario", *TARGETS)


def _read_error(p: Path, what: str, err: Exception) -> ValueError:
    first = (str(err).strip().splitlines() or [type(err).__name__])[0]
    return ValueError(f"{p}: cannot be read as {what} ({first}); give {_EXPECTED[what]}")


_EXPECTED = {
    "a sweep's runs": "the --out directory of `twin sweep` (or its results as .parquet / .csv)",
    "a labels table": "the labels written by `twin configure dataset --out labels.csv` (.csv or .parquet), or the "
                      "--out directory of `twin sweep`",
}


def read_table(path: str | os.PathLike, what: str = "a sweep's runs") -> pd.DataFrame:
    """A CSV (any name but ``*.parquet``) or Parquet file as a table; an empty, corrupt or binary file
    is a ``ValueError`` naming the file and ``what`` the command expects (not the parser's message alone)."""
    import pyarrow as pa

    p = Path(path)
    try:
        df = pd.read_parquet(p) if p.suffix == ".parquet" else pd.read_csv(p)
    except pd.errors.EmptyDataError:
        raise ValueError(f"{p}: the file is empty; give {_EXPECTED[what]}") from None
    except (ValueError, TypeError, NotImplementedError, pa.lib.ArrowException) as e:
        raise _read_error(p, what, e) from None
    problem = None if p.suffix == ".parquet" else csv_layout_problem(p)
    if problem:
        raise ValueError(f"{p}: {problem}")
    return df


def describe_statuses(runs: pd.DataFrame) -> str:
    """``3 runs (2 start_failure, 1 error); the first says: ...``"""
    counts = ", ".join(f"{n} {st}" for st, n in runs["status"].astype(str).value_counts().items())
    why = ""
    for col in ("startup_reason", "error"):
        if col in runs:
            v = runs[col].dropna().astype(str)
            v = v[~v.str.strip().isin(("", "nan", "None"))]
            if len(v):
                why = "; the first says: " + v.iloc[0].strip().splitlines()[0]
                break
    return f"{len(runs)} runs ({counts}){why}"


def _real_runs(f: pd.DataFrame) -> bool:
    """Whether ``f`` looks like a real-run table (the validation format) rather than a sweep's runs."""
    return bool({"offered_tok_s_est", "run_dir"} & set(f.columns))


def _not_runs(p: Path, f: pd.DataFrame, missing: list[str]) -> ValueError:
    """Why ``f`` (read from ``p``) is not a sweep's run table, naming what it looks like instead."""
    cols = set(f.columns)
    if set(TARGETS) <= cols and "status" not in cols:
        hint = ("it is a labels table (from `twin configure dataset`): give it to `twin configure train` as it is, "
                "or give `configure dataset` the sweep it came from")
    elif _real_runs(f):
        hint = ("it looks like a real-run table (the validation format): score configurators on it with "
                "`twin configure evaluate --real FILE`, or give `configure dataset` the --out directory of `twin sweep`")
    else:
        hint = "give the --out directory of `twin sweep` (or its results as .parquet / .csv)"
    return ValueError(f"{p}: not a sweep's run table (missing columns {missing}); {hint}")


def load_runs(sources: Iterable[str | os.PathLike]) -> pd.DataFrame:
    """Runs from sweep directories, shard files or CSV / Parquet tables. Refused, naming the source
    and the fix: a missing, empty or unreadable file, a table without the run columns
    (:data:`RUN_COLUMNS`; a labels or real-run table is named as such), and runs of which none
    started (nothing to label)."""
    import pyarrow as pa

    frames, names = [], []
    for s in sources:
        p = Path(s)
        if not p.exists():
            raise FileNotFoundError(f"{p}: no such sweep directory or run table; give the --out directory of "
                                    f"`twin sweep` (or its results as .parquet / .csv)")
        if p.is_dir():
            try:
                f = read_results(p)
            except (FileNotFoundError, ForeignShards):  # (their message names the file and the fix)
                raise
            except (ValueError, TypeError, NotImplementedError, pa.lib.ArrowException) as e:
                raise _read_error(p, "a sweep's runs", e) from None
        elif p.suffix in (".parquet", ".csv"):
            f = read_table(p, "a sweep's runs")
        else:
            raise FileNotFoundError(f"{p}: not a sweep directory, .parquet or .csv")
        missing = [c for c in RUN_KEY_COLUMNS if c not in f.columns]
        if not missing and f["status"].astype(str).eq("ok").any():  # runs that ran: their results too
            missing = [c for c in RUN_COLUMNS if c not in f.columns]
        if missing:  # (a run that did not start has no results: a sweep of such runs alone is refused below)
            raise _not_runs(p, f, missing)
        check_run_values(f, p)
        frames.append(f)
        names.append(str(p))
    if not frames:
        raise ValueError("no sweep results given")
    runs = pd.concat(frames, ignore_index=True)
    where = names[0] if len(names) == 1 else f"{len(names)} sources ({', '.join(names)})"
    if not len(runs):
        raise ValueError(f"{where}: no runs; nothing to label (give the --out directory of a `twin sweep` that ran)")
    if not runs["status"].astype(str).eq("ok").any():
        raise ValueError(f"{where}: no run of the sweep started or finished, so there is nothing to label: "
                         f"{describe_statuses(runs)}; fix what it names in the grid and sweep again")
    return runs


def check_run_values(f: pd.DataFrame, p: Path) -> None:
    """The run rows' configuration and results are numbers in range: served adapters and slots whole
    numbers >= 1 (every row), and on a run with status ok the offered tokens/s a finite number >= 0,
    the throughput >= 0 (empty for a run stopped early) and the features finite; otherwise an error
    naming the source, the row, the column and the value, before any labelling."""
    import numpy as np

    ok = f["status"].astype(str).eq("ok").to_numpy()
    for col in ("served_adapters", "adapter_slots", "offered_tok_s", "total_tok_s", *FEATURES):
        if col not in f.columns:
            continue
        x = pd.to_numeric(f[col], errors="coerce").to_numpy(float)
        text = np.isnan(x) & f[col].notna().to_numpy()  # a cell that is no number at all
        with np.errstate(invalid="ignore"):
            if col in ("served_adapters", "adapter_slots"):
                wrong, what = ~np.isfinite(x) | (x < 1) | (x != np.round(x)), "a whole number >= 1"
            elif col == "offered_tok_s":
                wrong, what = text | (ok & ~(np.isfinite(x) & (x >= 0))), "a number >= 0 (a run with status ok needs it)"
            elif col == "total_tok_s":
                wrong, what = text | (ok & (np.isinf(x) | (x < 0))), "a number >= 0 (or empty for a run stopped early)"
            else:
                wrong, what = text | (ok & ~np.isfinite(x)), "a finite number (a run with status ok needs it)"
        if wrong.any():
            raise cell_error(p, f, int(np.argmax(wrong)), col, f"is not {what}",
                             "fix the row or leave it out (`twin sweep` writes the runs)", csv_line=p.suffix == ".csv")


def load_labels(path: str | os.PathLike, features: Iterable[str] | None = None) -> pd.DataFrame:
    """A labels table of ``twin configure dataset`` (.csv, or .parquet) for training; refused, naming the
    file, what it lacks and the fix: an empty or unreadable file, a sweep's run table (label it first),
    a table without the label columns (:data:`LABEL_COLUMNS`) or the ``features`` (default: the
    published 8; ``policy`` is checked by training), and a table without rows."""
    p = Path(path)
    lab = read_table(p, "a labels table")
    feats = [f for f in (features or FEATURES) if f != "policy"]
    missing = [c for c in (*LABEL_COLUMNS, *feats) if c not in lab.columns]
    if missing:
        cols = set(lab.columns)
        if _real_runs(lab):
            raise ValueError(f"{p}: a real-run table (the validation format), not labels (missing columns {missing}); "
                             f"score configurators on it with `twin configure evaluate --real {p}`, and train on the "
                             f"labels of `twin configure dataset` (or the --out directory of `twin sweep`)")
        if set(RUN_KEY_COLUMNS) <= cols:
            raise ValueError(f"{p}: a sweep's run table, not labels (missing columns {missing}); label it first: "
                             f"`twin configure dataset {p} --out labels.csv`, then train on labels.csv (or give "
                             f"train the sweep's --out directory, which it labels under --rule)")
        if features is not None and all(c in cols for c in LABEL_COLUMNS):  # a labels table, a --features name not
            f = next(c for c in missing if c in feats)                     # one of its columns
            raise ValueError(f"--features: {p} has no column {f!r}{did_you_mean(f, lab.columns)} (a feature is a "
                             f"numeric column of the labels; the configurator computes {', '.join(FEATURES)}, "
                             f"mean_input_tokens, mean_output_tokens and policy)")
        raise ValueError(f"{p}: not a labels table (missing columns {missing}); `twin configure train` expects the "
                         f"labels written by `twin configure dataset --out labels.csv` (one row per scenario) or the "
                         f"--out directory of `twin sweep`")
    if not len(lab):
        raise ValueError(f"{p}: a labels table without rows; nothing to train on (label a sweep with "
                         f"`twin configure dataset`)")
    check_label_values(lab, p, feats)
    return lab


def check_label_values(lab: pd.DataFrame, p: Path, features: Iterable[str]) -> None:
    """Every label (:data:`TARGETS`) a number > 0 (the model fits their logarithms; served adapters and
    slots whole numbers) and every feature a finite number; otherwise an error naming the file, the row
    (its CSV line), the column and the value, before any training."""
    import numpy as np

    for col in (*TARGETS, *features):
        x = pd.to_numeric(lab[col], errors="coerce").to_numpy(float)
        with np.errstate(invalid="ignore"):
            wrong = ~np.isfinite(x)
            if col in TARGETS:
                wrong |= x <= 0
            if col in ("served_adapters", "adapter_slots"):
                wrong |= x != np.round(x)
        if wrong.any():
            what = ("a whole number >= 1" if col in ("served_adapters", "adapter_slots") else
                    "a number > 0" if col in TARGETS else "a finite number")
            raise cell_error(p, lab, int(np.argmax(wrong)), col, f"is not {what}",
                             "fix the row or leave it out (`twin configure dataset` writes the labels)")
    over = (pd.to_numeric(lab["adapter_slots"], errors="coerce") > pd.to_numeric(lab["served_adapters"],
                                                                                   errors="coerce")).to_numpy()
    if over.any():  # (a label no sweep can give: vLLM's slots beyond the adapters it serves)
        raise cell_error(p, lab, int(np.argmax(over)), "adapter_slots", "is more than the row's served_adapters",
                         "fix the row or leave it out (a sweep's configurations have slots <= served adapters)")
    if "rule" in lab.columns:
        unknown = ~lab["rule"].astype(str).isin(RULES).to_numpy()
        if unknown.any():  # (a misspelt rule was carried into the model's provenance)
            raise cell_error(p, lab, int(np.argmax(unknown)), "rule", f"is not a label rule ({', '.join(RULES)})",
                             "fix the row, or relabel with `twin configure dataset --rule`")


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


def trained_grid(lab: pd.DataFrame, sweeps: list[dict[str, Any]]) -> dict[str, list[int]]:
    """The configurations a model trained on ``lab`` snaps its predictions to: the served adapters and slots of the
    sweeps behind it (``sweeps``: :func:`~twin.configurator.dataset.sweep_meta`'s records) and every value the labels
    hold (a labels file's ``served_adapters``, ``next_served`` and ``adapter_slots``: the configurations its sweep
    ran), so a model trained on a sweep directory and one trained on the labels written from it agree (a labels
    file snapped to the published grid, 16 and up, whatever its sweep's grid)."""
    served = {int(v) for s in sweeps for v in (s.get("served") or [])}
    slots = {int(v) for s in sweeps for v in (s.get("slots") or [])}
    for col, into in (("served_adapters", served), ("next_served", served), ("adapter_slots", slots)):
        if col in lab:
            into.update(int(v) for v in pd.to_numeric(lab[col], errors="coerce").dropna())
    return {"served": sorted(served), "slots": sorted(slots)}


def combine_labels(parts: list[tuple[str, pd.DataFrame]]) -> pd.DataFrame:
    """Label tables from several sources (``(source, labels)`` pairs: sweep directories labelled
    here, label files of ``configure dataset``) as one, so a model can be trained on a sample
    swept in several places (e.g. labels kept from an earlier sweep plus a new sweep of the
    scenarios it did not reach). Refused, naming the sources: labels under different rules, for
    different profiles or of different engines (:func:`~twin.configurator.labels.engines_of`: the
    calibrated engine and one with the serving path's host time or a rank-tile cost are different
    twins), and a scenario labelled twice (the same scenario, policy, seed and maximum rank in two
    sources, or twice in one)."""
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
    engines: dict[str, list[str]] = {}
    for src, lab in parts:
        for e in engines_of(lab):
            engines.setdefault(describe_engine(e), []).append(src)
    if len(engines) > 1:
        what = "; ".join(f"{v} in {', '.join(s)}" for v, s in engines.items())
        raise ValueError(f"the labels mix engines ({what}): train one model per engine (sweep the rest of a sample "
                         f"with the grid of the labels you keep)")
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


def _one_engine(df: pd.DataFrame, what: str, fix: str) -> list[dict[str, Any]]:
    """:func:`~twin.configurator.labels.engines_of` of ``df`` (runs or labels), refused when there are several."""
    engines = engines_of(df)
    if len(engines) > 1:
        raise ValueError(f"the {what} mix engines ({'; '.join(map(describe_engine, engines))}): {fix}")
    return engines


def label_engine(lab: pd.DataFrame) -> dict[str, Any]:
    """The one engine of a labels table (:func:`combine_labels` refuses a mix), for a model's provenance:
    ``predict --check`` and ``evaluate`` run the twin a model was trained on with it."""
    engines = _one_engine(lab, "labels", "train one model per engine")
    if not engines:
        raise ValueError("a labels table without rows has no engine; label a sweep with `twin configure dataset`")
    return engines[0]


def build_dataset(runs: pd.DataFrame, rule: str = "throughput90", **kw: Any) -> pd.DataFrame:
    """Label rows for every scenario of ``runs`` (see :mod:`twin.configurator.labels`).

    A scenario whose walk is incomplete (a task in flight) cannot be here: shards hold whole walks.
    Runs of several engines (sweeps with and without the serving path's host time, say) are refused:
    one walk must not mix two twins."""
    _one_engine(runs, "runs", "label the sweeps of each engine apart (and train one model per engine)")
    if "profile" in runs:  # (a labels table of two profiles is refused by `train`: refused here first)
        counts = runs["profile"].dropna().astype(str).value_counts(sort=False)
        if len(counts) > 1:
            what = "; ".join(f"{p} in {n} runs" for p, n in counts.items())
            raise ValueError(f"the runs mix profiles ({what}): label the sweeps of each profile apart (and train one "
                             f"model per profile)")
    if "walk_ratio" in runs:  # (rows of sweeps before stop 65 do not say: not checked)
        walked = pd.to_numeric(runs["walk_ratio"], errors="coerce").dropna()
        ratio = float(kw.get("ratio", 0.9))
        if len(walked) and ratio < float(walked.max()) - 1e-12:
            raise ValueError(f"labels at --ratio {ratio:g} from a sweep that walked at ratio {walked.max():g}: each "
                             f"slot value's walk stopped at its first run below {walked.max():g} of the offered tokens, "
                             f"so the runs a walk at {ratio:g} would go on to are missing; label at --ratio "
                             f"{walked.max():g} or above, or sweep again with [early_stop] ratio = {ratio:g}")
    labels = label_scenarios(runs, rule, **kw)
    if "profile" in runs and "profile" not in labels:
        labels["profile"] = runs["profile"].iloc[0]
    return labels
