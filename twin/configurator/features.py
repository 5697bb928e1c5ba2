"""Scenario features of a configurator beyond the published eight: the request-length mix and the
scheduler / cache policy.

The published approach (issue 14, "Features") describes a scenario by 8 numbers, the max, min,
mean and std of its rate and rank triples (:data:`twin.configurator.labels.FEATURES`), and its
models recommend for one policy only (vLLM FCFS behind the client's in-flight cap, LRU adapters:
``fcfs+client-cap``). Here a model may also see

* the request-length mix: ``mean_input_tokens`` and ``mean_output_tokens`` (numeric columns of
  every sweep row, :func:`twin.sweep.walk.scenario_columns`; the published pool means are 222 /
  197, :data:`twin.sweep.scenario.DEFAULT_LENGTHS`);
* the per-adapter arrival process's burstiness: ``arrival_cv``, the coefficient of variation of each
  adapter's inter-arrival gaps (1 for Poisson, the published runs; a sweep grid's ``arrival`` axis,
  ``gamma:CV``), a numeric column of every sweep row since stop 58 (:func:`arrival_columns`);
* the policy (a ``twin policies`` preset name, the sweep grid's ``policy`` axis), a categorical
  feature encoded as one 0/1 indicator column per policy seen in training, named
  ``policy=<name>`` (one-hot encoding: every tree kind splits an indicator at 0.5, so a rule
  reads "policy is X" / "policy is not X", :func:`describe_condition`).

A model file stores the indicator columns among its ``features`` and the list of its policies as
``"policies"``; a model trained on one policy without indicators stores it as ``"policy"`` (absent:
the published ``fcfs+client-cap``, as every model trained before this module). Prediction builds
the indicators from a policy name and refuses a policy the model never saw
(:func:`policy_columns`), and a length the model does not use (either of the two, or both) must be
one its training labels held (``provenance["lengths_seen"]``; the published 222 / 197 for models
trained before that record: :func:`length_columns`): neither is silently ignored.

Rule conditions print their thresholds in full (:func:`threshold_text`, :data:`THRESHOLD_NOTE`), so a
printed rule takes the model's branch for every input.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from traces.arrivals import ArrivalError, ArrivalProcess, parse_arrival
from twin.configurator.labels import FEATURES
from twin.sweep.grid import check_known_policies
from twin.sweep.scenario import DEFAULT_LENGTHS, DEFAULT_POLICY

#: the name that asks for the policy indicators in ``train --features``
POLICY = "policy"
#: prefix of an indicator column: ``policy=fcfs+client-cap``
POLICY_PREFIX = "policy="
#: the request-length mix (mean input / output tokens of the scenario's request pool)
LENGTH_FEATURES = ("mean_input_tokens", "mean_output_tokens")
#: the per-adapter arrival process's inter-arrival coefficient of variation (1: Poisson, the published runs;
#: a sweep grid's ``arrival`` axis, ``gamma:CV``)
ARRIVAL_FEATURE = "arrival_cv"


def policy_column(name: str) -> str:
    """The indicator column of a policy: ``policy=<name>``."""
    return POLICY_PREFIX + str(name)


def is_policy_column(feature: str) -> bool:
    return str(feature).startswith(POLICY_PREFIX)


def training_columns(labels: pd.DataFrame, features: list[str] | None = None) -> tuple[list[str], list[str]]:
    """``(feature columns, policies)`` of a model trained on ``labels``.

    ``features`` defaults to the published 8; the name ``policy`` among them asks for the policy
    indicators, and they are added anyway when the labels hold more than one policy (a model that
    mixed several policies' optima without seeing which is which would recommend for none of them).
    ``policies`` is empty when no indicators are used. A ``policy`` column blank in some rows only is refused
    (those rows' policy is unknown); without the column (or blank throughout) the labels are of one policy, the
    published ``fcfs+client-cap``. Errors name the fix."""
    requested = list(features or FEATURES)
    numeric = [f for f in requested if f != POLICY]
    bad = [f for f in numeric if is_policy_column(f)]
    if bad:
        raise ValueError(f"--features: {bad[0]!r} is an indicator column; name {POLICY!r} to encode every policy "
                         f"of the labels")
    missing = [f for f in numeric if f not in labels]
    if missing:
        raise ValueError(f"--features: {missing} not in the labels (columns: {sorted(map(str, labels.columns))})")
    if POLICY in labels and labels[POLICY].isna().any() and labels[POLICY].notna().any():
        blank = int(labels[POLICY].isna().sum())
        raise ValueError(f"the labels' policy column is blank in {blank} of {len(labels)} rows: their policy is "
                         f"unknown, and a model that mixed policies without knowing which is which would recommend "
                         f"for none of them; fill it in (`twin configure dataset` writes it) or leave those rows out")
    has_policy = POLICY in labels and labels[POLICY].notna().all()
    policies = sorted(labels[POLICY].astype(str).unique().tolist()) if has_policy else []
    want = POLICY in requested or len(policies) > 1
    if want and not policies:
        raise ValueError("--features names 'policy', but the labels have no policy column (labels of a `twin sweep` "
                         "whose grid has a policy axis have one); drop 'policy' from --features")
    if not want:
        return numeric, []
    return numeric + [policy_column(p) for p in policies], policies


def design_matrix(labels: pd.DataFrame, columns: list[str]) -> np.ndarray:
    """The feature matrix of ``labels`` for ``columns`` (indicators computed from the ``policy`` column)."""
    cols = []
    for c in columns:
        if is_policy_column(c):
            cols.append((labels[POLICY].astype(str) == c[len(POLICY_PREFIX):]).to_numpy(float))
        else:
            cols.append(labels[c].to_numpy(float))
    return np.column_stack(cols) if cols else np.empty((len(labels), 0))


def single_policy(labels: pd.DataFrame) -> str | None:
    """The one policy of ``labels`` (a ``policy`` column with a single value), else None."""
    if POLICY in labels and labels[POLICY].notna().all():
        vals = labels[POLICY].astype(str).unique().tolist()
        if len(vals) == 1:
            return vals[0]
    return None


def model_policies(model: dict[str, Any]) -> list[str]:
    """The policies a model's indicator columns encode (empty: no policy features)."""
    return list(model.get("policies") or [])


def trained_policy(model: dict[str, Any]) -> str:
    """The one policy a model without policy features was trained on (the published by default)."""
    return str(model.get("policy") or DEFAULT_POLICY)


def resolve_policy_name(model: dict[str, Any], policy: str | None) -> str:
    """The policy a prediction is for: ``policy``, or by default the published ``fcfs+client-cap``
    (a model without policy features: the one it was trained on). Errors name the known ones."""
    pols = model_policies(model)
    if policy not in (None, *pols, trained_policy(model)):  # (a typo: named as such, not as a model's limit)
        try:
            check_known_policies([policy])
        except ValueError as e:
            if not pols:
                raise
            raise ValueError(f"unknown policy {policy!r} (no preset of `twin policies`); this configurator knows "
                             f"{', '.join(pols)} (--policy NAME)") from e
    if not pols:
        own = trained_policy(model)
        if policy not in (None, own):
            raise ValueError(f"policy {policy!r}: this configurator was trained without policy features, on "
                             f"{own!r} runs only, so it cannot recommend for another policy. Train one on a sweep "
                             f"with a policy axis (e.g. `twin sweep policy-demo`, then `twin configure train "
                             f"<sweep> --features ...,policy`), or drop --policy")
        return own
    name = DEFAULT_POLICY if policy is None else str(policy)
    if name not in pols:
        raise ValueError(f"policy {name!r}: this configurator was not trained with it; it knows "
                         f"{', '.join(pols)} (--policy NAME)")
    return name


def policy_columns(model: dict[str, Any], policy: str | None) -> tuple[str, dict[str, float]]:
    """``(policy, indicator values)`` of a prediction (no values for a model without policy features)."""
    name = resolve_policy_name(model, policy)
    return name, {policy_column(p): float(p == name) for p in model_policies(model)}


def lengths_seen(model: dict[str, Any]) -> dict[str, list[float]]:
    """``{feature: [lo, hi]}``: the range of each length-mix column (:data:`LENGTH_FEATURES`) over the model's
    training labels, which ``train`` records (``provenance["lengths_seen"]``); for a model without that record (every
    model trained before it, the shipped ones among them), or a column its labels lacked, the published pool means
    (222 / 197, :data:`twin.sweep.scenario.DEFAULT_LENGTHS`), the only mix a sweep ran before the lengths axis."""
    seen = (model.get("provenance") or {}).get("lengths_seen") or {}
    out = {}
    for f, d in zip(LENGTH_FEATURES, DEFAULT_LENGTHS):
        v = seen.get(f) if isinstance(seen, dict) else None
        ok = isinstance(v, (list, tuple)) and len(v) == 2 and all(isinstance(x, (int, float)) and math.isfinite(x)
                                                                  for x in v)
        out[f] = [float(v[0]), float(v[1])] if ok else [float(d), float(d)]
    return out


def _seen_text(lo: float, hi: float) -> str:
    return f"{lo:g}" if round(lo, 3) == round(hi, 3) else f"{lo:g}-{hi:g}"


def unused_length_problem(model: dict[str, Any], values: dict[str, float], tolerance: float = 0.0) -> str | None:
    """Why the length mix ``values`` (``{feature: mean tokens}``) is one ``model`` never saw, or None: each length
    feature the model does not use must lie within the range its training labels held (:func:`lengths_seen`; to 3
    decimals, or within ``tolerance``, a relative share, for a measured mean), since the model's answer ignores it.
    A model that uses one length feature but not the other checks the other (it was accepted in silence: a model
    trained on ``mean_input_tokens`` alone answered alike for 1 and 5000 output tokens)."""
    seen = lengths_seen(model)
    off = []
    for f in LENGTH_FEATURES:
        if f in model["features"] or f not in values:
            continue
        lo, hi = seen[f]
        v = float(values[f])
        inside = (round(lo, 3) <= round(v, 3) <= round(hi, 3)) if tolerance <= 0 else (
            lo * (1 - tolerance) <= v <= hi * (1 + tolerance))
        if not inside:
            off.append(f"{f} {v:g} (its labels held {_seen_text(lo, hi)})")
    return "; ".join(off) or None


def length_columns(model: dict[str, Any], lengths: tuple[float, float] | list[float] | None) -> dict[str, float]:
    """The length-mix features of a prediction from ``lengths`` (mean input, output tokens); none
    when ``lengths`` is None (a model trained on them then asks for them: ``--lengths``). A length the
    model does not use must be one its training labels held (:func:`unused_length_problem`): a model trained
    without the length features refuses a mix other than the one it saw (the published pool means, 222 / 197,
    for every model trained before ``lengths_seen``), and one trained on one of them refuses another value of
    the other, instead of ignoring it. Both values are returned (``--check`` runs the twin on them)."""
    used = [f for f in LENGTH_FEATURES if f in model["features"]]
    if lengths is None:
        return {}
    vals = [float(v) for v in lengths]
    if len(vals) != 2 or not all(math.isfinite(v) and v > 0 for v in vals):
        raise ValueError(f"--lengths {lengths!r}: expected two positive numbers IN,OUT (mean input and output "
                         f"tokens), e.g. --lengths 222,197")
    x = dict(zip(LENGTH_FEATURES, vals))
    problem = unused_length_problem(model, x)
    if problem and not used:
        seen = lengths_seen(model)
        saw = " / ".join(_seen_text(*seen[f]) for f in LENGTH_FEATURES)
        what = ("the published " if saw == f"{DEFAULT_LENGTHS[0]:g} / {DEFAULT_LENGTHS[1]:g}" else "") + saw
        raise ValueError(f"--lengths {vals[0]:g},{vals[1]:g}: this configurator was trained without the "
                         f"length-mix features, on {what} tokens only; train one with --features "
                         f"...,mean_input_tokens,mean_output_tokens on a sweep with a lengths axis, or drop --lengths")
    if problem:
        missing = [f for f in LENGTH_FEATURES if f not in used][0]
        raise ValueError(f"--lengths {vals[0]:g},{vals[1]:g}: this configurator uses {used[0]} but not {missing}, "
                         f"and its answer ignores {problem}, so it never saw this mix; train one with --features "
                         f"...,mean_input_tokens,mean_output_tokens on a sweep with a lengths axis, or give "
                         f"--lengths with a {missing} its labels held")
    return x


def arrival_option(value: str) -> ArrivalProcess:
    """``--arrival``'s value as an arrival process (:func:`traces.arrivals.parse_arrival`); an error names the
    option and the accepted forms."""
    try:
        return parse_arrival(value)
    except ArrivalError as e:
        raise ValueError(f"--arrival: {e}") from None


def arrival_columns(model: dict[str, Any], arrival: str | None) -> dict[str, float]:
    """The arrival feature of a prediction from ``arrival`` (``poisson`` or ``gamma:CV``,
    :func:`traces.arrivals.parse_arrival`); none when ``arrival`` is None (a model trained on it then asks for
    it: ``--arrival``). A model trained without it refuses any arrival process but Poisson, the one its
    sweep ran, instead of ignoring it."""
    if arrival is None:
        return {}
    proc = arrival_option(arrival)
    if ARRIVAL_FEATURE not in model["features"]:
        if proc.kind != "poisson":
            raise ValueError(f"--arrival {proc.name}: this configurator was trained without the arrival feature, on "
                             f"Poisson arrivals only; train one with --features ...,{ARRIVAL_FEATURE} on a sweep with "
                             f"an arrival axis (e.g. arrival = [\"poisson\", \"gamma:2\"]), or drop --arrival")
        return {}
    return {ARRIVAL_FEATURE: proc.cv}


def arrival_name(x: dict[str, float]) -> str:
    """The arrival process a prediction's features describe: ``poisson`` without the feature or at CV 1 (a
    Poisson stream's), else ``gamma:CV`` (what ``--check`` runs)."""
    cv = x.get(ARRIVAL_FEATURE)
    return "poisson" if cv is None or float(cv) == 1.0 else parse_arrival(f"gamma:{float(cv):g}").name


#: ``predict --workload`` with a model trained without the length features: the file's mean input and output
#: tokens may differ from the published pool's (222 / 197) by at most this share each (a measured mean is never
#: exactly the pool's; a mix further off is another scenario, which such a model never saw)
LENGTH_TOLERANCE = 0.10
#: ``predict --workload`` with a model trained without the arrival feature: the largest median per-adapter
#: inter-arrival CV read as Poisson (measured on Poisson streams of the published rates: 0.84-1.00, the low values
#: where adapters send barely the 10 requests a CV needs; gamma streams of CV 1.5 and above are bursty)
POISSON_CV_MAX = 1.25


def workload_columns(model: dict[str, Any], feats: dict[str, float], where: str) -> dict[str, float]:
    """The prediction features of a workload file (``feats``: the scenario features
    :func:`twin.sweep.workload_scenario.load_workload_scenario` measures over its adapters: the published 8 over
    the adapters instead of a triple, the mean lengths and ``arrival_cv``), for ``model``. The 8 always; the length
    and arrival features where the model uses them. Where it does not, the file must look like what the model was
    trained on (the published pool's lengths within :data:`LENGTH_TOLERANCE`, a median CV of at most
    :data:`POISSON_CV_MAX`): else a ``ValueError`` naming the file's value, ``where`` (the option) and the fix,
    rather than a recommendation for a scenario the model never saw. A file whose adapters send too few requests to
    measure a CV (NaN) reads as Poisson for such a model, and is refused by one that needs the feature."""
    x = {f: float(feats[f]) for f in FEATURES}
    fix = ("`twin configure search --workload FILE` runs the twin on the file itself (no model), or train a "
           "configurator with --features ...,{} on a sweep with that axis")
    lengths = [float(feats[f]) for f in LENGTH_FEATURES]
    if any(f in model["features"] for f in LENGTH_FEATURES):
        x.update((f, v) for f, v in zip(LENGTH_FEATURES, lengths) if f in model["features"])
        problem = unused_length_problem(model, dict(zip(LENGTH_FEATURES, lengths)), LENGTH_TOLERANCE)
        if problem:  # (the length the model does not use was ignored, whatever the file's)
            raise ValueError(f"{where}: this configurator does not use {problem}, and its requests' mean lengths are "
                             f"{lengths[0]:.0f} input / {lengths[1]:.0f} output tokens (within "
                             f"{100 * LENGTH_TOLERANCE:.0f} % is accepted); "
                             + fix.format("mean_input_tokens,mean_output_tokens"))
    else:
        if unused_length_problem(model, dict(zip(LENGTH_FEATURES, lengths)), LENGTH_TOLERANCE):
            seen = lengths_seen(model)
            saw = " / ".join(_seen_text(*seen[f]) for f in LENGTH_FEATURES)
            what = ("the published " if saw == f"{DEFAULT_LENGTHS[0]:g} / {DEFAULT_LENGTHS[1]:g}" else "") + saw
            raise ValueError(f"{where}: its requests' mean lengths are {lengths[0]:.0f} input / {lengths[1]:.0f} "
                             f"output tokens, and this configurator was trained without the length-mix features, on "
                             f"{what} only (within {100 * LENGTH_TOLERANCE:.0f} % is accepted); "
                             + fix.format("mean_input_tokens,mean_output_tokens"))
    cv = float(feats[ARRIVAL_FEATURE])
    if ARRIVAL_FEATURE in model["features"]:
        if not math.isfinite(cv):
            raise ValueError(f"{where}: no adapter sends the 10 requests in the window that its inter-arrival CV "
                             f"needs, and this configurator uses that feature ({ARRIVAL_FEATURE}); give a longer "
                             f"--window or a busier file, or pass --rates/--ranks with --arrival instead")
        x[ARRIVAL_FEATURE] = cv
    elif math.isfinite(cv) and cv > POISSON_CV_MAX:
        raise ValueError(f"{where}: its adapters' arrivals are bursty (median inter-arrival CV {cv:.2f}; Poisson "
                         f"reads about 1, and up to {POISSON_CV_MAX:g} is accepted), and this configurator was "
                         f"trained on Poisson arrivals only; " + fix.format(ARRIVAL_FEATURE))
    return x


def feature_label(feature: str) -> str:
    """A feature as text: an indicator as ``[policy is X]``, anything else by its name."""
    return f"[policy is {feature[len(POLICY_PREFIX):]}]" if is_policy_column(feature) else str(feature)


#: how a printed rule condition reads (the header of ``twin configure rules`` and the docs say it): the threshold is
#: written in full, so ``feature op threshold`` evaluated on the feature's value is the model's decision for every
#: input; a threshold rounded for reading (``0.6`` for scikit-learn's split stored as 0.5999999940395354) flipped
#: the branch of the inputs between the two
THRESHOLD_NOTE = ("a condition compares the feature's value (a float64 number) with the threshold as printed, "
                  "which is exact: the shortest decimal that reads back as the model's own threshold")
#: :data:`THRESHOLD_NOTE`'s addition for trees fitted by scikit-learn (``cart``, ``hstree``, ``rf``)
FLOAT32_NOTE = ("scikit-learn's trees compare their input cast to float32, so a split between two training values "
                "stores the float64 boundary of that comparison: the split between rate_max 0.4 and 0.8 reads "
                "rate_max <= 0.5999999940395354, and rate_max 0.6 takes the right branch, in the rule as in the model")


def threshold_text(value: float) -> str:
    """A split threshold as printed in rules and rule paths: the shortest decimal that reads back as the
    float64 ``value`` (Python's ``repr``; ``17`` for ``17.0``), so ``x <= text`` or ``x > text`` evaluated on any
    float64 ``x`` takes the model's branch (:data:`THRESHOLD_NOTE`). Rounding it (``{:.6g}``) printed
    ``rate_max <= 0.6`` for the stored 0.5999999940395354, which the input 0.6 does not satisfy."""
    v = float(value)
    text = repr(v)
    return text[:-2] if text.endswith(".0") else text


def describe_condition(feature: str, op: str, value: float) -> str:
    """One rule condition as text. On a policy indicator (0 or 1) a threshold condition reads
    ``policy is X`` or ``policy is not X``; anything else ``feature op value``, the value in full
    (:func:`threshold_text`: the printed inequality is the model's own, for every input)."""
    v = float(value)
    if is_policy_column(feature):
        name = feature[len(POLICY_PREFIX):]
        holds_at = {"<=": (0.0 <= v, 1.0 <= v), "<": (0.0 < v, 1.0 < v),
                    ">": (0.0 > v, 1.0 > v), ">=": (0.0 >= v, 1.0 >= v)}.get(op)
        if holds_at == (False, True):
            return f"policy is {name}"
        if holds_at == (True, False):
            return f"policy is not {name}"
    return f"{feature} {op} {threshold_text(v)}"


def readable_conditions(conditions: list[dict[str, Any]], policies: list[str] | None = None) -> list[str]:
    """A rule's conditions (``{"feature", "op", "value"}``) as text: :func:`describe_condition`,
    then :func:`simplify_policy_conditions`."""
    return simplify_policy_conditions([describe_condition(c["feature"], c["op"], c["value"]) for c in conditions],
                                      policies)


def simplify_policy_conditions(texts: list[str], policies: list[str] | None = None) -> list[str]:
    """The conditions of one rule or path as text, the policy ones simplified: one indicator is 1,
    so ``policy is X`` makes every ``policy is not Y`` redundant (dropped), and ``policy is not``
    every known policy (``policies``, the model's) but one reads ``policy is`` that one."""
    neg = [t for t in texts if t.startswith("policy is not ")]
    pos = [t for t in texts if t.startswith("policy is ") and t not in neg]
    if pos:
        return [t for t in texts if t not in neg]
    if neg and policies:
        left = [p for p in policies if f"policy is not {p}" not in neg]
        if len(left) == 1:
            at = texts.index(neg[0])
            out = list(texts)
            out[at] = f"policy is {left[0]}"
            return [t for t in out if t not in neg]
    return list(texts)
