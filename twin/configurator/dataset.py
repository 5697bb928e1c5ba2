"""``twin configure dataset``: optimum labels from sweep results (one row per scenario)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

from traces.arguments import cell_error, csv_layout_problem, did_you_mean
from twin.configurator.labels import (FEATURES, GROUP_CANDIDATES, RULES, TARGETS, _group_keys, describe_engine, engines_of,
                                      label_scenarios)
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
    _check_unique_runs(runs, where)
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
    if {"served_adapters", "adapter_slots"} <= set(f.columns):  # (labelled "4 served / 100 slots")
        over = (pd.to_numeric(f["adapter_slots"], errors="coerce")
                > pd.to_numeric(f["served_adapters"], errors="coerce")).to_numpy()
        if over.any():
            raise cell_error(p, f, int(np.argmax(over)), "adapter_slots", "is more than the row's served_adapters",
                             "fix the row or leave it out (a sweep's configurations have slots <= served adapters: vLLM "
                             "has no slot for an adapter it does not serve)", csv_line=p.suffix == ".csv")
    if {"offered_tok_s", "total_tok_s"} <= set(f.columns):  # (offered 0 beside a throughput: a ratio of NaN)
        off = pd.to_numeric(f["offered_tok_s"], errors="coerce").to_numpy(float)
        tot = pd.to_numeric(f["total_tok_s"], errors="coerce").to_numpy(float)
        with np.errstate(invalid="ignore"):
            more = ok & np.isfinite(tot) & (tot > off * (1 + 1e-9) + 1e-9)
        if more.any():
            raise cell_error(p, f, int(np.argmax(more)), "total_tok_s",
                             f"is more than the row's offered_tok_s ({off[int(np.argmax(more))]:g}): a run serves at "
                             f"most the tokens of its own arrivals", "fix the row or leave it out (`twin sweep` writes "
                             "the runs)", csv_line=p.suffix == ".csv")


def _check_unique_runs(runs: pd.DataFrame, where: str) -> None:
    """Each configuration of a scenario (its scenario keys, served adapters and slots) is one run: a run given twice
    -- a row repeated in a table, or two sources holding the same runs -- was counted twice ("from 2 runs") and
    weighed twice in its walk; refused, naming the run and the fix."""
    keys = [*(c for c in GROUP_CANDIDATES if c in runs.columns), "served_adapters", "adapter_slots"]
    dup = runs.duplicated(subset=keys, keep="first").to_numpy()
    if dup.any():
        r = runs.iloc[int(dup.argmax())]
        raise ValueError(f"{where}: the run of scenario {r['scenario']} at {int(r['served_adapters'])} served adapters "
                         f"and {int(r['adapter_slots'])} slots is given twice (a repeated row, or sources that hold the "
                         f"same runs); a sweep runs each configuration once: leave the copy out, or give each sweep "
                         f"once")


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
    sweeps behind it (``sweeps``: :func:`~twin.configurator.dataset.sweep_meta`'s records), the sweep's configurations
    that labels written since carry (:data:`GRID_COLUMNS`) and every value the labels hold (``served_adapters``,
    ``next_served`` and ``adapter_slots``: configurations its sweep ran), so a model trained on a sweep directory and
    one trained on the labels written from it agree (a labels file snapped to the published grid, 16 and up,
    whatever its sweep's grid). Labels without :data:`GRID_COLUMNS` (the committed ones) give only their own values:
    a configuration of the sweep that no label or next run landed on (served 320 of the published grid in the Llama
    labels, slots above 160) is not among them, where the models trained before this function (the validated
    Llama and the Qwen ones) recorded the published grid."""
    served = {int(v) for s in sweeps for v in (s.get("served") or [])}
    slots = {int(v) for s in sweeps for v in (s.get("slots") or [])}
    for col, into in (("served_adapters", served), ("next_served", served), ("adapter_slots", slots)):
        if col in lab:
            into.update(int(v) for v in pd.to_numeric(lab[col], errors="coerce").dropna())
    for col, into in GRID_COLUMNS.items():  # (labels written since: the sweep's own configurations)
        if col in lab:
            into_set = served if into == "served" else slots
            for cell in lab[col].dropna():
                into_set.update(parse_grid_cell(cell, col))
    return {"served": sorted(served), "slots": sorted(slots)}


#: the label columns that carry the configurations of the sweep behind the labels (``configure dataset`` writes them:
#: every served-adapter count and slot count its runs tried, and its sweep.json grid), so a model trained on a labels
#: file snaps to the grid a model trained on the sweep directory snaps to (:func:`trained_grid`); labels without them
#: (written before) give the values their labels hold, which may miss a configuration no label landed on
GRID_COLUMNS = {"grid_served": "served", "grid_slots": "slots"}


def grid_cell(values: Iterable[Any]) -> str:
    """A :data:`GRID_COLUMNS` cell: the whole numbers, ascending, space-separated (``16 32 64``)."""
    return " ".join(str(v) for v in sorted({int(v) for v in values}))


def parse_grid_cell(cell: Any, col: str) -> list[int]:
    """A :data:`GRID_COLUMNS` cell as whole numbers >= 1; anything else is an error naming the column and the value."""
    try:
        vals = [float(t) for t in str(cell).split()]
    except ValueError:
        vals = []
    if not vals or not all(v >= 1 and v == int(v) for v in vals):
        raise ValueError(f"labels column {col} {cell!r}: expected the sweep's whole numbers >= 1, space-separated "
                         f"(e.g. '16 32 64'); fix the labels or relabel with `twin configure dataset`")
    return [int(v) for v in vals]


def with_grid(labels: pd.DataFrame, runs: pd.DataFrame, sweeps: list[dict[str, Any]] | None = None) -> pd.DataFrame:
    """``labels`` with :data:`GRID_COLUMNS`: every served-adapter count and slot count of ``runs`` (of any status: the
    configurations the sweep tried) and of the ``sweeps``' grids (:func:`sweep_meta`'s records)."""
    served = [v for s in sweeps or [] for v in (s.get("served") or [])]
    slots = [v for s in sweeps or [] for v in (s.get("slots") or [])]
    served += pd.to_numeric(runs["served_adapters"], errors="coerce").dropna().tolist()
    slots += pd.to_numeric(runs["adapter_slots"], errors="coerce").dropna().tolist()
    if not len(labels):
        return labels
    return labels.assign(grid_served=grid_cell(served), grid_slots=grid_cell(slots))


def combine_labels(parts: list[tuple[str, pd.DataFrame]]) -> pd.DataFrame:
    """Label tables from several sources (``(source, labels)`` pairs: sweep directories labelled
    here, label files of ``configure dataset``) as one, so a model can be trained on a sample
    swept in several places (e.g. labels kept from an earlier sweep plus a new sweep of the
    scenarios it did not reach). Refused, naming the sources: labels under different rules, for
    different profiles or of different engines (:func:`~twin.configurator.labels.engines_of`: the
    calibrated engine and one with the serving path's host time or a rank-tile cost are different
    twins), a source without a ``rule``, ``profile`` or ``policy`` column (or with blanks only there)
    beside sources with one (its rule, profile or policy is unknown: it matched any other, and a
    policy-less file merged with another policy's labels trained a one-policy model that recommended
    for the wrong policy), and a scenario labelled twice (the same scenario, policy, seed and maximum rank in two
    sources, or twice in one)."""
    if not parts:
        raise ValueError("no labels given")
    for col in ("rule", "profile", "policy"):  # (a source without the column matched any other, in silence)
        has = [src for src, lab in parts if col in lab and lab[col].notna().any()]
        lacks = [src for src, lab in parts if src not in has]
        if has and lacks:
            what = {"rule": "label rule", "profile": "profile", "policy": "scheduler/cache policy"}[col]
            raise ValueError(f"{', '.join(lacks)} {'has' if len(lacks) == 1 else 'have'} no {col} column (or only "
                             f"blanks there) while {', '.join(has)} {'has' if len(has) == 1 else 'have'} one: the "
                             f"{what} of those labels is unknown, so they cannot be checked against the others' nor "
                             f"merged with them; give labels written by `twin configure dataset` (which carry it), or "
                             f"add the {col} column with the {what} they were made with")
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


#: the starvation line of a sweep whose run rows record neither ``walk_ratio`` nor ``starving``: the published walk's
#: (``[early_stop] ratio``'s default, :attr:`twin.sweep.grid.GridSpec.ratio`)
PUBLISHED_WALK_RATIO = 0.9


def stopped_walk_runs(runs: pd.DataFrame, ratio: float) -> pd.DataFrame:
    """The runs of ``runs`` (a sweep's, without a ``walk_ratio`` column) that a walk at ``ratio`` would have gone
    on from, while the sweep's walk stopped there, so the runs it would have gone on to are missing.

    A sweep walks each slot value's served adapters upwards and stops after its first *starving* run (below its
    line, ``[early_stop] ratio``; the row's ``starving``, or, in a table without it, below the published
    :data:`PUBLISHED_WALK_RATIO`); a run it decided starving early (``early_stop``) has only an upper bound
    (``tok_s_upper``). Labels at ``ratio`` are those of the sweep's walks exactly when every such stop is below
    ``ratio`` too: a stopping run at or above ``ratio`` (or whose upper bound is) is returned, with its
    ``ratio_read`` (its share of the offered tokens, or the bound); one whose share is unknown (no bound, no
    throughput) only below the published line, the walk's line this assumes. A table whose walks go on after a
    starving run (``[early_stop] walk = false``) has every run of its walks: only its runs stopped early count."""
    ok = runs[runs["status"].astype(str).eq("ok")].copy()
    if not len(ok) or "offered_tok_s" not in ok:
        return ok.iloc[:0]
    off = pd.to_numeric(ok["offered_tok_s"], errors="coerce")
    tp = pd.to_numeric(ok["total_tok_s"], errors="coerce") if "total_tok_s" in ok else pd.Series(float("nan"),
                                                                                                 index=ok.index)
    early = ok["early_stop"].fillna(False).astype(bool) if "early_stop" in ok else pd.Series(False, index=ok.index)
    upper = pd.to_numeric(ok["tok_s_upper"], errors="coerce") if "tok_s_upper" in ok else pd.Series(
        float("nan"), index=ok.index)
    tok = tp.where(~early, upper)  # (a run stopped early: its bound)
    ok["ratio_read"] = tok / off
    if "starving" in ok and ok["starving"].notna().all():
        starving = ok["starving"].astype(bool) | early
    else:  # (no flag: the published walk's line, as the walk tests it, or a run stopped early)
        starving = ~(tok >= PUBLISHED_WALK_RATIO * off) | early
    ok["_starving"] = starving.to_numpy()
    # (the walk's own test; a stop whose share is unknown, an early stop without its bound or a run that lost its
    # throughput, passes only at or above the published line, the walk's when nothing else says)
    unknown = ~(tok.notna() & off.notna())
    ok["_below"] = ((tok < ratio * off) | (unknown & (ratio >= PUBLISHED_WALK_RATIO))).to_numpy()
    keys = [*_group_keys(ok), "adapter_slots"]
    ok = ok.sort_values([*keys, "served_adapters"], kind="stable")
    walk = ok.groupby(keys, sort=False, dropna=False)
    last = walk.cumcount(ascending=False).eq(0)  # the walk's last run that ran
    stops_walks = not (ok["_starving"] & ~last).any()  # (no run after a starving one in any walk)
    stop = (ok["_starving"] & last) if stops_walks else early.reindex(ok.index)
    # at or above the line, or unknown (NaN, e.g. an early stop without its bound): the lower walk would go on
    bad = ok.loc[stop & ~ok["_below"]].drop(columns=["_starving", "_below"])
    # (a walk stopped below the largest served value of the table first: one that provably lacks runs)
    top = pd.to_numeric(ok["served_adapters"], errors="coerce").max()
    return pd.concat([bad[bad["served_adapters"] < top], bad[~(bad["served_adapters"] < top)]])


def check_stopped_walks(runs: pd.DataFrame, ratio: float) -> None:
    """Refuse labels at ``ratio`` from runs whose walks stopped where a walk at ``ratio`` goes on
    (:func:`stopped_walk_runs`), naming how many, one of them, the ratio the table does support and the fix; a
    ``ratio`` at or above the sweep's line always passes (its walk stops no later than the sweep's did)."""
    bad = stopped_walk_runs(runs, ratio)
    if not len(bad):
        return
    first = bad.iloc[0]
    read = float(first["ratio_read"])
    stop = "stopped early, its throughput at most" if bool(first.get("early_stop")) else "read"
    at = f"{stop} {read:.3f} of the offered tokens" if read == read else "its share of the offered tokens unknown"
    tops = pd.to_numeric(bad["ratio_read"], errors="coerce")
    need = (f"{PUBLISHED_WALK_RATIO:g} (the published walk's line)" if tops.notna().all()
            and float(tops.max()) < PUBLISHED_WALK_RATIO else "the sweep's own [early_stop] ratio")
    raise ValueError(f"labels at --ratio {ratio:g}: {len(bad)} slot walk(s) of this sweep stopped at a run that a walk "
                     f"at {ratio:g} would pass (e.g. {first.get('scenario')}, {int(first['adapter_slots'])} slots: "
                     f"{int(first['served_adapters'])} served adapters {at}), because the sweep walked at a higher "
                     f"line (its rows predate the walk_ratio column; each slot value's walk stopped at its first "
                     f"starving run), so the runs a walk at {ratio:g} goes on to are missing and its labels would be "
                     f"wrong; label at --ratio {need} or above, or sweep again with [early_stop] ratio = {ratio:g}")


def build_dataset(runs: pd.DataFrame, rule: str = "throughput90", sweeps: list[dict[str, Any]] | None = None,
                  **kw: Any) -> pd.DataFrame:
    """Label rows for every scenario of ``runs`` (see :mod:`twin.configurator.labels`), each with the sweep's
    configurations (:data:`GRID_COLUMNS`: those of ``runs`` and of the ``sweeps``' grids, :func:`sweep_meta`).

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
    ratio = float(kw.get("ratio", 0.9))
    walk = (pd.to_numeric(runs["walk_ratio"], errors="coerce") if "walk_ratio" in runs
            else pd.Series(float("nan"), index=runs.index))
    walked = walk.dropna()
    if len(walked) and ratio < float(walked.max()) - 1e-12:
        raise ValueError(f"labels at --ratio {ratio:g} from a sweep that walked at ratio {walked.max():g}: each "
                         f"slot value's walk stopped at its first run below {walked.max():g} of the offered tokens, "
                         f"so the runs a walk at {ratio:g} would go on to are missing; label at --ratio "
                         f"{walked.max():g} or above, or sweep again with [early_stop] ratio = {ratio:g}")
    if walk.isna().any():  # (rows of sweeps before stop 65, the committed ones among them: their walks' stops say)
        check_stopped_walks(runs[walk.isna()], ratio)
    labels = label_scenarios(runs, rule, **kw)
    if "profile" in runs and "profile" not in labels:
        labels["profile"] = runs["profile"].iloc[0]
    return with_grid(labels, runs, sweeps)
