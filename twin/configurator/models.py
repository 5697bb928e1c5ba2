"""Configurator models: training (scikit-learn), a JSON format that predicts without scikit-learn,
plain rules of the <= 30-leaf tree, prediction with uncertainty.

Every model predicts the three targets of a label (:data:`twin.configurator.labels.TARGETS`) from
the scenario features. The trees are fitted on ``log`` targets (served adapters, slots and
throughput span two orders of magnitude and are scored by a relative error, SMAPE), multi-output,
so one tree recommends a whole configuration; a prediction is snapped to the sweep's grid
(nearest value in log scale, slots <= served).

Model file (``*.json``): ``{"schema", "kind", "features", "targets", "log_targets", "trees":
[{"left", "right", "feature", "threshold", "leaf_value", "leaf_n"}...] ("left" to "threshold" per
node, -1 / -2 at leaves; "leaf_value" and "leaf_n" per leaf in node order: a prediction and a rule
read only a leaf's value and scenario count; files written before these two keys carry per-node
"value" and "n", and load the same), "combine", "grid": {"served", "slots"},
"constant": {...}, "provenance": {...}}`` (``provenance``: the profile, rule, engine and sources of the
labels, with each labels file pinned as ``source_files``: ``{"path", "sha256", "bytes", "rows"}``, the
twin's version, the training domain and ``lengths_seen``, the range of each length-mix column of the
labels; models trained before have some of these only). ``combine`` is ``"mean"`` (the random forest, which
keeps every tree: the spread across trees is the uncertainty; CART, one tree, which also carries
``rules``, one per leaf) or ``"sum"`` (FIGS: Tan et al., "Fast Interpretable Greedy-Tree Sums",
imodels' ``FIGSRegressor``, a sum of small trees each fitted to the others' residuals; an optional
extra, ``pip install 'lora-twin[configurator]'``). Files without ``combine`` are means.

A split sends ``x`` left when ``x <= threshold`` in float64. For trees fitted by scikit-learn (the
forest, CART, the HS tree) the stored threshold is the one that takes scikit-learn's branches,
which compares float32 inputs (:func:`float32_split_threshold`); FIGS compares float64 itself.
Rules and rule paths print each threshold in full (the shortest decimal that reads back as it,
:func:`twin.configurator.features.threshold_text`), so the printed inequality is the model's for every
input: rounded to 6 digits, the stored 0.5999999940395354 read ``rate_max <= 0.6``, which the input
0.6 (sent right by the model) satisfied.

Features (:mod:`twin.configurator.features`): the published 8 by default; the request-length mix
(``mean_input_tokens``, ``mean_output_tokens``) and the policy may be added. The policy is one 0/1
indicator column per policy of the training labels (``policy=<name>`` among ``features``), with
``"policies": [...]`` in the file; a model of one policy without indicators records it as
``"policy"`` (absent: the published ``fcfs+client-cap``). :func:`predict` takes the policy by
name and refuses one the model cannot recommend for.

``hstree`` is the <= 30-leaf CART tree with hierarchical shrinkage (Agarwal et al., ICML 2022;
:mod:`twin.configurator.hstree`): the same rules as CART, leaf values pulled toward their ancestors'
where a split rests on few scenarios. imodels' own ``HSTreeRegressor`` and ``RuleFitRegressor`` take
one target only in imodels 3.0.4 (``fit`` rejects a 3-column ``y``), and a configurator predicts the
whole configuration (served, slots, throughput) from one model, so ``hstree`` applies the shrinkage to
scikit-learn's multi-output tree itself (no imodels needed).

``rulefit`` (Friedman and Popescu 2008; imodels' ``RuleFitRegressor``, one per target because it
takes one target only; :mod:`twin.configurator.rulefit`; the optional extra) is a rule ensemble, not
a tree: its file has ``"trees": []``, ``"combine": "rule_ensemble"`` and ``"rule_ensembles"``, one per
target in the order of ``targets``: ``{"target", "intercept", "linear": [{"feature", "coef", "clip":
[lo, hi], "std", "importance"}], "rules": [{"conditions": [{"feature", "op", "value"}], "coef",
"support", "importance"}]}``. A target's (log) prediction is ``intercept + sum of coef * min(max(x,
lo), hi)`` over the linear terms (``null`` = an open bound) ``+ sum of coef`` over the rules whose
conditions (``op`` one of ``<=``, ``<``, ``>``, ``>=``) all hold; ``importance`` is Friedman and
Popescu's (eq. 28-29), by which ``twin configure rules`` sorts the terms.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from traces.arguments import first_repeat
from twin.configurator.features import (ARRIVAL_FEATURE, FLOAT32_NOTE, LENGTH_FEATURES, THRESHOLD_NOTE,
                                        describe_condition, design_matrix, feature_label, is_policy_column,
                                        policy_columns, readable_conditions, simplify_policy_conditions, single_policy,
                                        threshold_text, training_columns)
from twin.configurator.domain import feature_box
from twin.configurator.labels import CALIBRATED_ENGINE, FEATURES, TARGETS, describe_engine
from twin.perf.profile import DEFAULT_FITTED
from twin.sweep.grid import PUBLISHED_GRID, check_policies
from twin.sweep.scenario import DEFAULT_LENGTHS
from twin.sweep.runner import MissingExtra

SCHEMA = "lora-twin-configurator/1"
MODEL_DIR = Path(__file__).resolve().parent / "models"
#: ``--rank-tile-cost profile``: the profile's own rank tiles, whatever engine a model was trained on
PROFILE_TILES = "profile"
#: ``twin configure``'s profile without ``--profile`` (predict, rules, search): the twin's default
#: (:data:`twin.perf.profile.DEFAULT_FITTED`), Llama-3.1-8B's adapter-check engine, whose configurators were
#: decided before their models were scored (results/configurator/README.md, "The adapter-check engine's sweep")
DEFAULT_PROFILE = DEFAULT_FITTED


def model_engine(model: dict[str, Any]) -> dict[str, Any]:
    """The twin's engine a model was trained on (``provenance["engine"]``, written by ``twin configure
    train`` from its labels: :func:`twin.configurator.dataset.label_engine`); models saved before
    that were all trained on the calibrated engine (:data:`~twin.configurator.labels.CALIBRATED_ENGINE`)."""
    e = (model.get("provenance") or {}).get("engine") or CALIBRATED_ENGINE
    cost = e.get("rank_tile_cost")
    return {"serving_us": float(e.get("serving_us") or 0.0), "rank_tile_cost": None if cost is None else float(cost)}


def resolve_engine(models: "list[dict[str, Any]]", serving_us: float | None = None,
                   rank_tile_cost: "float | str | None" = None) -> tuple[float, float | None]:
    """The twin's engine constants ``(serving_us, rank_tile_cost)`` for checking (and searching beside)
    ``models``: each given value as it is (``rank_tile_cost`` :data:`PROFILE_TILES`: the profile's own,
    None in the result), each one left at None from the engine the models were trained on
    (:func:`model_engine`), which must then be one engine for all of them."""
    if serving_us is None or rank_tile_cost is None:
        engines = {describe_engine(e): e for e in map(model_engine, models)}
        if len(engines) > 1:
            raise ValueError(f"the models were trained on different engines ({'; '.join(engines)}): give "
                             f"--serving-us and --rank-tile-cost for the twin's check, or --model one of them")
        e = next(iter(engines.values()), CALIBRATED_ENGINE)
        if serving_us is None:
            serving_us = e["serving_us"]
        if rank_tile_cost is None:
            rank_tile_cost = e["rank_tile_cost"]
    cost = None if rank_tile_cost is None or rank_tile_cost == PROFILE_TILES else float(rank_tile_cost)
    return float(serving_us), cost
KINDS = ("rf", "cart", "hstree", "figs", "rulefit")
#: kinds whose estimator comes from the optional ``configurator`` extra (imodels)
IMODELS_KINDS = ("figs", "rulefit")
IMODELS_EXTRA = "pip install 'lora-twin[configurator]'"
#: hierarchical shrinkage's lambda values tried by ``train`` (0 = the CART tree itself)
HS_LAMBDAS = (0.0, 0.1, 1.0, 10.0, 25.0, 50.0, 100.0)


def smape_pct(pred, true) -> float:
    """The published convention: ``100 * mean(|p - y| / (|p| + |y|))``, over the pairs where both are finite (a
    real run the measured grid does not know is NaN and left out: the evaluation's ``regret_known`` says how many
    remain; a model's prediction is never NaN, :func:`predict` refuses a damaged model first); NaN when none is."""
    p = np.asarray(pred, float)
    y = np.asarray(true, float)
    den = np.abs(p) + np.abs(y)
    t = np.where(den > 0, np.abs(p - y) / np.where(den > 0, den, 1), 0.0)
    t = t[np.isfinite(t)]
    return float(100 * t.mean()) if t.size else float("nan")


def snap(value: float, grid: list[int]) -> int:
    """Nearest grid value in log scale."""
    g = np.asarray(sorted(grid), float)
    if not np.isfinite(value) or value <= 0:
        return int(g[0])
    return int(g[np.argmin(np.abs(np.log(g) - math.log(value)))])


def snap_config(served: float, slots: float, served_grid: list[int], slot_grid: list[int]) -> tuple[int, int]:
    n = snap(served, served_grid)
    g = snap(slots, slot_grid)
    if g > n:
        g = max([x for x in slot_grid if x <= n] or [min(slot_grid)])
    return n, g


# --------------------------------------------------------------------------- tree export / evaluation
def float32_split_threshold(threshold: float) -> float:
    """The float64 threshold ``t'`` with ``x <= t'`` exactly when ``float32(x) <= threshold``, for
    every float64 ``x``.

    scikit-learn's trees compare the input cast to float32 (``sklearn.tree._tree.DTYPE``; the cast
    is in ``BaseDecisionTree._validate_X_predict``) with float64 thresholds, and its thresholds are
    midpoints of float32 feature values. A scenario feature that falls on a midpoint (e.g. a rate
    mean halfway between two training rate means) then takes the left branch in scikit-learn and
    the right one in a plain float64 comparison. ``t'`` is the largest float64 that rounds (to
    nearest, ties to even) to a float32 ``<= threshold``: just below the midpoint between that
    float32 and the next one, or the midpoint itself when the float32 below is even."""
    t = float(threshold)
    t32 = np.float32(t)
    if float(t32) > t:
        t32 = np.nextafter(t32, np.float32(-np.inf))
    above = np.nextafter(t32, np.float32(np.inf))
    if not np.isfinite(above):
        return math.inf
    mid = (float(t32) + float(above)) / 2.0  # exact in float64
    even = (int(np.asarray(t32).view(np.uint32)) & 1) == 0
    return mid if even else float(np.nextafter(mid, -np.inf))


def leaf_values(values: np.ndarray, left: list[int]) -> list[list[float] | None]:
    """Node values rounded to 6 decimals, kept at the leaves only (``None`` at a split): a
    prediction and a rule read a leaf's value, never a split's."""
    return [row if lc == -1 else None for row, lc in zip(np.round(values, 6).tolist(), left)]


def export_tree(est, values: np.ndarray | None = None) -> dict[str, Any]:
    """A fitted scikit-learn tree as JSON lists (``values``: node values other than the tree's own,
    e.g. hierarchical shrinkage's). Split thresholds are stored for a float64 comparison that
    takes the branches scikit-learn takes (:func:`float32_split_threshold`) for every finite input.
    scikit-learn's branch for a missing value (``tree_.missing_go_to_left``) is not stored: the trees are
    fitted on finite features only (``train`` checks the labels, :class:`~twin.configurator.hstree.
    HSTreeMultiRegressor` refuses NaN), and :func:`predict` refuses a non-finite feature."""
    t = est.tree_
    val = (t.value[:, :, 0] if t.value.ndim == 3 else t.value) if values is None else values
    left = t.children_left.tolist()
    return {"left": left, "right": t.children_right.tolist(), "feature": t.feature.tolist(),
            "threshold": [float(x) if lc == -1 else float32_split_threshold(x) for x, lc in zip(t.threshold, left)],
            "value": leaf_values(val, left), "n": t.n_node_samples.tolist()}


def export_figs_tree(root, n_outputs: int) -> dict[str, Any]:
    """One FIGS tree (imodels ``Node`` objects, leaves have no children) in the format of
    :func:`export_tree`: nodes numbered depth-first, leaf values = the tree's additive term."""
    left: list[int] = []
    right: list[int] = []
    feat: list[int] = []
    thr: list[float] = []
    val: list[list[float] | None] = []
    n: list[int] = []

    def add(node) -> int:
        i = len(left)
        is_leaf = node.left is None and node.right is None
        left.append(-1)
        right.append(-1)
        feat.append(-2 if is_leaf else int(node.feature))
        thr.append(-2.0 if is_leaf else float(node.threshold))
        v = np.zeros(n_outputs) if node.value is None else np.asarray(node.value, float).reshape(-1)
        val.append(np.round(v, 9).tolist() if is_leaf else None)  # a split's value is never read
        n.append(int(np.asarray(node.idxs).sum()) if node.idxs is not None else 0)
        if not is_leaf:
            if node.left is None or node.right is None:
                raise ValueError("a FIGS split node with one child cannot be exported")
            left[i] = add(node.left)
            right[i] = add(node.right)
        return i

    add(root)
    return {"left": left, "right": right, "feature": feat, "threshold": thr, "value": val, "n": n}


def tree_apply(tree: dict[str, Any], x: np.ndarray) -> tuple[np.ndarray, list[int]]:
    """The leaf value of one feature vector and the node path."""
    node = 0
    path = [0]
    left, right, feat, thr = tree["left"], tree["right"], tree["feature"], tree["threshold"]
    while left[node] != -1:
        node = left[node] if x[feat[node]] <= thr[node] else right[node]
        path.append(node)
    return np.asarray(tree["value"][node], float), path


def tree_rules(tree: dict[str, Any], features: list[str], targets: list[str], log_targets: bool) -> list[dict]:
    """One rule per leaf: its conditions (merged per feature into an interval) and prediction."""
    rules: list[dict] = []

    def rec(node: int, bounds: dict[str, list[float]]):
        if tree["left"][node] == -1:
            v = np.asarray(tree["value"][node], float)
            pred = np.exp(v) if log_targets else v
            conds = []
            for f, (lo, hi) in bounds.items():
                if lo > -math.inf:
                    conds.append({"feature": f, "op": ">", "value": lo})
                if hi < math.inf:
                    conds.append({"feature": f, "op": "<=", "value": hi})
            rules.append({"leaf": node, "conditions": conds, "samples": int(tree["n"][node]),
                          "predict": {t: float(p) for t, p in zip(targets, pred)}})
            return
        f = features[tree["feature"][node]]
        thr = float(tree["threshold"][node])
        lo, hi = bounds.get(f, [-math.inf, math.inf])
        b = dict(bounds)
        b[f] = [lo, min(hi, thr)]
        rec(tree["left"][node], b)
        b = dict(bounds)
        b[f] = [max(lo, thr), hi]
        rec(tree["right"][node], b)

    rec(0, {})
    return rules


def format_rules(model: dict[str, Any]) -> str:
    """The rules as text: ``IF ... THEN served ~ N, slots ~ G (throughput T tok/s) [k scenarios]``."""
    grid = model.get("grid") or {}
    lines = [f"# {model['kind']} configurator, profile {model['provenance'].get('profile')}, rule "
             f"{model['provenance'].get('rule')}, {len(model['rules'])} rules",
             f"# {THRESHOLD_NOTE}; {FLOAT32_NOTE}"]
    for i, r in enumerate(model["rules"], 1):
        conds = " AND ".join(readable_conditions(r["conditions"], model.get("policies"))) or "always"
        p = r["predict"]
        n, g = p.get("served_adapters", math.nan), p.get("adapter_slots", math.nan)
        if grid:
            n, g = snap_config(n, g, grid["served"], grid["slots"])
        lines.append(f"R{i:02d} IF {conds} THEN served {n}, slots {g} (throughput "
                     f"{p.get('throughput_tok_s', math.nan):.0f} tok/s) [{r['samples']} scenarios]")
    return "\n".join(lines)


def rules_predict(rules: list[dict], x: dict[str, float]) -> dict | None:
    """The rule whose conditions hold for ``x`` (rules of a tree partition the feature space)."""
    for r in rules:
        ok = True
        for c in r["conditions"]:
            v = x[c["feature"]]
            if (c["op"] == "<=" and not v <= c["value"]) or (c["op"] == ">" and not v > c["value"]):
                ok = False
                break
        if ok:
            return r
    return None


# --------------------------------------------------------------------------- rule ensembles (rulefit)
def condition_holds(cond: dict[str, Any], x: dict[str, float]) -> bool:
    """One ``{"feature", "op", "value"}`` condition of a rule at the feature dict ``x``."""
    v, t, op = float(x[cond["feature"]]), float(cond["value"]), cond["op"]
    if op == "<=":
        return v <= t
    if op == "<":
        return v < t
    if op == ">":
        return v > t
    if op == ">=":
        return v >= t
    raise ValueError(f"rule condition {cond}: unknown operator {op!r} (<=, <, >, >=)")


def format_condition(cond: dict[str, Any]) -> str:
    """``feature op value``, or on a policy indicator ``policy is X`` / ``policy is not X``."""
    return describe_condition(cond["feature"], cond["op"], cond["value"])


def ensemble_terms(ens: dict[str, Any], x: dict[str, float]) -> tuple[float, list[dict[str, Any]]]:
    """A rule ensemble's (log) prediction at ``x`` and its terms there: the intercept, every linear
    term (``coef * min(max(x, lo), hi)``) and every rule whose conditions all hold (``coef``)."""
    terms: list[dict[str, Any]] = [{"term": "intercept", "contribution": float(ens["intercept"])}]
    for lt in ens["linear"]:
        lo, hi = lt["clip"]
        v = float(x[lt["feature"]])
        v = v if lo is None or v >= lo else float(lo)
        v = v if hi is None or v <= hi else float(hi)
        terms.append({"term": "linear", "feature": lt["feature"], "value": v, "coef": lt["coef"],
                      "contribution": lt["coef"] * v})
    for i, r in enumerate(ens["rules"]):
        if all(condition_holds(c, x) for c in r["conditions"]):
            terms.append({"term": "rule", "rule": i + 1, "conditions": [format_condition(c) for c in r["conditions"]],
                          "contribution": float(r["coef"])})
    return float(sum(t["contribution"] for t in terms)), terms


def format_rule_ensembles(model: dict[str, Any]) -> str:
    """The terms of a ``rulefit`` model with non-zero coefficients, per target, by importance."""
    prov = model["provenance"]
    n_rules = sum(len(e["rules"]) for e in model["rule_ensembles"])
    n_lin = sum(len(e["linear"]) for e in model["rule_ensembles"])
    lines = [f"# {model['kind']} configurator, profile {prov.get('profile')}, rule {prov.get('rule')}, "
             f"{n_rules} rules and {n_lin} linear terms over {len(model['rule_ensembles'])} targets",
             f"# {THRESHOLD_NOTE}"]
    for ens in model["rule_ensembles"]:
        log = model.get("log_targets")
        lines.append(f"## {ens['target']} = {'exp(' if log else ''}{ens['intercept']:+.4f} + the terms below"
                     f"{')' if log else ''}  [{len(ens['rules'])} rules, {len(ens['linear'])} linear]")
        items = [(lt["importance"], f"linear: {lt['coef']:+.4g} * {feature_label(lt['feature'])}"
                  + (f" (clipped to [{lt['clip'][0]:.6g}, {lt['clip'][1]:.6g}])"
                     if None not in lt["clip"] else "")) for lt in ens["linear"]]
        items += [(r["importance"], f"R{i}: {r['coef']:+.4f} IF "
                   + " AND ".join(format_condition(c) for c in r["conditions"]) + f"  [support {r['support']:.2f}]")
                  for i, r in enumerate(ens["rules"], 1)]
        for k, (imp, text) in enumerate(sorted(items, key=lambda t: -t[0]), 1):
            lines.append(f"T{k:02d} importance {imp:.4f}: {text}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- save / load
def pack_tree(tree: dict[str, Any]) -> dict[str, Any]:
    """A tree as stored in a model file: the per-node lists (a leaf's threshold written as the integer
    -2, scikit-learn's ``TREE_UNDEFINED``), and the values and scenario counts of the leaves only
    (``leaf_value``, ``leaf_n``, in node order)."""
    if "leaf_value" in tree:
        return tree
    leaves = [i for i, lc in enumerate(tree["left"]) if lc == -1]
    return {"left": tree["left"], "right": tree["right"], "feature": tree["feature"],
            "threshold": [-2 if lc == -1 else t for t, lc in zip(tree["threshold"], tree["left"])],
            "leaf_value": [tree["value"][i] for i in leaves],
            "leaf_n": [tree["n"][i] for i in leaves]}


def unpack_tree(tree: dict[str, Any]) -> dict[str, Any]:
    """A packed tree (:func:`pack_tree`) in its in-memory form: per-node ``value`` and ``n`` (``None`` at splits).
    A tree with per-node lists (files written before ``leaf_value``) is returned as it is."""
    if "leaf_value" not in tree:
        return tree
    leaves = [i for i, lc in enumerate(tree["left"]) if lc == -1]
    if len(leaves) != len(tree["leaf_value"]) or len(leaves) != len(tree["leaf_n"]):
        raise ValueError(f"a tree with {len(leaves)} leaves stores {len(tree['leaf_value'])} leaf values and "
                         f"{len(tree['leaf_n'])} leaf counts; the model file is damaged: retrain it")
    value: list[Any] = [None] * len(tree["left"])
    n: list[Any] = [None] * len(tree["left"])
    for i, v, k in zip(leaves, tree["leaf_value"], tree["leaf_n"]):
        value[i], n[i] = v, k
    return {"left": tree["left"], "right": tree["right"], "feature": tree["feature"],
            "threshold": [float(t) for t in tree["threshold"]], "value": value, "n": n}


def save_model(model: dict[str, Any], path: str | os.PathLike) -> Path:
    """Write a model file (compact JSON; trees packed by :func:`pack_tree`), gzip-compressed when
    the name ends in ``.gz`` (a forest grows with its training scenarios: the shipped Llama forest
    is 1.9 MB of JSON, 0.4 MB compressed). The gzip header carries no time stamp, so the same model
    gives the same bytes."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    stored = {k: v for k, v in model.items() if k != "_path"}
    stored["trees"] = [pack_tree(t) for t in model.get("trees", [])]
    text = json.dumps(stored, separators=(",", ":"))
    if p.suffix == ".gz":
        p.write_bytes(gzip.compress(text.encode(), mtime=0))
    else:
        p.write_text(text)
    return p


def read_model_text(p: Path) -> str:
    """The JSON text of a model file (``.gz``: gzip-compressed)."""
    return gzip.decompress(p.read_bytes()).decode() if p.suffix == ".gz" else p.read_text()


def shipped_model_path(profile: str, kind: str = "rf") -> Path:
    """The shipped model file of ``profile`` and ``kind``: ``<profile>.<kind>.json``, or its
    compressed ``.json.gz`` where that is the one shipped."""
    p = MODEL_DIR / f"{profile}.{kind}.json"
    gz = p.with_name(p.name + ".gz")
    return gz if gz.exists() else p


def looks_like_path(name: str | os.PathLike) -> bool:
    """Whether a model argument names a file: a ``Path`` (any ``os.PathLike``), or a string with a directory
    separator or a ``.json`` / ``.gz`` suffix (``train --out`` writes no other); any other string is a profile
    name."""
    if not isinstance(name, str):
        return True
    return any(c in name for c in "/\\") or name.endswith((".json", ".gz"))


def load_model(path_or_profile: str | os.PathLike, kind: str = "rf", *, as_path: bool | None = None) -> dict[str, Any]:
    """A model file, or the shipped configurator of a profile name.

    ``as_path`` True (``--model FILE``) reads a file, False (``--profile NAME``) the shipped model of ``kind``
    (:func:`shipped_model_path`); None decides by :func:`looks_like_path`. A profile name never resolves to the
    current directory: a directory or a JSON file there named like a profile failed ("Is a directory") or was
    loaded in place of the shipped model, in silence."""
    path = looks_like_path(path_or_profile) if as_path is None else as_path
    if path:
        p = Path(path_or_profile)
        if not p.exists():  # (a model file that is not there: the kind and the shipped list are beside the point)
            raise FileNotFoundError(f"configurator model file {path_or_profile} does not exist; give the path "
                                    f"`twin configure train` wrote, or leave --model out for the profile's shipped one")
        if p.is_dir():
            raise ValueError(f"{p}: a directory, not a configurator model file; give the .json (or .json.gz) that "
                             f"`twin configure train --out` wrote, or leave --model out for the profile's shipped one")
    else:
        name = str(path_or_profile)
        p = shipped_model_path(name, kind) if name and not looks_like_path(name) else MODEL_DIR / "-"
        if not p.is_file():
            avail = sorted(x.name for x in MODEL_DIR.glob("*.json*")) if MODEL_DIR.exists() else []
            raise FileNotFoundError(f"no configurator model {name!r} ({kind}); shipped: {avail or 'none'}; train one "
                                    f"with `twin configure train` and give its file with --model")
    hint = "give a model file written by `twin configure train` (or --profile for a shipped one)"
    try:
        m = json.loads(read_model_text(p))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError, EOFError) as e:
        raise ValueError(f"{p}: not a configurator model (not valid JSON: {e}); {hint}") from None
    except OSError as e:
        raise ValueError(f"{p}: cannot read the configurator model ({e.strerror or e}); {hint}") from None
    if not isinstance(m, dict) or m.get("schema") != SCHEMA:
        schema = m.get("schema") if isinstance(m, dict) else None
        raise ValueError(f"{p}: not a configurator model (schema {schema!r}, expected {SCHEMA!r}); {hint}")
    _check_model_file(m, p, hint)
    m["trees"] = [unpack_tree(t) for t in m.get("trees", [])]
    m["_path"] = str(p)
    return m


def _check_model_file(m: dict[str, Any], p: Path, hint: str) -> None:
    """The keys and list shapes prediction reads, so a damaged or hand-edited file is refused with
    what is wrong instead of failing inside a prediction."""
    def bad(what: str) -> ValueError:
        return ValueError(f"{p}: damaged configurator model ({what}); {hint}")

    for k, typ in (("kind", str), ("features", list), ("targets", list), ("trees", list), ("provenance", dict)):
        if not isinstance(m.get(k), typ):
            raise bad(f"{k!r} missing or not a {typ.__name__}")
    if m["kind"] not in KINDS:
        raise bad(f"kind {m['kind']!r}, expected one of {', '.join(KINDS)}")
    if list(m["targets"]) != list(TARGETS):
        raise bad(f"targets {m['targets']}, expected {list(TARGETS)}")
    # a feature is a name: one the configurator computes, a policy indicator, or a numeric column of the training
    # labels that `predict --feature NAME=VALUE` gives (train accepts any); each once
    odd = [f for f in m["features"] if not (isinstance(f, str) and f.strip() and f == f.strip())]
    if odd:  # (read as "a rule without its conditions or prediction")
        raise bad(f"feature {odd[0]!r} is not a feature name (the configurator computes "
                  f"{', '.join((*FEATURES, *LENGTH_FEATURES, ARRIVAL_FEATURE))}, policy=NAME; any other is a "
                  f"numeric column of the training labels)")
    rep = first_repeat(m["features"])
    if rep >= 0:
        raise bad(f"feature {m['features'][rep]!r} listed twice; each feature is one column of the model's input")
    for key in ("policy",):
        if key in m and m[key] is not None and not isinstance(m[key], str):  # (5 was taken as a policy name)
            raise bad(f"{key} {m[key]!r}, expected the name of the policy the model was trained on")
    pols = m.get("policies")
    if pols is not None and not (isinstance(pols, list) and all(isinstance(x, str) for x in pols)):
        raise bad(f"policies {pols!r}, expected the list of the policy names the model was trained on")
    named = ([m["policy"]] if isinstance(m.get("policy"), str) else []) + list(pols or [])
    try:  # (a policy "bogus" predicted, printed "policy bogus", and failed only under --check)
        check_policies(named)
    except ValueError as e:
        raise bad(f"a policy it was trained on is not one the twin sweeps: {e}") from None
    eng = m["provenance"].get("engine")
    if eng is not None:  # (a rank_tile_cost of "x" failed under --check as "could not convert string to float: 'x'")
        num_ok = all(isinstance(eng.get(k), (int, float)) and not isinstance(eng.get(k), bool)
                     and math.isfinite(eng.get(k)) and eng.get(k) >= 0
                     for k in ("serving_us", "rank_tile_cost") if isinstance(eng, dict) and eng.get(k) is not None)
        if not isinstance(eng, dict) or not num_ok:
            raise bad(f"provenance engine {eng!r}, expected {{\"serving_us\": us >= 0, \"rank_tile_cost\": a "
                      f"number >= 0 or null}} (the twin's engine constants the labels were swept with)")
    seen = m["provenance"].get("lengths_seen")
    if seen is not None and not (isinstance(seen, dict) and set(seen) <= set(LENGTH_FEATURES) and all(
            isinstance(v, list) and len(v) == 2 and all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                        and math.isfinite(x) and x > 0 for x in v) and v[0] <= v[1]
            for v in seen.values())):  # (read as the published pool instead, in silence)
        raise bad(f"provenance lengths_seen {seen!r}, expected {{\"mean_input_tokens\": [lo, hi], "
                  f"\"mean_output_tokens\": [lo, hi]}} (the mean token ranges of the training labels)")
    if "profile" in m["provenance"] and not isinstance(m["provenance"]["profile"], str):
        raise bad(f"provenance profile {m['provenance']['profile']!r}, expected a profile name")
    n_feat = len(m["features"])
    for i, t in enumerate(m["trees"]):
        leaf_keys = ("leaf_value", "leaf_n") if isinstance(t, dict) and "leaf_value" in t else ("value", "n")
        keys = ("left", "right", "feature", "threshold") + leaf_keys
        if not isinstance(t, dict) or not all(isinstance(t.get(k), list) for k in keys):
            raise bad(f"tree {i} lacks one of {list(keys)}")
        n = len(t["left"])
        if n == 0 or any(len(t[k]) != n for k in keys[:4]):
            raise bad(f"tree {i}: node lists of different lengths")
        # a split's children come after it (scikit-learn's and FIGS' numbering), so every walk
        # ends at a leaf; a leaf has no children
        for j, (lc, rc, f) in enumerate(zip(t["left"], t["right"], t["feature"])):
            if not all(isinstance(v, int) and not isinstance(v, bool) for v in (lc, rc, f)):
                raise bad(f"tree {i}, node {j}: a child or feature index that is not an integer")
            if lc == -1:
                if rc != -1:
                    raise bad(f"tree {i}, node {j}: a leaf (left -1) with a right child")
            elif not (j < lc < n and j < rc < n and 0 <= f < n_feat):
                raise bad(f"tree {i}, node {j}: a child or feature index out of range (children must follow "
                          f"their split)")
        if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in t["threshold"]):
            raise bad(f"tree {i}: a threshold that is not a number")
        leaf_vals = t["leaf_value"] if "leaf_value" in t else [v for v, lc in zip(t["value"], t["left"]) if lc == -1]
        k = len(TARGETS)
        if not all(isinstance(v, list) and len(v) == k and all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                                for x in v) for v in leaf_vals):
            raise bad(f"tree {i}: a leaf value that is not {k} numbers (one per target)")
        if not all(math.isfinite(x) and abs(x) < 1e12 for v in leaf_vals for x in v):  # ("serve nan adapters", exit 0)
            raise bad(f"tree {i}: a leaf value that is not a finite number of a sensible size (NaN, inf or beyond "
                      f"1e12)")
    if m.get("combine") == "rule_ensemble" and len(m.get("rule_ensembles") or []) != len(TARGETS):
        raise bad(f"a rule ensemble per target expected ({len(TARGETS)})")
    num = (int, float)

    def conditions_ok(conds: Any) -> bool:
        return isinstance(conds, list) and all(
            isinstance(c, dict) and c.get("feature") in m["features"] and c.get("op") in ("<=", "<", ">", ">=")
            and isinstance(c.get("value"), num) for c in conds)

    for e in m.get("rule_ensembles") or []:
        ok = isinstance(e, dict) and isinstance(e.get("intercept"), num) and isinstance(e.get("linear"), list) \
            and isinstance(e.get("rules"), list)
        ok = ok and all(isinstance(lt, dict) and lt.get("feature") in m["features"] and isinstance(lt.get("coef"), num)
                        and isinstance(lt.get("clip"), list) and len(lt["clip"]) == 2 for lt in e["linear"])
        ok = ok and all(isinstance(r, dict) and isinstance(r.get("coef"), num) and conditions_ok(r.get("conditions"))
                        for r in e["rules"])
        if not ok:
            raise bad("a rule ensemble without its intercept, linear terms or rules in the documented form")
    if not isinstance(m.get("rules") or [], list):  # (a TypeError traceback in predict, rules and evaluate)
        raise bad(f"rules {m['rules']!r}, expected a list of rules (each its conditions and prediction)")
    for r in m.get("rules") or []:
        if not (isinstance(r, dict) and conditions_ok(r.get("conditions")) and isinstance(r.get("predict"), dict)):
            raise bad("a rule without its conditions or prediction")

    if not m["trees"] and m.get("combine") != "rule_ensemble":
        raise bad("no trees")
    if m.get("combine", "mean") not in ("mean", "sum", "rule_ensemble"):
        raise bad(f"combine {m['combine']!r}, expected mean (a forest), sum (FIGS) or rule_ensemble (RuleFit)")
    if not isinstance(m.get("log_targets", False), bool):
        raise bad(f"log_targets {m['log_targets']!r}, expected true or false")
    grid = m.get("grid")
    if grid:  # the configurations a prediction snaps to (absent or {}: the published grid)
        if not isinstance(grid, dict):
            raise bad(f"grid {grid!r}, expected {{\"served\": [...], \"slots\": [...]}}")
        for key in ("served", "slots"):
            vals = grid.get(key)
            if not (isinstance(vals, list) and vals and all(isinstance(v, int) and not isinstance(v, bool) and v >= 1
                                                             for v in vals)):
                raise bad(f"grid {key} {vals!r}, expected a non-empty list of whole numbers >= 1 (the "
                          f"{'served-adapter counts' if key == 'served' else 'slot counts'} a prediction snaps to)")


# --------------------------------------------------------------------------- prediction
def predict(model: dict[str, Any], x: dict[str, float], explain: bool = False,
            policy: str | None = None) -> dict[str, Any]:
    """Recommendation for one feature dict: raw and snapped served / slots, throughput, uncertainty
    (spread across the forest's trees: 10th-90th percentile), and with ``explain`` the rule path (a
    ``rulefit`` model: the terms that add up to each target, :func:`_predict_rule_ensembles`).

    ``policy`` names the scheduler / cache policy (default: the published ``fcfs+client-cap``); a
    model with policy features sets its indicator columns from it, and an unknown policy (or, for a
    model without policy features, any other than the one it was trained on) is an error naming
    the known ones (:func:`twin.configurator.features.policy_columns`). ``policy`` is in the result."""
    pol, indicators = policy_columns(model, policy)
    res = _predict(model, {**x, **indicators}, explain)
    res["policy"] = pol
    return res


def _predict(model: dict[str, Any], x: dict[str, float], explain: bool) -> dict[str, Any]:
    feats = model["features"]
    missing = [f for f in feats if f not in x]
    if missing:
        raise ValueError(f"the model needs features {missing} (it was trained on {feats})")
    xv = np.asarray([float(x[f]) for f in feats], float)
    bad = [f for f, v in zip(feats, xv) if not math.isfinite(v)]
    if bad:  # (a tree walk sent NaN right at every split, where scikit-learn has a missing-value branch per split)
        raise ValueError(f"feature {bad[0]} is {x[bad[0]]!r}: a configurator predicts from finite numbers only; give "
                         f"the scenario's value")
    targets = model["targets"]
    if model.get("rule_ensembles"):
        return _predict_rule_ensembles(model, x, explain)
    outs, paths = [], []
    for tree in model["trees"]:
        v, path = tree_apply(tree, xv)
        outs.append(v)
        paths.append(path)
    V = np.asarray(outs)
    additive = model.get("combine", "mean") == "sum"
    mean = V.sum(axis=0) if additive else V.mean(axis=0)
    if model.get("log_targets"):
        _check_log_prediction(model, dict(zip(targets, mean.tolist())))
    pred = np.exp(mean) if model.get("log_targets") else mean
    per_tree = np.exp(np.minimum(V, _LOG_MAX)) if model.get("log_targets") else V
    res = _recommendation(model, {t: float(p) for t, p in zip(targets, pred)})
    if len(model["trees"]) > 1 and not additive:  # a sum's terms are not alternatives: no spread
        lo, hi = np.percentile(per_tree, [10, 90], axis=0)
        res["uncertainty"] = {t: {"p10": float(a), "p90": float(b)} for t, a, b in zip(targets, lo, hi)}
        res["uncertainty"]["trees"] = len(model["trees"])
    if explain:
        if model.get("rules"):
            r = rules_predict(model["rules"], x)
            res["rule_path"] = readable_conditions(r["conditions"], model.get("policies")) if r else []
        else:
            by_tree = []
            for k in range(len(model["trees"]) if additive else 1):
                tree = model["trees"][k]
                by_tree.append(simplify_policy_conditions(merge_bounds(
                    [(feats[tree["feature"][a]], "<=" if b == tree["left"][a] else ">", tree["threshold"][a])
                     for a, b in zip(paths[k][:-1], paths[k][1:])]), model.get("policies")))
            res["rule_path"] = by_tree[0]
            if len(model["trees"]) > 1 and not additive:  # what the whole forest's paths split on
                res["path_features"] = path_feature_shares(model["trees"], paths, feats)
            if additive:  # one path per tree; their leaf values add up to the prediction
                res["rule_path"] = [c for k, steps in enumerate(by_tree) for c in [f"[tree {k + 1}]"] + steps]
                res["rule_path_by_tree"] = by_tree
            res["rule_path_note"] = ("paths through every tree of the sum" if additive
                                     else "path through the forest's first tree")
    return res


def merge_bounds(conditions: list[tuple[str, str, float]]) -> list[str]:
    """A tree path's conditions ``(feature, op, threshold)`` as text, one per feature: the tightest
    lower (``>``) and upper (``<=``) bounds the path puts on it (``rate_mean > 0.05625 AND rate_mean >
    0.1375`` reads ``rate_mean > 0.1375``; both bounds read ``0.1375 < rate_mean <= 0.2266``), in the order
    the features first appear; policy indicators as :func:`describe_condition` words them."""
    lo: dict[str, float] = {}
    hi: dict[str, float] = {}
    order: list[str] = []
    for f, op, v in conditions:
        if f not in order:
            order.append(f)
        if op == ">":
            lo[f] = max(lo.get(f, -math.inf), float(v))
        else:
            hi[f] = min(hi.get(f, math.inf), float(v))
    out = []
    for f in order:
        if is_policy_column(f) or f not in lo or f not in hi:
            out += [describe_condition(f, ">", lo[f])] if f in lo else []
            out += [describe_condition(f, "<=", hi[f])] if f in hi else []
        else:
            out.append(f"{threshold_text(lo[f])} < {f} <= {threshold_text(hi[f])}")
    return out


def path_feature_shares(trees: list[dict[str, Any]], paths: list[list[int]], feats: list[str],
                        top: int = 5) -> dict[str, float]:
    """The share of the splits on every tree's path that test each feature (the ``top`` largest),
    a summary of what the whole forest looked at for this scenario (one tree's path is 1/T of it)."""
    counts: dict[str, int] = {}
    for tree, path in zip(trees, paths):
        for a in path[:-1]:
            f = feats[tree["feature"][a]]
            counts[f] = counts.get(f, 0) + 1
    n = sum(counts.values()) or 1
    return {f: round(c / n, 3) for f, c in sorted(counts.items(), key=lambda kv: -kv[1])[:top]}


#: the largest log-space prediction a model may make (a target of 1e12: beyond any served adapters, slots or tok/s)
_LOG_MAX = math.log(1e12)


def _check_log_prediction(model: dict[str, Any], logs: dict[str, float]) -> None:
    """A damaged model (a leaf or a rule term of 1000 in log space) overflowed ``exp`` into a recommendation of
    ``inf`` served adapters with numpy's warning: refused, naming the model file and the target."""
    for t, v in logs.items():
        if not (math.isfinite(v) and v < _LOG_MAX):
            raise ValueError(f"{model.get('_path', 'the model')}: predicts {t} of exp({v:.4g}), beyond 1e12 (a damaged "
                             f"model file: retrain it with `twin configure train`)")


def _recommendation(model: dict[str, Any], raw: dict[str, float]) -> dict[str, Any]:
    """The raw targets and served / slots snapped to the model's grid (slots <= served)."""
    res: dict[str, Any] = {"model": model.get("kind"), "profile": model["provenance"].get("profile"),
                           "rule": model["provenance"].get("rule")}
    grid = model.get("grid") or {}  # (a model trained without one: the published grid, as `configure predict --check`)
    n, g = snap_config(raw["served_adapters"], raw["adapter_slots"], grid.get("served") or list(PUBLISHED_GRID),
                       grid.get("slots") or list(PUBLISHED_GRID))
    res.update(served_adapters=n, adapter_slots=g, throughput_tok_s=raw["throughput_tok_s"],
               served_adapters_raw=raw["served_adapters"], adapter_slots_raw=raw["adapter_slots"])
    return res


def _predict_rule_ensembles(model: dict[str, Any], x: dict[str, float], explain: bool) -> dict[str, Any]:
    """:func:`predict` for a ``rulefit`` model: one rule ensemble per target; ``explain`` adds each
    target's terms at ``x`` (``terms``: intercept, linear terms, the rules that hold) and, as
    ``rule_path``, the rules that hold with their contributions."""
    log = bool(model.get("log_targets"))
    raw, terms = {}, {}
    for t, ens in zip(model["targets"], model["rule_ensembles"]):
        if ens["target"] != t:
            raise ValueError(f"{model.get('_path', 'model')}: rule ensemble for {ens['target']!r} where "
                             f"{t!r} is expected (targets {model['targets']})")
        total, tt = ensemble_terms(ens, x)
        if log:
            _check_log_prediction(model, {t: total})
        raw[t] = math.exp(total) if log else total
        terms[t] = {"log_prediction" if log else "prediction": total, "terms": tt}
    res = _recommendation(model, raw)
    if explain:
        res["terms"] = terms
        res["rule_path"] = [f"[{t}] " + (" AND ".join(term["conditions"]) or "always")
                            + f" ({term['contribution']:+.4f})"
                            for t, v in terms.items() for term in v["terms"] if term["term"] == "rule"]
        res["rule_path_note"] = ("rules that hold, per target, with their additive contribution to the "
                                 + ("log " if log else "") + "prediction")
    return res


# --------------------------------------------------------------------------- training
def _smape_scorer(log_targets: bool, cols: tuple[int, ...] = (0, 1)):
    from sklearn.metrics import make_scorer

    def score(y_true, y_pred):
        yt = np.exp(y_true) if log_targets else y_true
        yp = np.exp(y_pred) if log_targets else y_pred
        return -float(np.mean([smape_pct(yp[:, c], yt[:, c]) for c in cols]))

    return make_scorer(score)


def _imodels(kind: str):
    """imodels, or an error naming the extra that installs it."""
    try:
        import imodels
    except ImportError as e:
        raise MissingExtra(f"model kind {kind!r} needs imodels ({e}): {IMODELS_EXTRA}") from None
    return imodels


def _estimator(kind: str, seed: int):
    if kind == "rf":
        from sklearn.ensemble import RandomForestRegressor

        return RandomForestRegressor(random_state=seed, n_jobs=1), {
            "n_estimators": [50], "max_depth": [None, 8], "min_samples_leaf": [1, 2, 4], "max_features": [1.0, 0.6]}
    if kind == "cart":
        from sklearn.tree import DecisionTreeRegressor

        return DecisionTreeRegressor(random_state=seed), {
            "max_leaf_nodes": [8, 12, 16, 20, 24, 30], "min_samples_leaf": [1, 2, 4]}
    if kind == "hstree":
        from twin.configurator.hstree import HSTreeMultiRegressor

        # lambda grid of the HS paper's experiments (Agarwal et al. 2022, sec. 4)
        # the tree's structure is searched as CART's (lambda 0), then lambda by a full grid search
        # over the HS paper's values (Agarwal et al. 2022, sec. 4) on that structure: halving
        # small resources first favours heavy shrinkage and eliminates the right trees early
        return HSTreeMultiRegressor(random_state=seed, reg_param=0.0), {
            "max_leaf_nodes": [8, 12, 16, 20, 24, 30], "min_samples_leaf": [1, 2, 4]}
    if kind == "figs":
        # at most 30 splits in all, like the <= 30-rule tree
        return _imodels(kind).FIGSRegressor(random_state=seed), {
            "max_rules": [10, 20, 30], "max_trees": [None, 2]}
    if kind == "rulefit":
        _imodels(kind)  # the extra's error before any work
        from twin.configurator.rulefit import RuleFitMultiRegressor

        # terms per target (rules + linear) and the mean leaves of the rule-generating trees
        return RuleFitMultiRegressor(random_state=seed), {"max_rules": [10, 20, 30], "tree_size": [4, 8]}
    raise ValueError(f"unknown model kind {kind!r}; choose from {', '.join(KINDS)}")


def _jsonable(v: Any) -> Any:
    if isinstance(v, np.generic):
        return v.item()
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return repr(v)


def train(labels: pd.DataFrame, kind: str = "rf", features: list[str] | None = None, seed: int = 0,
          cv: int = 5, search: bool = True, provenance: dict[str, Any] | None = None,
          grid: dict[str, list[int]] | None = None, params: dict[str, Any] | None = None) -> dict[str, Any]:
    """Fit a model on label rows (from :func:`twin.configurator.dataset.build_dataset`), tuned by a
    ``cv``-fold halving grid search scored by SMAPE (served and slots) when ``search``. ``params``
    sets estimator hyper-parameters outside the searched grid (e.g. RuleFit's ``n_estimators``).

    ``features`` defaults to the published 8; ``policy`` among them (or labels of more than one
    policy) adds one indicator column per policy (:mod:`twin.configurator.features`), stored with
    the list of policies as ``"policies"``; labels of one policy without indicators store it as
    ``"policy"``."""
    if kind not in KINDS:
        raise ValueError(f"unknown model kind {kind!r}; choose from {', '.join(KINDS)}")
    feats, policies = training_columns(labels, features)
    X = design_matrix(labels, feats)
    bad = [f for f, ok in zip(feats, np.isfinite(X).all(axis=0)) if not ok]
    if bad:  # (scikit-learn's trees learn missing-value branches from NaN, which the JSON trees do not store)
        raise ValueError(f"the labels' feature {bad[0]} is not a finite number in every row; fix or leave out those "
                         f"rows (`twin configure dataset` writes finite features)")
    Y = np.log(labels[list(TARGETS)].to_numpy(float))
    est, grid_params = _estimator(kind, seed)
    if params:
        clash = sorted(set(params) & set(grid_params)) if search else []
        if clash:
            raise ValueError(f"params {clash} are searched by the grid search; drop them or train with search=False")
        est.set_params(**params)
    info: dict[str, Any] = {}
    t0 = time.perf_counter()
    # the halving search's first round fits 2 scenarios per fold ("min_resources_" = 2 x folds): at most
    # half as many folds as scenarios (8 scenarios and 5 folds used to fail inside scikit-learn)
    n_cv = min(cv, len(labels) // 2)
    if search and n_cv >= 2 and len(labels) >= 6:
        from sklearn.experimental import enable_halving_search_cv  # noqa: F401
        from sklearn.model_selection import HalvingGridSearchCV, KFold

        gs = HalvingGridSearchCV(est, grid_params, cv=KFold(n_cv, shuffle=True, random_state=seed),
                                 scoring=_smape_scorer(True), random_state=seed, min_resources="exhaust", factor=2,
                                 n_jobs=1)
        gs.fit(X, Y)
        est = gs.best_estimator_
        best, score = dict(gs.best_params_), gs.best_score_
        if kind == "hstree":
            from sklearn.model_selection import GridSearchCV

            gl = GridSearchCV(est, {"reg_param": list(HS_LAMBDAS)}, cv=KFold(n_cv, shuffle=True, random_state=seed),
                              scoring=_smape_scorer(True), n_jobs=1)
            gl.fit(X, Y)
            est, score = gl.best_estimator_, gl.best_score_
            best.update(gl.best_params_)
        info = {"best_params": {k: _jsonable(v) for k, v in best.items()},
                "cv_smape_served_slots_mean": -float(score), "cv_folds": n_cv}
    else:
        est.fit(X, Y)
    if kind == "rf":
        trees = [export_tree(e) for e in est.estimators_]
    elif kind == "figs":
        trees = [export_figs_tree(t, Y.shape[1]) for t in est.trees_]
    elif kind == "hstree":
        trees = [export_tree(est.estimator_, values=np.asarray(est.node_values_))]
    elif kind == "rulefit":
        trees = []
    else:
        trees = [export_tree(est)]
    y_lab = labels[list(TARGETS)]
    import sklearn

    model: dict[str, Any] = {
        "schema": SCHEMA, "kind": kind, "features": feats, "targets": list(TARGETS), "log_targets": True,
        "trees": trees, "combine": {"figs": "sum", "rulefit": "rule_ensemble"}.get(kind, "mean"), "grid": grid or {},
        "constant": {t: float(np.exp(np.log(y_lab[t].astype(float)).median())) for t in TARGETS},
        "provenance": {**(provenance or {}), "scenarios": int(len(labels)), "estimator": type(est).__name__,
                       "params": {k: _jsonable(v) for k, v in est.get_params(deep=False).items()},
                       "sklearn": sklearn.__version__, "seed": seed, "fit_s": time.perf_counter() - t0,
                       "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                       "domain": feature_box(labels, feats), "lengths_seen": _lengths_seen(labels), **info}}
    if policies:
        model["policies"] = policies
    elif single_policy(labels) is not None:
        model["policy"] = single_policy(labels)
    if kind in IMODELS_KINDS:
        model["provenance"]["imodels"] = getattr(_imodels(kind), "__version__", None) or _dist_version("imodels")
    if kind in ("cart", "hstree"):
        model["rules"] = tree_rules(trees[0], feats, list(TARGETS), True)
    if kind == "rulefit":
        from twin.configurator.rulefit import export_rule_ensemble

        model["rule_ensembles"] = [export_rule_ensemble(e, feats, t) for e, t in zip(est.estimators_, TARGETS)]
        model["provenance"]["rules"] = sum(len(e["rules"]) for e in model["rule_ensembles"])
        model["provenance"]["linear_terms"] = sum(len(e["linear"]) for e in model["rule_ensembles"])
    return model


def _lengths_seen(labels: pd.DataFrame) -> dict[str, list[float]]:
    """The range of each length-mix column of the training labels (whether the model uses it or not): prediction
    refuses a length the model ignores outside it (:func:`twin.configurator.features.unused_length_problem`)."""
    out = {}
    for f, d in zip(LENGTH_FEATURES, DEFAULT_LENGTHS):
        if f not in labels:  # (labels before the lengths axis: the published pool, as lengths_seen reads it)
            continue
        v = pd.to_numeric(labels[f], errors="coerce")
        vals = v.dropna().tolist() + ([float(d)] if v.isna().any() else [])  # (a blank: the published pool)
        out[f] = [float(min(vals)), float(max(vals))]
    return out


def _dist_version(name: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:  # noqa: BLE001
        return None
