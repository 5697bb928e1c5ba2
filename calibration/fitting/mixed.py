"""The serving step's excess over the calibrated model: the ``mixed`` profile component.

The published 600 s serving runs of the calibration tables (``scheduler_overhead.csv``,
``per_adapter_rate``; 8-448 adapter slots, one ~250-token prompt on 30-100 % of the steps,
with and without a waiting queue) measure a mean step that exceeds backbone + LoRA
(kernel grid) + measured scheduler time + measured adapter-load time by up to 35 ms, while
the 300-slot offline windows (1-word prompts, almost no prefill steps; up to 3,900 waiting,
220 running, 140 adapters per step) show none. :func:`fit_mixed` tries forms for that excess
-- engine host time per running request, per waiting request (the v1 scheduler's queue
walk), per adapter slot, per distinct adapter, and per slot or per adapter on the steps that
carry a prefill -- on the three sources together (every source the same weight), and chooses
by grouped 5-fold held-out error of the mean step (mean over the sources of the per-source
MAPE). Only forms the engine can evaluate exist as profile forms
(:class:`twin.perf.forms.PrefillSlotsMixed`); the others are scored and reported as rejected.

Targets: for runs with a queue the engine never idles, so ``duration / steps`` is the
measured mean step; for runs without one the client's mean ITL (the target the LoRA fit
uses); for the windows the step log's mean step. Step mixtures are those of
:func:`calibration.fitting.vllm085.serving_run_lora_obs` and of the LoRA windows.

``python -m calibration.fitting.mixed [--profile NAME] [--host-us US]`` prints every candidate's
held-out scores and parameters on the profile's backbone and LoRA components; ``--host-us`` fits
them net of a host time per running request and step in the serving runs (a what-if, see
:func:`mixed_obs`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import pandas as pd

from calibration.fitting import components as C
from calibration.fitting.core import ParamSpec, cross_val_predict, dropped_rows_reported, fit_params, quality
from calibration.fitting.tables import FITTING_ERRORS, Vllm085Tables, fitting_error, fitting_parser, vllm085_directory
from calibration.fitting.vllm085 import _serving_run_frame, lora_obs, per_adapter_serving_runs, serving_run_lora_obs
from twin.perf.forms import FORMS
from twin.perf.profile import Profile, load_profile

MS = 1e-3
SOURCES = ("serving runs with a queue", "serving runs without a queue", "300-slot windows")


@dataclass(frozen=True)
class MixedCandidate:
    """A form for the step excess (ms): its name, the terms' input columns, the profile form (or None)."""

    name: str
    terms: tuple[str, ...]
    units: tuple[str, ...]
    profile_form: str | None = None

    def predict(self, theta: np.ndarray, obs: pd.DataFrame) -> np.ndarray:
        return sum(th * obs[t].to_numpy(float) for th, t in zip(theta, self.terms))


#: candidate forms (ms per unit of each term); ``pre_G`` = share of steps with a prefill x slots
CANDIDATES: tuple[MixedCandidate, ...] = (
    MixedCandidate("prefill_slots", ("pre_G",), ("ms/adapter slot/step with prefill",), "prefill_slots"),
    MixedCandidate("running+waiting", ("R", "W"), ("ms/running request", "ms/waiting request")),
    MixedCandidate("running", ("R",), ("ms/running request",)),
    MixedCandidate("slots", ("G",), ("ms/adapter slot",)),
    MixedCandidate("prefill_adapters", ("pre_A",), ("ms/distinct adapter/step with prefill",), "prefill_adapters"),
    MixedCandidate("prefill_slots+running", ("pre_G", "R"), ("ms/adapter slot/step with prefill",
                                                           "ms/running request")),
    MixedCandidate("prefill_slots+waiting", ("pre_G", "W"), ("ms/adapter slot/step with prefill",
                                                           "ms/waiting request")),
)


def mixed_obs(t, profile: Profile, host_s_per_running: float = 0.0) -> pd.DataFrame:
    """Rows (one per serving run or window): measured mean step ``step_ms``, the calibrated
    model's ``model_ms`` (backbone + LoRA at the row's step mixture, + measured scheduler and
    load time), the inputs ``R W G A N pre pre_G pre_A`` (``N``: served adapters) and ``source``/``group``.

    ``host_s_per_running`` (a what-if; 0 for the profile): host time per running request and step
    added to the serving runs' model (not the offline windows'), as the validated engine's serving
    path adds it (``--serving-us``, results/validation/README.md items 11 and 16), so the mixed term
    is fitted net of it."""
    bb, lo = profile.components["backbone"], profile.components["lora"]
    s = per_adapter_serving_runs(t.sched).reset_index(drop=True)
    runs = _serving_run_frame(s)
    queued = (s["mean_waiting"] >= 1.0).to_numpy()
    step = np.where(queued, (s["duration_s"] / s["engine_steps"]).to_numpy(float) / MS, runs["step_ms"].to_numpy(float))
    runs = runs.assign(step_ms=step, source=np.where(queued, SOURCES[0], SOURCES[1]),
                       model_ms=C.window_lora_ms(bb, lo, runs, np.full(len(runs), 8.0)) + runs["sched_ms"])
    win, rank = lora_obs(t)
    win = win.assign(source=SOURCES[2], model_ms=C.window_lora_ms(bb, lo, win, rank) + win["sched_ms"])
    if host_s_per_running:
        runs = runs.assign(model_ms=runs["model_ms"] + host_s_per_running / MS * runs["R"])
    cols = ["group", "source", "step_ms", "model_ms", "R", "W", "G", "A", "S", "n_pre", "N"]
    return with_mixed_inputs(pd.concat([runs[cols], win[cols]], ignore_index=True))


def with_mixed_inputs(obs: pd.DataFrame) -> pd.DataFrame:
    """``obs`` (rows with ``S n_pre G A``) with the candidates' inputs: ``pre`` (share of steps with a
    prefill), ``pre_G`` and ``pre_A`` (slots and distinct adapters times that share)."""
    obs = obs.copy()
    obs["pre"] = np.minimum(obs["n_pre"].to_numpy(float) / obs["S"].to_numpy(float), 1.0)
    obs["pre_G"] = obs["pre"] * obs["G"]
    obs["pre_A"] = obs["pre"] * obs["A"]
    return obs


def _fit(cand: MixedCandidate, obs: pd.DataFrame, y: np.ndarray, sig: np.ndarray, idx: np.ndarray):
    sub = obs.iloc[idx]
    specs = [ParamSpec(f"h{i}", 0.01, 0.0, 10.0) for i in range(len(cand.terms))]
    return fit_params(lambda *th: cand.predict(np.array(th), sub), specs, y[idx], sig[idx], f"mixed/{cand.name}")


def fit_mixed(t, profile: Profile, k: int = 5, forms: tuple[str, ...] | None = None,
              host_s_per_running: float = 0.0) -> dict[str, Any]:
    """Fit every candidate on the serving runs and windows; the profile entry of the chosen form
    that the engine can evaluate, with every candidate's held-out scores (MAPE of the mean step
    per source, and the mean over the sources: the criterion). ``forms``: choose among these
    candidates only (every candidate is still scored and reported); used by
    :func:`calibration.fitting.split64.fit_split64_with_mixed`, which fits each form to a fixed
    point with the LoRA kernel grid. ``host_s_per_running``: see :func:`mixed_obs` (a what-if)."""
    obs = mixed_obs(t, profile, host_s_per_running)
    y = (obs["step_ms"] - obs["model_ms"]).to_numpy(float)
    src = obs["source"].to_numpy()
    counts = pd.Series(src).value_counts()
    sig = np.sqrt(np.array([counts[x] for x in src], float))
    step, base = obs["step_ms"].to_numpy(float), obs["model_ms"].to_numpy(float)
    scores: dict[str, dict[str, Any]] = {}
    none = {s: quality(step[src == s], base[src == s]) for s in SOURCES}
    none["all"] = {"mape_pct": float(np.mean([none[s]["mape_pct"] for s in SOURCES]))}
    scores["none"] = {"heldout": none, "params": {}}
    fits: dict[str, Any] = {}
    for cand in CANDIDATES:
        fit_idx: Callable = lambda idx, cand=cand: _fit(cand, obs, y, sig, idx)  # noqa: E731
        pred_idx: Callable = (lambda f, idx, cand=cand:  # noqa: E731
                              cand.predict(np.array(list(f.values.values())), obs.iloc[idx]))
        oof = base + cross_val_predict(fit_idx, pred_idx, len(obs), obs["group"], k)
        held = {s: quality(step[src == s], oof[src == s]) for s in SOURCES}
        held["all"] = {"mape_pct": float(np.mean([held[s]["mape_pct"] for s in SOURCES])),
                       "note": "mean of the per-source held-out MAPE of the mean step (selection criterion)"}
        full = fit_idx(np.arange(len(obs)))
        fits[cand.name] = full
        scores[cand.name] = {"heldout": held, "params": {f"{term} ({u})": float(f"{v:.6g}") for term, u, v in
                                                         zip(cand.terms, cand.units, full.values.values())},
                             "profile_form": cand.profile_form}
    # the criterion: lowest mean held-out MAPE; within 2 % relative, fewer terms
    pool = [c for c in CANDIDATES if forms is None or c.name in forms]
    if not pool:
        raise ValueError(f"mixed: no candidate form among {forms}; the forms are {[c.name for c in CANDIDATES]}")
    ranked = sorted(pool, key=lambda c: (scores[c.name]["heldout"]["all"]["mape_pct"], len(c.terms)))
    best = ranked[0].name
    near = [c for c in pool if scores[c.name]["heldout"]["all"]["mape_pct"]
            <= scores[best]["heldout"]["all"]["mape_pct"] * 1.02]
    chosen = min(near, key=lambda c: (len(c.terms), scores[c.name]["heldout"]["all"]["mape_pct"]))
    if chosen.profile_form is None:
        raise ValueError(f"mixed: the best form {chosen.name!r} has no engine form; add one to twin/perf/forms.py")
    f = fits[chosen.name]
    cls = FORMS[("mixed", chosen.profile_form)]
    (pname,) = cls.param_names
    entry = cls(params={pname: float(f"{float(f.values['h0']) * MS:.8g}")}).to_dict()
    entry["stderr"] = {pname: float(f"{f.stderr['h0'] * MS:.6g}")}
    entry["fit"] = {"heldout": scores[chosen.name]["heldout"], "n": int(len(obs)),
                    "rows": {s: int(counts.get(s, 0)) for s in SOURCES}}
    entry["candidates"] = scores
    entry["selection"] = {"chosen": chosen.name,
                          "criterion": "lowest mean over the sources of the held-out MAPE of the mean step "
                                       "(forms within 2 % relative: fewer terms); grouped 5-fold by run/window",
                          "ranking": [(c.name, round(scores[c.name]["heldout"]["all"]["mape_pct"], 3))
                                      for c in sorted(CANDIDATES, key=lambda c: (
                                          scores[c.name]["heldout"]["all"]["mape_pct"], len(c.terms)))]}
    entry["method"] = ("curve_fit (bounded TRF) of measured mean step - calibrated model (backbone + LoRA + "
                       "measured scheduler and load time) on the calibration's per-adapter-rate serving runs "
                       "(with and without a queue) and the 300-slot LoRA windows, each source the same weight")
    return entry


def add_mixed(profile: dict[str, Any], directory, k: int = 5, command: str = "") -> dict[str, Any]:
    """``profile`` (a vLLM 0.8.5 profile's dict) with its ``mixed`` component fitted from the
    tables in ``directory`` on the profile's own backbone and LoRA components."""
    t = Vllm085Tables.read(directory, profile["model"])
    prof = Profile.from_dict(profile, profile.get("name", "<profile>"))
    _, info = serving_run_lora_obs(t, prof.components["backbone"])
    if not info.get("used"):  # the serving runs were not served by this model (see serving_run_lora_obs)
        return profile
    entry = fit_mixed(t, prof, k)
    if command:
        entry["command"] = command
    out = dict(profile)
    out["components"] = {**profile["components"], "mixed": entry}
    Profile.from_dict(out, out.get("name", "<profile>"))  # must load exactly as the engine will
    return out


def main(argv: list[str] | None = None) -> int:
    ap = fitting_parser("mixed", __doc__, tables=False)
    ap.add_argument("--profile", default="llama-3.1-8b_h100_vllm085",
                    help="profile whose backbone and LoRA components the excess is measured against")
    ap.add_argument("--host-us", type=float, default=0.0,
                    help="what-if: host time per running request and step (microseconds) added to the serving "
                         "runs' model before the fit (the validated engine's --serving-us is 18)")
    a = ap.parse_args(argv)
    if not (0.0 <= a.host_us <= 1000.0):  # (also rejects nan)
        print(f"mixed: --host-us must be between 0 and 1000 microseconds (got {a.host_us})", file=sys.stderr)
        return 2
    try:
        directory = vllm085_directory(a.data)
        prof = load_profile(a.profile)
        with dropped_rows_reported("mixed"):
            t = Vllm085Tables.read(directory, prof.model)
            if "lora" not in prof.components or not serving_run_lora_obs(t, prof.components["backbone"])[1].get("used"):
                print(f"mixed: the calibration's serving runs were not served by {a.profile}'s model (see "
                      f"calibration.fitting.vllm085.serving_run_lora_obs), so they cannot price its mixed step; "
                      f"give --profile llama-3.1-8b_h100_vllm085", file=sys.stderr)
                return 2
            entry = fit_mixed(t, prof, host_s_per_running=a.host_us * 1e-6)
    except FITTING_ERRORS as e:
        return fitting_error("mixed", e)
    net = f", net of {a.host_us:g} us per running request and step in the serving runs" if a.host_us else ""
    print(f"mixed-step candidates on {a.profile}{net} (held-out MAPE of the mean step, %, grouped 5-fold; "
          f"criterion = mean of the three sources)")
    print(f"  {'form':<22} {'criterion':>9} {'queued':>7} {'no queue':>8} {'windows':>7}  parameters")
    for name, _ in entry["selection"]["ranking"] + [("none", None)]:
        c = entry["candidates"][name]
        h = c["heldout"]
        ps = ", ".join(f"{k} {v:.4g}" for k, v in c["params"].items()) or "-"
        print(f"  {name:<22} {h['all']['mape_pct']:>9.3f} {h[SOURCES[0]]['mape_pct']:>7.2f} "
              f"{h[SOURCES[1]]['mape_pct']:>8.2f} {h[SOURCES[2]]['mape_pct']:>7.2f}  {ps}")
    print(f"chosen: {entry['selection']['chosen']} ({entry['selection']['criterion']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
