"""Printed rules and rule paths take the model's branches for every input (audit: rounded thresholds).

The text rules (``twin configure rules``), the JSON rules (``--json``) and the ``predict --explain`` paths are
evaluated as an operator would: each printed condition ``feature <= T`` / ``feature > T`` / ``lo < feature <= hi``
read with the printed number ``T``. On the published grid's 840 scenarios and on values exactly at, and one ulp
around, every threshold (and the rounded values an operator would type: 0.6, 0.075, a rank std of sqrt(32)), the
one rule that holds must be the leaf the model's own tree walk reaches, and every condition of a path must hold.
Rounded to 6 significant digits, ``rate_max <= 0.6`` matched the input 0.6 that the model sends right
(stored 0.5999999940395354).
"""

from __future__ import annotations

import json
import math
import re
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest

from twin.configurator.features import is_policy_column
from twin.configurator.labels import FEATURES, features_of
from twin.configurator.models import (MODEL_DIR, format_rule_ensembles, format_rules, load_model, predict,
                                      rules_predict, tree_apply)
from twin.sweep.grid import rank_multisets, rate_triples

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "results" / "configurator"
PROFILES = ("llama-3.1-8b_h100_vllm085_adaptercheck", "llama-3.1-8b_h100_vllm085", "qwen-2.5-7b_h100_vllm085")
GRID_POINTS = [features_of(r, k) for r in rate_triples() for k in rank_multisets()]

_NUM = r"(-?[0-9.]+(?:e[-+]?[0-9]+)?|-?inf)"


def _holds(cond: str, x: dict[str, float], exact: bool = False) -> bool:
    """One printed condition at ``x``, read with the printed number: in float64 (the number parsed, as any
    program would), or with ``exact`` in decimal arithmetic on the feature's decimal text (an operator with
    a calculator; meaningful for inputs typed as short decimals)."""
    def cmp(v: float, op: str, text: str) -> bool:
        a, b = (Decimal(repr(float(v))), Decimal(text)) if exact else (float(v), float(text))
        return {"<=": a <= b, ">": a > b, "<": a < b, ">=": a >= b}[op]

    m = re.fullmatch(rf"{_NUM} < (\S+) <= {_NUM}", cond)
    if m:
        return cmp(x[m.group(2)], ">", m.group(1)) and cmp(x[m.group(2)], "<=", m.group(3))
    m = re.fullmatch(rf"(\S+) (<=|>|<|>=) {_NUM}", cond)
    assert m, f"unparsed condition {cond!r}"
    return cmp(x[m.group(1)], m.group(2), m.group(3))


def _text_rules(text: str) -> list[tuple[list[str], str]]:
    """``(conditions, 'served N, slots G')`` per ``R..`` line of :func:`format_rules`' text."""
    out = []
    for line in text.splitlines():
        m = re.fullmatch(r"R\d+ IF (.*) THEN (served \d+, slots \d+) .*", line)
        if m:
            out.append(([] if m.group(1) == "always" else m.group(1).split(" AND "), m.group(2)))
    return out


def _boundary_values(t: float) -> list[float]:
    """The values at and one ulp around a stored threshold, its float32 neighbours, and the value it reads
    rounded to 6 digits (what the text printed before) with its ulp neighbours."""
    r = float(f"{t:.6g}")
    t32 = float(np.float32(t))
    return [t, np.nextafter(t, -np.inf), np.nextafter(t, np.inf), r, np.nextafter(r, -np.inf), np.nextafter(r, np.inf),
            t32, float(np.nextafter(np.float32(t), np.float32(-np.inf))),
            float(np.nextafter(np.float32(t), np.float32(np.inf)))]


def _probe_points(model: dict) -> list[dict[str, float]]:
    """The grid's scenarios, and for every split threshold of the model's trees a few grid scenarios with that
    feature set to each of :func:`_boundary_values` (the other features kept: the rule check needs no
    consistent triple), plus the operator's values of the audit: rate_max 0.6, rate_mean 0.075, rank_std
    sqrt(32) (ranks 8, 8, 20)."""
    pts = list(GRID_POINTS)
    base = GRID_POINTS[::97]
    feats = model["features"]
    for tree in model["trees"]:
        for f, t, lc in zip(tree["feature"], tree["threshold"], tree["left"]):
            if lc == -1:
                continue
            for v in _boundary_values(float(t)):
                pts += [{**b, feats[f]: float(v)} for b in base]
    for name, v in (("rate_max", 0.6), ("rate_mean", 0.075), ("rank_std", math.sqrt(32)), ("rank_max", 20.0)):
        pts += [{**b, name: v} for b in base]
    pts.append(features_of([0.6, 0.003125, 0.003125], [8, 8, 8]))
    pts.append(features_of([0.003125, 0.00625, 0.025], [8, 8, 20]))
    return pts


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("kind", ["cart", "hstree"])
def test_text_and_json_rules_take_the_models_branch_at_every_threshold(profile, kind):
    m = load_model(profile, kind)
    rules = _text_rules(format_rules(m))
    assert len(rules) == len(m["rules"])
    stored = json.loads(json.dumps(m["rules"]))  # the JSON rules as `configure rules --json` prints them
    for x in _probe_points(m):
        xv = np.asarray([x[f] for f in m["features"]], float)
        leaf = tree_apply(m["trees"][0], xv)[1][-1]
        held = [i for i, (conds, _) in enumerate(rules) if all(_holds(c, x) for c in conds)]
        assert len(held) == 1 and m["rules"][held[0]]["leaf"] == leaf, (x, held, leaf)
        assert rules_predict(stored, x)["leaf"] == leaf, x


def test_the_audits_inputs_read_the_rule_the_model_applies():
    """rate_max 0.6 is on the right of scikit-learn's split between 0.4 and 0.8: the Llama tree answers 96 / 32,
    and the text rule that holds (the float64 comparison and an operator's decimal one alike) says 96 / 32; the Qwen
    tree's path at ranks 8, 8, 20 (rank std sqrt(32)) holds for that input."""
    m = load_model("llama-3.1-8b_h100_vllm085", "cart")
    x = features_of([0.6, 0.003125, 0.003125], [8, 8, 8])
    res = predict(m, x, explain=True)
    for exact in (False, True):
        held = [then for conds, then in _text_rules(format_rules(m)) if all(_holds(c, x, exact) for c in conds)]
        assert held == [f"served {res['served_adapters']}, slots {res['adapter_slots']}"]
        assert all(_holds(c, x, exact) for c in res["rule_path"]), res["rule_path"]
    assert "rate_max > 0.5999999940395354" in res["rule_path"]
    q = load_model("qwen-2.5-7b_h100_vllm085", "cart")
    x = features_of([0.003125, 0.00625, 0.025], [8, 8, 20])
    path = predict(q, x, explain=True)["rule_path"]
    assert any(c.startswith("rank_std <= 5.65685439") for c in path), path
    assert all(_holds(c, x) and _holds(c, x, exact=True) for c in path), path


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("kind", ["rf", "figs"])
def test_explain_paths_hold_for_their_input(profile, kind):
    """A forest's path (its first tree) and a sum's paths (every tree) hold at the input, at every threshold
    of the trees they walk."""
    if not (MODEL_DIR / f"{profile}.{kind}.json").exists() and not (MODEL_DIR / f"{profile}.{kind}.json.gz").exists():
        pytest.skip(f"no shipped {kind} model of {profile}")
    m = load_model(profile, kind)
    trees = m["trees"] if kind == "figs" else m["trees"][:1]
    probe = _probe_points({**m, "trees": trees})[::7]
    for x in probe:
        res = predict(m, x, explain=True)
        conds = [c for c in res["rule_path"] if not c.startswith("[tree ")]
        assert all(_holds(c, x) for c in conds if not is_policy_column(c)), (x, res["rule_path"])


@pytest.mark.parametrize("value", [0.6, 0.5999999940395354, 0.0125000006519258, 17.0, 0.25, 1e-05, 5.656854391098022,
                                   0.1 + 0.2, 248.5, 3.2])
def test_threshold_text_reads_back_as_the_threshold(value):
    from twin.configurator.features import threshold_text

    text = threshold_text(value)
    assert float(text) == value
    assert len(text) <= len(repr(value))  # no longer than needed ("17", not "17.0")


def _committed_rule_files() -> list[tuple[Path, list[str]]]:
    """The committed rule files and the `twin configure` command that writes each (results/configurator/README.md,
    "Files"; the policy demonstration's from its committed cart model)."""
    out = []
    for stem, profile in (("rules_llama", "llama-3.1-8b_h100_vllm085"), ("rules_qwen", "qwen-2.5-7b_h100_vllm085"),
                          ("rules_llama_adaptercheck", None)):
        prof = ["--profile", profile] if profile else []
        out.append((RESULTS / f"{stem}.txt", ["configure", "rules", *prof]))
        out.append((RESULTS / f"{stem}.json", ["configure", "rules", *prof, "--json"]))
        out.append((RESULTS / f"{stem}_rulefit.txt", ["configure", "rules", *prof, "--kind", "rulefit"]))
    out.append((RESULTS / "policy_demo" / "rules.txt",
                ["configure", "rules", "--model", "results/configurator/policy_demo/policy-demo.cart.json"]))
    return [(p, argv) for p, argv in out if p.exists()]


@pytest.mark.parametrize("path,argv", _committed_rule_files(), ids=lambda v: v.name if isinstance(v, Path) else "")
def test_the_committed_rule_files_are_what_twin_configure_rules_prints(path, argv, monkeypatch, capsys):
    """The published rules are the shipped models' (regenerated when the text format changes: the full
    thresholds and the header that says how to read them)."""
    from twin.cli import main

    monkeypatch.chdir(REPO)
    assert main(argv) == 0
    out = capsys.readouterr().out
    if path.suffix == ".json":
        assert json.loads(out) == json.loads(path.read_text())
    else:
        assert out == path.read_text(), f"{path.relative_to(REPO)} differs from `twin {' '.join(argv)}`"
        if "R01 IF" in out or "## " in out:
            assert "threshold as printed, which is exact" in out


def test_rule_ensemble_text_conditions_hold_as_printed():
    """RuleFit's printed conditions hold exactly where the JSON conditions do."""
    from twin.configurator.models import condition_holds, format_condition

    m = load_model(PROFILES[0], "rulefit")
    assert "threshold as printed, which is exact" in format_rule_ensembles(m)
    conds = [c for e in m["rule_ensembles"] for r in e["rules"] for c in r["conditions"]]
    for c in conds:
        for v in _boundary_values(float(c["value"])):
            x = {f: 1.0 for f in FEATURES} | {c["feature"]: float(v)}
            assert _holds(format_condition(c), x) == condition_holds(c, x), (c, v)
