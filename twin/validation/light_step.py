"""Command line of :mod:`twin.validation.light_mix`: the profile's step in the real runs without a queue
against their mean TPOT (issue 17).

``python -m twin.validation.light_step`` prints real TPOT / model step (at each run's own mean
composition) by slot count for the fit and the test split, with ``twin validate``'s engine constants;
``--split64-cost`` evaluates the ``kernel_grid`` form with a 64-split working shrink block priced at
that share of an 8-split one (a what-if; the Llama profile's own, 0.58, is fitted on the calibration
tables at a fixed point with the mixed-step term, :mod:`calibration.fitting.split64`), ``--no-mixed``
without the profile's mixed-step term. Nothing is fitted here.
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any

from twin.perf.profile import Profile
from twin.validation.light_mix import light_runs, light_summary, step_at_light_mix
from twin.validation.profiles import cached_profile
from twin.validation.specs import RANK_TILE_COST, SERVING_S_PER_RUNNING, default_real_csv, load_real

__all__ = ["light_runs", "light_summary", "main", "step_at_light_mix", "with_split64_cost"]


def with_split64_cost(prof: Profile, cost: float) -> Profile:
    """:meth:`twin.perf.profile.Profile.with_split64_cost`, its errors naming ``--split64-cost``."""
    try:
        return prof.with_split64_cost(cost)
    except ValueError as e:
        raise ValueError(f"--split64-cost: {e}") from None


def _table(name: str, s: dict[str, Any]) -> list[str]:
    if not s:
        return [f"  {name}: no run without a queue"]
    bins = "  ".join(f"{k.removeprefix('slots ')}: {v['median']:.3f} ({v['runs']})" for k, v in s["by_slots"].items())
    return [f"  {name:<5} {s['runs']:>4} runs  median {s['median']:.3f}  SMAPE {s['smape']:.2f}   by slots {bins}"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m twin.validation.light_step", description=__doc__.split("\n\n")[0])
    ap.add_argument("--real", default=None, help="real-run table (default: the shared Llama validation CSV)")
    ap.add_argument("--profile", default=None, help="profile name or file (default: the runs' model's profile)")
    ap.add_argument("--serving-us", type=float, default=SERVING_S_PER_RUNNING * 1e6,
                    help="serving path's host time per running request and step, us (default: twin validate's)")
    ap.add_argument("--rank-tile-cost", type=float, default=RANK_TILE_COST,
                    help="rank tile cost (default: twin validate's)")
    ap.add_argument("--split64-cost", type=float, default=None,
                    help="what-if: a 64-split working shrink block at this share of an 8-split one (default: the "
                         "profile's own; 1 where it has none)")
    ap.add_argument("--no-mixed", action="store_true",
                    help="what-if: without the profile's mixed-step term (the cost of a step with a prefill per adapter "
                         "slot or distinct adapter, fitted on the calibration's serving runs, most of them queued)")
    ap.add_argument("--json", action="store_true", help="print the summaries as JSON")
    a = ap.parse_args(argv)
    try:
        if not (a.serving_us >= 0 and math.isfinite(a.serving_us)):
            raise ValueError(f"--serving-us {a.serving_us!r}: give microseconds per running request, >= 0")
        prof = cached_profile(a.profile).with_serving_host(a.serving_us * 1e-6).with_rank_tile_cost(a.rank_tile_cost)
        if a.split64_cost is not None:
            prof = with_split64_cost(prof, a.split64_cost)
        if a.no_mixed:
            prof = prof.without("mixed")
        real = load_real(a.real or default_real_csv())
    except (ValueError, FileNotFoundError, KeyError) as e:
        print(f"light_step: {e}", file=sys.stderr)
        return 2
    real = real[(real["status"] == "ok")].rename(columns={"mean_tpot_ms": "real_tpot"})
    real = real.assign(run_id=real["source"] + "/" + real["scenario"] + "/" + real["run_dir"])
    mix = step_at_light_mix(real, prof)
    out = {src: light_summary(mix[mix["source"] == src]) if len(mix) else {}
           for src in ("dt_modelling", "ml_test")}
    if a.json:
        import json

        print(json.dumps(out, indent=2))
        return 0
    print(f"real mean TPOT / profile step at the runs' own mean composition, runs without a queue "
          f"(profile {prof.name}, serving {a.serving_us:g} us, rank tile {a.rank_tile_cost:g}, split64 "
          f"{a.split64_cost if a.split64_cost is not None else 'profile'}{', without mixed' if a.no_mixed else ''}; "
          f"below 1: the model is too slow)")
    for src, name in (("dt_modelling", "fit"), ("ml_test", "test")):
        print("\n".join(_table(name, out[src])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
