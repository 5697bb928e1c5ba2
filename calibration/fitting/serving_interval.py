"""The token interval of a running request in queued serving: the ``interval`` profile variant.

Issue 17's fidelity work fits the ``mixed`` component (:mod:`calibration.fitting.mixed`) on the
calibration's published 600 s serving runs with a waiting queue using the *engine's* mean step,
``duration / engine_steps``. What the twin must reproduce, though, is the time between two tokens
of a running request: in the twin every running request decodes once per step, so its mean step
*is* that interval, and the validation scores it (client ITL) and its consequence (throughput =
running requests / interval). In the queued runs the two differ. By Little's law the interval of
a running request is ``mean running / output token rate`` (``little_ms``); it agrees with the
client's mean ITL (median ratio 0.95; below 0.9 only where preemption stalls enter the ITL), but
exceeds ``duration / steps`` by up to 30 %, more with more *blocked* waiting requests (served
adapters beyond the slots, so the v1 scheduler skips them every step). The runs without a queue
and the 300-slot windows (up to 3,900 waiting requests, none blocked: 300 slots for at most 192
adapters) show no such gap.

:func:`fit_interval` scores forms for the excess of that interval over the calibrated model
(backbone + LoRA kernel grid + the logged scheduler and adapter-load time) on the three sources
together, each with the same weight, by grouped 5-fold held-out MAPE (mean over the sources):
the target is ``little_ms`` for the queued runs, the client ITL for the runs without a queue
(where ``little_ms`` equals it: median 0.99) and the step log's mean step for the windows.
Terms: ``pre_A`` (distinct adapters x share of steps with a prefill; the ``mixed`` form
``prefill_adapters``), ``Wb`` (blocked waiting requests: ``W * max(1 - G/N, 0)``, the scheduler's
``k_blocked`` input), ``W`` (all waiting), ``R`` (running), ``pre_G`` (slots x prefill share).

The chosen form becomes a profile *variant* (``python -m calibration.fitting.serving_interval
--write``): the ``mixed`` component refitted on the interval target and the scheduler form
``lora_queue_walk`` (:class:`twin.perf.forms.LoraQueueWalkScheduler`: the fitted scheduler plus
``k_walk`` per blocked waiting request and step). The default profile is not changed; the variant
is selected with ``twin validate --profile llama-3.1-8b_h100_vllm085_interval``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd

from calibration.fitting.core import ParamSpec, cross_val_predict, fit_params, quality
from calibration.fitting.mixed import SOURCES, mixed_obs
from calibration.fitting.tables import Vllm085Tables
from calibration.fitting.vllm085 import per_adapter_serving_runs
from twin.perf.forms import FORMS
from twin.perf.profile import Profile

MS = 1e-3

#: candidate forms: name -> terms (columns of :func:`interval_obs`), each fitted in ms per unit
CANDIDATES: dict[str, tuple[str, ...]] = {
    "prefill_adapters": ("pre_A",),
    "prefill_adapters+blocked_waiting": ("pre_A", "Wb"),
    "prefill_adapters+waiting": ("pre_A", "W"),
    "prefill_adapters+running": ("pre_A", "R"),
    "prefill_adapters+running+blocked_waiting": ("pre_A", "R", "Wb"),
    "prefill_slots+blocked_waiting": ("pre_G", "Wb"),
    "blocked_waiting": ("Wb",),
}
#: the profile's mixed forms (:class:`twin.perf.forms.PrefillAdaptersMixed`, ``PrefillSlotsMixed``) as terms here
MIXED_FORM_TERM = {"prefill_adapters": "pre_A", "prefill_slots": "pre_G"}
UNITS = {"pre_A": "ms/distinct adapter/step with prefill", "pre_G": "ms/adapter slot/step with prefill",
         "Wb": "ms/blocked waiting request/step", "W": "ms/waiting request/step", "R": "ms/running request/step"}


def interval_obs(t: Vllm085Tables, profile: Profile) -> pd.DataFrame:
    """:func:`calibration.fitting.mixed.mixed_obs` rows with ``little_ms`` (mean running / output
    token rate of the serving runs; the windows keep their step), ``itl_ms``, ``N`` (served
    adapters) and ``Wb`` (blocked waiting requests), and ``target_ms``: ``little_ms`` for the runs
    with a queue, the client ITL for those without, the mean step for the windows."""
    obs = mixed_obs(t, profile)
    s = per_adapter_serving_runs(t.sched).reset_index(drop=True)
    runs = obs["source"] != SOURCES[2]
    if int(runs.sum()) != len(s):
        raise ValueError("serving_interval: the serving runs of mixed_obs do not match scheduler_overhead.csv")
    little = np.full(len(obs), np.nan)
    itl = np.full(len(obs), np.nan)
    n_served = obs["G"].to_numpy(float).copy()  # windows: all adapters fit in the 300 slots
    little[runs.to_numpy()] = (s["mean_running"] / s["output_tok_s"]).to_numpy(float) / MS
    itl[runs.to_numpy()] = s["mean_itl_ms"].to_numpy(float)
    n_served[runs.to_numpy()] = s["served_adapters"].to_numpy(float)
    obs = obs.assign(little_ms=little, itl_ms=itl, N=n_served, dur_step_ms=obs["step_ms"])
    obs["Wb"] = obs["W"] * np.maximum(1.0 - obs["G"] / np.maximum(obs["N"], 1.0), 0.0)
    queued = obs["source"] == SOURCES[0]
    obs["target_ms"] = np.where(queued, obs["little_ms"], obs["step_ms"])
    return obs


def _predict(terms: tuple[str, ...], theta, obs: pd.DataFrame) -> np.ndarray:
    return sum(th * obs[c].to_numpy(float) for th, c in zip(theta, terms))


def score(obs: pd.DataFrame, terms: tuple[str, ...] | None, target: str = "target_ms", k: int = 5,
          fixed: dict[str, float] | None = None) -> dict[str, Any]:
    """Held-out (grouped ``k``-fold) MAPE per source of ``target`` for the model + ``terms``
    (None: the model alone; ``fixed``: constants in ms, not fitted), and the full-data fit."""
    y_all = obs[target].to_numpy(float)
    base = obs["model_ms"].to_numpy(float)
    src = obs["source"].to_numpy()
    if fixed:
        base = base + sum(v * obs[c].to_numpy(float) for c, v in fixed.items())
    out: dict[str, Any] = {}
    if not terms:
        pred = base
        params: dict[str, float] = {}
    else:
        counts = pd.Series(src).value_counts()
        sig = np.sqrt(np.array([counts[x] for x in src], float))
        y = y_all - base

        def fit_idx(idx: np.ndarray):
            sub = obs.iloc[idx]
            specs = [ParamSpec(f"h{i}", 0.01, 0.0, 10.0) for i in range(len(terms))]
            return fit_params(lambda *th: _predict(terms, th, sub), specs, y[idx], sig[idx],
                              f"serving_interval/{'+'.join(terms)}")

        pred_idx: Callable = lambda f, idx: _predict(terms, list(f.values.values()), obs.iloc[idx])  # noqa: E731
        pred = base + cross_val_predict(fit_idx, pred_idx, len(obs), obs["group"], k)
        full = fit_idx(np.arange(len(obs)))
        params = {c: float(f"{v:.6g}") for c, v in zip(terms, full.values.values())}
        out["stderr"] = {c: float(f"{full.stderr[f'h{i}']:.3g}") for i, c in enumerate(terms)}
        if full.at_bound:  # (their stderr is NaN: no meaningful error at a bound)
            out["at_bound"] = [terms[int(n[1:])] for n in full.at_bound]
    held = {s: quality(y_all[src == s], pred[src == s]) for s in SOURCES}
    held["all"] = {"mape_pct": float(np.mean([held[s]["mape_pct"] for s in SOURCES]))}
    out.update({"heldout": held, "params": params})
    return out


def fit_interval(t: Vllm085Tables, profile: Profile, k: int = 5) -> dict[str, Any]:
    """Every candidate's held-out scores on the interval target, the committed ``mixed`` term (fitted
    on ``duration / steps``) as the reference, and the chosen candidate (lowest mean held-out MAPE;
    within 2 % relative, fewer terms)."""
    prof_nomixed = profile.without("mixed") if "mixed" in profile.components else profile
    obs = interval_obs(t, prof_nomixed)
    res: dict[str, Any] = {"rows": {s: int((obs["source"] == s).sum()) for s in SOURCES}}
    res["model_without_mixed"] = score(obs, None)
    if "mixed" in profile.components:
        m = profile.components["mixed"]
        term = MIXED_FORM_TERM.get(m.form)
        if term is None:
            raise ValueError(f"serving_interval: the profile's mixed form {m.form!r} has no interval term; the forms "
                             f"are {sorted(MIXED_FORM_TERM)}")
        (h,) = (float(v) / MS for v in m.params.values())
        res["committed_mixed"] = {"form": m.form, "term": term, "ms": h}
        res["committed_mixed_on_interval_target"] = score(obs, None, fixed={term: h})
        res["committed_mixed_on_step_target"] = score(obs, None, target="step_ms", fixed={term: h})
    cands = {name: score(obs, terms, k=k) for name, terms in CANDIDATES.items()}
    res["candidates"] = cands
    best = min(cands, key=lambda n: cands[n]["heldout"]["all"]["mape_pct"])
    near = [n for n in cands if cands[n]["heldout"]["all"]["mape_pct"] <= cands[best]["heldout"]["all"]["mape_pct"] * 1.02]
    res["chosen"] = min(near, key=lambda n: (len(CANDIDATES[n]), cands[n]["heldout"]["all"]["mape_pct"]))
    res["criterion"] = ("lowest mean over the three sources of the held-out MAPE (grouped 5-fold by run/window; "
                        "forms within 2 % relative: fewer terms)")
    return res


def _se(v: float) -> float | None:
    """A standard error as the profile stores it: 6 digits, None where it has no meaning (a constant at a bound of its
    fit, :func:`calibration.fitting.core.fit_params`), as the other fits write it."""
    return float(f"{v:.6g}") if np.isfinite(v) else None


def interval_variant(profile: dict[str, Any], fit: dict[str, Any], command: str = "") -> dict[str, Any]:
    """``profile`` with the ``prefill_adapters+blocked_waiting`` fit: ``mixed.h_adapter`` refitted and
    the scheduler turned into ``lora_queue_walk`` with ``k_walk`` (s per blocked waiting request)."""
    name = "prefill_adapters+blocked_waiting"
    c = fit["candidates"][name]
    out = json.loads(json.dumps(profile))
    out["name"] = profile["name"] + "_interval"
    out["description"] = (profile.get("description", "") + "; variant 'interval' (issue 17): the serving step "
                          "fitted on the token interval of running requests in the queued serving runs "
                          "(calibration.fitting.serving_interval)")
    mixed = FORMS[("mixed", "prefill_adapters")](params={"h_adapter": float(f"{c['params']['pre_A'] * MS:.8g}")}).to_dict()
    mixed["stderr"] = {"h_adapter": _se(c["stderr"]["pre_A"] * MS)}
    term_at_bound = set(c.get("at_bound") or [])
    if "pre_A" in term_at_bound:
        mixed["at_bound"] = ["h_adapter"]
    out["components"]["mixed"] = mixed
    mixed["method"] = ("refitted with k_walk by calibration.fitting.serving_interval: curve_fit of the token interval "
                       "of a running request (queued serving runs: mean running / output token rate; runs without a "
                       "queue: client ITL; 300-slot windows: mean step) minus the calibrated model")
    sch = out["components"]["scheduler"]
    base_params = dict(sch["params"])
    cls = FORMS[("scheduler", "lora_queue_walk")]
    entry = cls(params={**base_params, "k_walk": float(f"{c['params']['Wb'] * MS:.8g}")}).to_dict()
    entry["stderr"] = {**sch.get("stderr", {}), "k_walk": _se(c["stderr"]["Wb"] * MS)}
    # the base fit's constants keep their standing: one pinned at a bound of its fit stays listed (the base profile's
    # k2 sits at its 0 bound with a null stderr; the rebuilt entry had dropped at_bound), as does k_walk if it is
    at_bound = list(sch.get("at_bound") or []) + (["k_walk"] if "Wb" in term_at_bound else [])
    if at_bound:
        entry["at_bound"] = at_bound
    if "fixed" in sch:
        entry["fixed"] = list(sch["fixed"])
    entry["method"] = (sch.get("method", "") + " | k_walk: host time per blocked waiting request and step beyond the "
                       "logged scheduler time, fitted with h_adapter on the token interval of running requests "
                       "(calibration.fitting.serving_interval)")
    entry["interval_fit"] = {"heldout": c["heldout"], "params_ms": c["params"], "chosen_by_criterion": fit["chosen"],
                             "reference_committed_mixed": fit.get("committed_mixed_on_interval_target", {}).get("heldout")}
    if command:
        entry["command"] = command
    out["components"]["scheduler"] = entry
    out["provenance"] = {**out.get("provenance", {}), "variant": {
        "of": profile["name"], "command": command or "calibration.fitting.serving_interval.interval_variant",
        "changed": ["mixed: prefill_adapters, h_adapter", "scheduler: lora_queue -> lora_queue_walk (k_walk)"],
        "data": "calibration tables only (scheduler_overhead.csv serving runs, adapter_overhead_windows.csv)"}}
    Profile.from_dict(out, out["name"])  # must load exactly as the engine will
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--measurements", default=None, help="calibration/vllm085_h100 directory (default: under "
                                                         "$TWIN_DATA_DIR)")
    ap.add_argument("--profile", default="calibration/profiles/llama-3.1-8b_h100_vllm085.json")
    ap.add_argument("--write", action="store_true", help="write the variant profile beside --profile")
    a = ap.parse_args(argv)
    import os
    dd = a.measurements or str(Path(os.environ.get("TWIN_DATA_DIR", "")) / "calibration" / "vllm085_h100")
    if not Path(dd).is_dir():
        raise SystemExit(f"measurement directory {dd!r} not found: pass --measurements or set TWIN_DATA_DIR")
    pd_ = json.loads(Path(a.profile).read_text())
    prof = Profile.from_dict(pd_, pd_["name"])
    t = Vllm085Tables.read(dd, pd_["model"])
    fit = fit_interval(t, prof)
    print(json.dumps({k: v for k, v in fit.items()}, indent=1, default=float))
    if a.write:
        out = interval_variant(pd_, fit, command="python -m calibration.fitting.serving_interval --write")
        dst = Path(a.profile).with_name(out["name"] + ".json")
        dst.write_text(json.dumps(out, indent=1) + "\n")
        print(f"wrote {dst}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
