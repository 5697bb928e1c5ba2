"""The training domain of a configurator: where its recommendations interpolate and where they extrapolate.

A configurator is a regression model of the twin's optimum labels (issue 14): trees and rules
split the feature space only where training scenarios lie, so outside it a recommendation is the
nearest leaf's answer, not a prediction. The published training grid spans per-adapter rates of
0.003125-3.2 req/s in triples of distinct rates and ranks 8-32 (``adapter-twin-llama``); a
population at 100 req/s per adapter, of rank-512 adapters, or of a single rate class (a rate
std of 0, which no triple of distinct rates has) gets an answer that no run backs.

The domain is the box of the model's numeric features (the published 8, and the length mix and the
arrival process's burstiness where the model uses them) over its training scenarios:

* models trained by this version store it in their provenance (``provenance["domain"]``, from the
  training labels: :func:`feature_box`);
* for models saved before that, it is recomputed from the named sweep grid(s) their provenance
  records (every scenario of the grid, so the box of the grid rather than of the sampled subset
  of it the model saw: the same ranges for the shipped models, whose sampled scenarios reach every
  rate and rank of the grid).

``twin configure predict`` reports the features outside the box (``"domain"`` in ``--json``, and a
warning naming each feature, its value and the range) and points at ``--check`` / ``twin configure
search``, which run the twin instead of extrapolating. It does not refuse: the answer may still
be what an operator wants as a first guess.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd

from traces.arrivals import parse_arrival
from twin.configurator.features import ARRIVAL_FEATURE, LENGTH_FEATURES
from twin.configurator.labels import FEATURES, features_of
from twin.sweep.grid import NAMED_GRIDS

#: the numeric features a domain covers (policy indicators are checked by name instead)
NUMERIC = (*FEATURES, *LENGTH_FEATURES, ARRIVAL_FEATURE)
#: relative slack of the box's bounds (the features are means and stds of the same numbers)
_SLACK = 1e-9


def feature_box(rows: pd.DataFrame, features: Iterable[str]) -> dict[str, list[float]]:
    """``{feature: [min, max]}`` over ``rows`` for the numeric features among ``features``."""
    return {f: [float(rows[f].min()), float(rows[f].max())] for f in features if f in NUMERIC and f in rows}


def grid_box(grid_names: Iterable[str], features: Iterable[str]) -> dict[str, list[float]] | None:
    """The feature box over every scenario of the named grids (None if any is not a named grid)."""
    names = list(grid_names)
    if not names or any(n not in NAMED_GRIDS for n in names):
        return None
    rows = []
    for n in names:
        for sc in NAMED_GRIDS[n]().scenarios():
            x = features_of(sc["rates"], sc["ranks"])
            x.update(zip(LENGTH_FEATURES, sc["lengths"]))
            x[ARRIVAL_FEATURE] = parse_arrival(sc.get("arrival", "poisson")).cv
            rows.append(x)
    return feature_box(pd.DataFrame(rows), features)


def training_domain(model: dict[str, Any]) -> dict[str, Any] | None:
    """``{"features": {name: [lo, hi]}, "source": str}`` of a configurator model, or None when
    neither its provenance nor a named grid of its sweeps gives it."""
    prov = model.get("provenance") or {}
    stored = prov.get("domain")
    if stored:
        return {"features": {k: list(v) for k, v in stored.items()}, "source": "the training scenarios"}
    grids = [s.get("grid") for s in prov.get("sweeps") or [] if isinstance(s, dict)]
    box = grid_box(grids, model.get("features") or FEATURES)
    if box is None:
        return None
    return {"features": box, "source": "the sweep grid " + ", ".join(dict.fromkeys(grids))}


def outside(domain: dict[str, Any] | None, x: dict[str, float]) -> list[dict[str, float | str]]:
    """The features of ``x`` outside ``domain``'s box: ``[{"feature", "value", "lo", "hi"}, ...]``."""
    if not domain:
        return []
    out: list[dict[str, float | str]] = []
    for f, (lo, hi) in domain["features"].items():
        if f not in x:
            continue
        v = float(x[f])
        tol = _SLACK * max(abs(lo), abs(hi), 1.0)
        if not np.isfinite(v) or v < lo - tol or v > hi + tol:
            out.append({"feature": f, "value": v, "lo": float(lo), "hi": float(hi)})
    return out


def describe(entries: list[dict[str, Any]]) -> str:
    """``rate_max 100 > 3.2, rate_std 0 < 0.0051`` (one clause per feature outside the box)."""
    parts = []
    for e in entries:
        v, lo, hi = e["value"], e["lo"], e["hi"]
        parts.append(f"{e['feature']} {v:.4g} " + (f"< {lo:.4g}" if v < lo else f"> {hi:.4g}"))
    return ", ".join(parts)
