"""vLLM 0.8.5's per-step adapter check, fitted with the kernel grid and the mixed-step term (issue 17; a what-if).

Every step, ``LRUCacheWorkerLoRAManager._apply_adapters`` walks the batch's distinct adapters and asks, for
each, whether it is registered (``adapter_id not in self.list_adapters()``); ``list_adapters`` copies the
registry, a ``vllm.utils.LRUCache`` of ``max_cpu_loras`` entries, through Python-level ``__setitem__`` /
``__getitem__`` calls (read in the 0.8.5 wheel). So the host pays about ``c * A * N`` per step: ``A`` distinct
adapters in the batch, ``N`` registered adapters. ``benchmarks/vllm085_lora_mapping_host.py`` times a replica
of that code: ``c`` = 483 ns per pair on this machine, which is about 2.5x slower than the one its first
figures came from (README, "The LoRA mapping's host time").

The profile does not carry the term: the kernel grid's ``l_cta`` and ``l_active``, its ``split64_cost`` and the
mixed term's ``h_slot`` were fitted on calibration steps that contain this host time at the calibration's
own ``A`` and ``N``, which the validation runs exceed (up to 384 registered adapters). This module fits the
term *beside* them, as :func:`calibration.fitting.split64.fit_split64_with_mixed` fits the grid and the mixed
form: a fixed point that alternates (a) the grid (``l_cta``, ``l_active``, ``split64_cost``) and ``c`` on the
LoRA fit's rows (300-slot windows and serving runs without a queue; ``A`` and ``N`` are each row's mean
distinct adapters per step and served adapters), with the mixed excess subtracted, and (b) the mixed
``prefill_slots`` form on the three sources of :func:`calibration.fitting.mixed.fit_mixed`, with ``c * A * N``
added to their model. It prints both fixed points, without the term (the shipped profile's) and with it, and
their held-out scores: the mixed fit's criterion (mean over the sources of the grouped 5-fold MAPE of the mean
step; ``c`` is held at the full fit there) and the LoRA rows' grouped 5-fold MAPE (``c`` refitted per fold).

``--write`` writes the variant profile ``<model>_h100_vllm085_adaptercheck`` (:func:`adaptercheck_variant`): the
shipped profile with the grid and the mixed term of the second fixed point and the term as its
``adapter_check`` component (:class:`twin.perf.forms.RegistryPairsAdapterCheck`). The default profile is unchanged.
``python -m calibration.fitting.adapter_check [--data DIR] [--model NAME] [--json] [--write]``.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import sys
from typing import Any

import numpy as np

from calibration.fitting import components as C
from calibration.fitting import mixed as M
from calibration.fitting.core import ParamSpec, cross_val_predict, dropped_rows_reported, fit_params
from calibration.fitting.split64 import FIXED_POINT_MAX_ITER, LoraRows, _grid_candidate, _heldout_by_kind, _with_grid
from calibration.fitting.tables import FITTING_ERRORS, Vllm085Tables, fitting_error, fitting_parser, vllm085_directory
from twin.perf.profile import PROFILE_DIR, Profile, load_profile

#: ``c`` is fitted in ms per thousand (distinct adapter x registered adapter) pairs and step
PAIRS = 1000.0
#: the fixed point stops when no parameter moves by more than this, relative
RTOL = 1e-6


def _mixed_with_check(t: Vllm085Tables, prof: Profile, c_ms: float) -> dict[str, Any]:
    """The mixed ``prefill_slots`` fit (:func:`calibration.fitting.mixed.fit_mixed`) with ``c * A * N`` in the model."""
    obs = M.mixed_obs(t, prof)
    obs["model_ms"] = obs["model_ms"] + c_ms * obs["A"] * obs["N"] / PAIRS
    orig = M.mixed_obs
    M.mixed_obs = lambda *_a, **_k: obs  # (fit_mixed reads its rows through mixed_obs: these, with the term)
    try:
        return M.fit_mixed(t, prof, 5, forms=("prefill_slots",))
    finally:
        M.mixed_obs = orig


def fixed_point(t: Vllm085Tables, profile: dict[str, Any], with_check: bool) -> dict[str, Any]:
    """The grid, ``c`` (when ``with_check``) and the mixed term at their fixed point, with held-out scores and the
    ``profile`` dict with that grid and mixed term (without ``c``: the engine has no adapter-check term)."""
    name = profile.get("name", "<profile>")
    backbone = Profile.from_dict(profile, name).components["backbone"]
    rows = LoraRows.build(t, backbone)
    if rows is None:
        raise ValueError(f"adapter_check: the calibration's serving runs are not {profile.get('model')}'s")
    pairs = (rows.obs["A"] * rows.obs["N"]).to_numpy(float) / PAIRS
    cand = _grid_candidate(t.model, True)
    names = [s.name for s in cand.specs]

    def fit_rows(offset: np.ndarray, p0: dict[str, float] | None, idx: np.ndarray | None = None):
        idx = np.arange(len(rows.y)) if idx is None else idx
        sub, rank, an = rows.obs.iloc[idx], rows.rank[idx], pairs[idx]
        specs = [dataclasses.replace(s, p0=float(np.clip(p0[s.name], s.lo, s.hi))) if p0 and s.name in p0 else s
                 for s in cand.specs]
        if with_check:
            specs.append(ParamSpec("c", (p0 or {}).get("c", 0.2), 0.0, 10.0))

        def f(*th):
            v = C.window_lora_ms(backbone, cand.model(dict(zip(names, th[:len(names)]))), sub, rank)
            return v + th[-1] * an if with_check else v
        return fit_params(f, specs, rows.y[idx] - offset[idx], rows.sig[idx], "lora/kernel_grid+adapter_check")

    h_ms, vals = 0.0, None
    for rounds in range(1, FIXED_POINT_MAX_ITER + 1):
        offset = h_ms * rows.obs["pre_G"].to_numpy(float)
        fit = fit_rows(offset, vals)
        new = dict(fit.values)
        prof = Profile.from_dict(_with_grid(profile, cand, {k: new[k] for k in names}), name)
        entry = _mixed_with_check(t, prof, new.get("c", 0.0))
        (h_si,) = entry["params"].values()
        moved = vals is None or abs(h_si / M.MS - h_ms) > RTOL * max(h_ms, 1e-12) or max(
            abs(new[k] - vals[k]) / max(abs(vals[k]), 1e-12) for k in new) > RTOL
        vals, h_ms = new, h_si / M.MS
        if not moved:
            break
    else:
        raise ValueError(f"adapter_check: no fixed point in {FIXED_POINT_MAX_ITER} rounds")
    offset = h_ms * rows.obs["pre_G"].to_numpy(float)
    oof = offset + cross_val_predict(
        lambda idx: fit_rows(offset, vals, idx),
        lambda f, idx: C.window_lora_ms(backbone, cand.model({k: f.values[k] for k in names}), rows.obs.iloc[idx],
                                        rows.rank[idx]) + f.values.get("c", 0.0) * pairs[idx],
        len(rows.y), rows.obs["group"], 5)
    lora = _heldout_by_kind(rows, oof)
    held = entry["fit"]["heldout"]
    return {"with_adapter_check": with_check, "rounds": rounds,
            "params": {"l_cta_ns": float(vals["l_cta"]), "l_active_ns": float(vals["l_active"]),
                       "split64_cost": float(vals["split64_cost"]), "h_slot_ms": float(h_ms),
                       "c_us_per_pair": float(vals.get("c", 0.0)) * 1e3 / PAIRS},
            "mixed_criterion_pct": float(held["all"]["mape_pct"]),
            "mixed_heldout_pct": {s: float(held[s]["mape_pct"]) for s in M.SOURCES},
            "lora_rows_heldout_pct": {"windows": float(lora["windows"]["mape_pct"]),
                                      "serving runs without a queue": float(lora["run"]["mape_pct"])},
            "profile": _with_mixed(_with_grid(profile, cand, {k: vals[k] for k in names}), h_ms * M.MS)}


def _with_mixed(profile: dict[str, Any], h_slot_s: float) -> dict[str, Any]:
    """``profile`` with its mixed ``prefill_slots`` term's ``h_slot`` set (seconds per slot and step with a prefill)."""
    out = copy.deepcopy(profile)
    out["components"]["mixed"]["params"]["h_slot"] = float(f"{h_slot_s:.8g}")
    return out


def fit_adapter_check(directory=None, model: str = "llama-3.1-8b") -> list[dict[str, Any]]:
    """Both fixed points (without the term, then with it) on the calibration tables of ``model``, on the
    shipped vLLM 0.8.5 profile's backbone."""
    prof = load_profile(f"{model}_h100_vllm085")
    t = Vllm085Tables.read(vllm085_directory(directory), prof.raw["model"])
    profile = copy.deepcopy(prof.raw)
    return [fixed_point(t, profile, False), fixed_point(t, profile, True)]


def adaptercheck_variant(raw: dict[str, Any], point: dict[str, Any], command: str) -> dict[str, Any]:
    """The variant profile of ``raw`` (the shipped profile's dict) at ``point`` (the fixed point with the term)."""
    out = copy.deepcopy(point["profile"])
    p = point["params"]
    out["name"] = raw["name"] + "_adaptercheck"
    out["description"] = (raw.get("description", "") + "; variant 'adaptercheck' (issue 17): vLLM's per-step adapter "
                          "check, c_pair x distinct adapters x registered adapters, fitted with the kernel grid and the "
                          "mixed term (calibration.fitting.adapter_check)")
    out["components"]["adapter_check"] = {
        "form": "registry_pairs", "params": {"c_pair": float(f"{p['c_us_per_pair'] * 1e-6:.6g}")},
        "units": {"c_pair": "s/(distinct adapter x registered adapter)/step"},
        "fit": {"mixed_criterion_pct": round(point["mixed_criterion_pct"], 4),
                "mixed_heldout_pct": {k: round(v, 3) for k, v in point["mixed_heldout_pct"].items()},
                "lora_rows_heldout_pct": {k: round(v, 3) for k, v in point["lora_rows_heldout_pct"].items()},
                "rounds": point["rounds"]},
        "method": "fixed point of the kernel grid (l_cta, l_active, split64_cost) with c_pair on the LoRA fit's rows "
                  "and the mixed prefill_slots term on the serving runs and windows (calibration.fitting.adapter_check)"}
    out["provenance"] = {**raw.get("provenance", {}), "variant": {
        "of": raw["name"], "command": command,
        "changed": ["lora.l_cta", "lora.l_active", "lora.split64_cost", "mixed.h_slot", "adapter_check (new)"],
        "data": "the calibration tables only (no validation run)"}}
    Profile.from_dict(out, out["name"])  # must load exactly as the engine will
    return out


def main(argv: list[str] | None = None) -> int:
    ap = fitting_parser("adapter_check", __doc__)
    ap.add_argument("--write", action="store_true",
                    help="write the variant profile <model>_h100_vllm085_adaptercheck into calibration/profiles/")
    a = ap.parse_args(argv)
    try:
        with dropped_rows_reported("adapter_check"):
            points = fit_adapter_check(a.data, a.model)
    except FITTING_ERRORS as e:  # (an incomplete directory, an absent model)
        return fitting_error("adapter_check", e)
    if a.write:
        raw = load_profile(f"{a.model}_h100_vllm085").raw
        cmd = "python -m calibration.fitting.adapter_check" + (f" --model {a.model}" if a.model != "llama-3.1-8b" else "") \
            + " --write"
        variant = adaptercheck_variant(raw, points[1], cmd)
        path = PROFILE_DIR / f"{variant['name']}.json"
        path.write_text(json.dumps(variant, indent=1) + "\n")
        print(f"wrote {path}", file=sys.stderr)
    if a.json:
        print(json.dumps([{k: v for k, v in p.items() if k != "profile"} for p in points], indent=1))
        return 0
    for p in points:
        pr = p["params"]
        print(f"{'with' if p['with_adapter_check'] else 'without'} the adapter check ({p['rounds']} rounds): "
              f"l_cta {pr['l_cta_ns']:.4f} ns, l_active {pr['l_active_ns']:.3f} ns, split64_cost "
              f"{pr['split64_cost']:.4f}, h_slot {pr['h_slot_ms']:.5f} ms, c {pr['c_us_per_pair']:.4f} us per pair")
        print(f"  mixed criterion {p['mixed_criterion_pct']:.3f} % ("
              + ", ".join(f"{s} {v:.2f}" for s, v in p["mixed_heldout_pct"].items()) + "); LoRA rows held-out: "
              + ", ".join(f"{s} {v:.2f} %" for s, v in p["lora_rows_heldout_pct"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
