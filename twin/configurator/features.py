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
(:func:`policy_columns`), and a model without length features refuses a length mix other than
the published one (:func:`length_columns`): neither is silently ignored.
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
    ``policies`` is empty when no indicators are used. Errors name the fix."""
    requested = list(features or FEATURES)
    numeric = [f for f in requested if f != POLICY]
    bad = [f for f in numeric if is_policy_column(f)]
    if bad:
        raise ValueError(f"--features: {bad[0]!r} is an indicator column; name {POLICY!r} to encode every policy "
                         f"of the labels")
    missing = [f for f in numeric if f not in labels]
    if missing:
        raise ValueError(f"--features: {missing} not in the labels (columns: {sorted(map(str, labels.columns))})")
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


def length_columns(model: dict[str, Any], lengths: tuple[float, float] | list[float] | None) -> dict[str, float]:
    """The length-mix features of a prediction from ``lengths`` (mean input, output tokens); none
    when ``lengths`` is None (a model trained on them then asks for them: ``--lengths``). A model
    trained without them refuses a length mix other than the published pool means (222 / 197)
    instead of ignoring it."""
    used = [f for f in LENGTH_FEATURES if f in model["features"]]
    if lengths is None:
        return {}
    vals = [float(v) for v in lengths]
    if len(vals) != 2 or not all(math.isfinite(v) and v > 0 for v in vals):
        raise ValueError(f"--lengths {lengths!r}: expected two positive numbers IN,OUT (mean input and output "
                         f"tokens), e.g. --lengths 222,197")
    if not used:
        if [round(v, 3) for v in vals] != [round(float(v), 3) for v in DEFAULT_LENGTHS]:
            raise ValueError(f"--lengths {vals[0]:g},{vals[1]:g}: this configurator was trained without the "
                             f"length-mix features, on the published {DEFAULT_LENGTHS[0]:g} / {DEFAULT_LENGTHS[1]:g} "
                             f"tokens only; train one with --features ...,mean_input_tokens,mean_output_tokens on a "
                             f"sweep with a lengths axis, or drop --lengths")
        return {}
    return dict(zip(LENGTH_FEATURES, vals))


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
        x.update(zip(LENGTH_FEATURES, lengths))
    else:
        off = [abs(v / float(d) - 1.0) for v, d in zip(lengths, DEFAULT_LENGTHS)]
        if max(off) > LENGTH_TOLERANCE:
            raise ValueError(f"{where}: its requests' mean lengths are {lengths[0]:.0f} input / {lengths[1]:.0f} "
                             f"output tokens, and this configurator was trained without the length-mix features, on "
                             f"the published {DEFAULT_LENGTHS[0]:g} / {DEFAULT_LENGTHS[1]:g} only (within "
                             f"{100 * LENGTH_TOLERANCE:.0f} % is accepted); "
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


def describe_condition(feature: str, op: str, value: float) -> str:
    """One rule condition as text. On a policy indicator (0 or 1) a threshold condition reads
    ``policy is X`` or ``policy is not X``; anything else ``feature op value``."""
    v = float(value)
    if is_policy_column(feature):
        name = feature[len(POLICY_PREFIX):]
        holds_at = {"<=": (0.0 <= v, 1.0 <= v), "<": (0.0 < v, 1.0 < v),
                    ">": (0.0 > v, 1.0 > v), ">=": (0.0 >= v, 1.0 >= v)}.get(op)
        if holds_at == (False, True):
            return f"policy is {name}"
        if holds_at == (True, False):
            return f"policy is not {name}"
    return f"{feature} {op} {v:.6g}"


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
