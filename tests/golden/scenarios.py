"""Golden scenarios: the twin's outputs on fixed inputs, stored as values and hashes.

They guard refactors that must not change behaviour: every scenario runs through the
``twin`` command (the flags are the stable surface), and its summary figures, per-request
and per-step tables (hashed) must be bit-identical to those stored in ``golden.json``.
A change that is *meant* to alter results regenerates the file and says why in its commit::

    TWIN_DATA_DIR=../shared/data python -m tests.golden.scenarios   # rewrites golden.json

Scenarios that read the real data directory are marked ``data`` and skipped without it.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
import tempfile
from contextlib import redirect_stdout
from io import StringIO
from pathlib import Path
from typing import Any

import pandas as pd

GOLDEN = Path(__file__).with_name("golden.json")
#: summary keys that measure the machine, not the twin, or restate its inputs (workload, config, scenario)
VOLATILE = {"wall_s", "sim_wall_s", "x_realtime", "workload", "config", "scenario"}

PRESETS_SHORT = ["vllm", "slora", "slora+sjf", "chameleon", "chameleon-nocache", "chameleon-nosched",
                 "chameleon-lru", "chameleon-fairshare", "chameleon-static", "chameleon-output-only",
                 "chameleon+prefetch", "adapter-aware", "ema-prefetch", "ema-prefetch-sync", "ema-per-request-sync",
                 "vllm-contiguous", "vllm-paged"]
PRESETS_CONV = ["fastlibra", "fastlibra-wom", "fastlibra-wos", "fastlibra-wol", "vllm-partition"]


def _slots(preset: str) -> list[str]:
    """``--slots 8`` for a preset on the vLLM engine; none for one on S-LoRA, which has no adapter slots
    (``twin run`` refuses the flag there; it never changed an S-LoRA run's results)."""
    from twin.registry import resolve_system

    return [] if resolve_system(preset) == "slora" else ["--slots", "8"]


def _scenarios() -> dict[str, tuple[str, list[str], bool]]:
    """name -> (kind, twin arguments (for ``api``: trace, preset, duration, rps, adapters, KV tokens), needs real data)."""
    sc: dict[str, tuple[str, list[str], bool]] = {
        "run-default": ("run", ["run"], False),
        "run-splitwise-chameleon": ("run", ["run", "--trace", "splitwise", "--policy", "chameleon",
                                            "--duration", "240"], True),
        "run-splitwise-vllm-tp2": ("run", ["run", "--trace", "splitwise", "--rps", "2", "--duration", "120",
                                           "--tp", "2", "--slots", "8"], True),
        "run-adapter-twin-gpu-mem": ("run", ["run", "--trace", "adapter-twin", "--duration", "300", "--slots",
                                             "32", "--gpu-mem-gb", "80", "--ttft-slo", "0.5", "--tbt-slo",
                                             "0.05"], False),
    }
    for p in PRESETS_SHORT:
        sc[f"preset-{p}"] = ("run", ["run", "--trace", "synthetic", "--duration", "90", "--rps", "1.5",
                                     "--policy", p, *_slots(p)], False)
    for p in PRESETS_CONV:
        sc[f"preset-{p}"] = ("run", ["run", "--trace", "multiturn-synth", "--duration", "90", "--adapters", "40",
                                     "--policy", p, *_slots(p)], False)
    for p in ("chameleon", "chameleon-lru", "chameleon-fairshare", "chameleon-nocache", "chameleon+prefetch", "slora",
              "vllm"):
        sc[f"pressure-{p}"] = ("api", ["synthetic", p, "90", "1.5", "60", "40000"], False)
    for p in ("fastlibra", "fastlibra-wom", "fastlibra-wos", "fastlibra-wol", "vllm-partition"):
        sc[f"pressure-{p}"] = ("api", ["multiturn-synth", p, "90", "1.0", "300", "30000"], False)
    sc["compare-synthetic"] = ("compare", ["compare", "--trace", "synthetic", "--policies", "vllm,slora",
                                           "--rps", "1,2", "--duration", "60", "--slots", "8", "--jobs", "1"], False)
    sc["validate-dt3"] = ("validate", ["validate", "--filter", "source=='dt_modelling'", "--limit", "3",
                                       "--jobs", "1", "--no-figures", "--no-progress"], True)
    sc["calibrate-fit-llama"] = ("fit", ["calibrate", "fit", "--model", "llama-3.1-8b", "--quiet"], True)
    return sc


SCENARIOS = _scenarios()


def frame_hash(df: pd.DataFrame) -> str:
    """SHA-256 of a table's values, column names and dtypes (row order matters)."""
    h = hashlib.sha256()
    h.update(json.dumps([[str(c), str(t)] for c, t in df.dtypes.items()]).encode())
    if len(df):
        h.update(pd.util.hash_pandas_object(df, index=False).to_numpy().tobytes())
    return h.hexdigest()[:20]


def _clean(v: Any) -> Any:
    if isinstance(v, float):
        return None if math.isnan(v) else repr(v)
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in sorted(v.items()) if k not in VOLATILE}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    return v


def _twin(args: list[str]) -> str:
    from twin.cli import main

    buf = StringIO()
    with redirect_stdout(buf):
        rc = main(args)
    if rc != 0:
        raise RuntimeError(f"twin {' '.join(args)} exited {rc}")
    return buf.getvalue()


def compute(name: str) -> dict[str, Any]:
    """Run one scenario and return what is compared."""
    from traces.datadir import data_dir

    kind, args, _ = SCENARIOS[name]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        if kind == "run":
            _twin(args + ["--out", str(out), "--no-progress"])
            summary = json.loads((out / "summary.json").read_text())
            return {"summary": _clean(summary), "requests": frame_hash(pd.read_parquet(out / "requests.parquet")),
                    "steps": frame_hash(pd.read_parquet(out / "steps.parquet"))}
        if kind == "api":  # KV pressure (needs max_model_len, which the CLI does not set)
            from traces.registry import get_workload
            from twin.config import EngineConfig
            from twin.simulate import simulate

            trace, policy, dur, rps, adapters, kv = args
            w = get_workload(trace, duration=float(dur), rps=float(rps), adapters=int(adapters), seed=0)
            res = simulate(w, None, EngineConfig(max_loras=8, max_model_len=8192, kv_capacity_tokens=int(kv)),
                           policy=policy, check_invariants=True)
            return {"summary": _clean(res.summary), "requests": frame_hash(res.requests),
                    "steps": frame_hash(res.steps)}
        if kind == "compare":
            _twin(args + ["--out", str(out)])
            df = pd.read_csv(out / "compare.csv")
            # (reject_reasons: the text of the rejected counts, which are hashed; added after the stored results)
            return {"compare": frame_hash(df.drop(columns=[c for c in df.columns if "wall" in c or c == "reject_reasons"]))}
        if kind == "validate":
            _twin(args + ["--out", str(out)])
            df = pd.read_csv(out / "per_run.csv")
            # the data directory's location differs between machines: compare paths relative to it
            summary = json.loads((out / "summary.json").read_text().replace(str(data_dir()), "$TWIN_DATA_DIR"))
            return {"per_run": frame_hash(df.drop(columns=[c for c in df.columns if "wall" in c])),
                    "summary": _clean(summary)}
        if kind == "fit":
            prof = Path(tmp) / "p.json"
            _twin(args + ["--measurements", str(data_dir() / "calibration" / "vllm085_h100"), "--out", str(prof)])
            d = json.loads(prof.read_text())
            return {"components": _clean({k: v.get("params") for k, v in d["components"].items()})}
    raise ValueError(kind)


def main(argv: list[str]) -> int:
    names = argv or list(SCENARIOS)
    old = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
    for n in names:
        print(n, file=sys.stderr)
        old[n] = compute(n)
    GOLDEN.write_text(json.dumps(old, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
