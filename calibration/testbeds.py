"""The testbeds of Chameleon's scaling study as the twin sees them: fit quality of the Vidur-based
profiles and the KV capacity of every model x memory x tensor-parallel degree.

``python -m calibration.testbeds`` prints both tables in Markdown (``results/calibration/testbeds.md``
holds its output). It reads only the committed profiles (no data directory needed):

* fit quality: the backbone's held-out MAPE / R2 per TP degree, from the profile (a model Vidur
  profiled on the GPU: k-fold over its token counts; one it did not: the shape model fitted
  without the model it predicts, see :func:`calibration.fitting.vidur.shape_model_heldout`);
* KV capacity: :func:`twin.tensor_parallel.kv_capacity_tokens` with LoRA off and with 16 adapter
  slots of rank 32, for every degree vLLM accepts up to 8 GPUs.
"""

from __future__ import annotations

import sys
from typing import TextIO

from twin.perf.profile import available_profiles, load_profile
from twin.tensor_parallel import kv_capacity_tokens, measured_degrees, valid_degrees

MODELS = ("llama-2-7b", "llama-2-13b", "llama-30b")
MEMORY_VARIANTS = ("a100-24gb", "a100-48gb", "a100-80gb")
SLOTS, RANK = 16, 32


def testbed_profiles() -> list[str]:
    """Names of the A40 and A100 Vidur-based profiles shipped."""
    names = ["llama-2-7b_a40_vidur"] + [f"{m}_{g}_vidur" for m in MODELS for g in MEMORY_VARIANTS]
    avail = available_profiles()
    return [n for n in names if avail.get(n) is not None]


def _cell(q: dict | None) -> str:
    return "-" if not q or "mape_pct" not in q else f"{q['mape_pct']:.2f} % / {q['r2']:.4f}"


def fit_quality_table(out: TextIO) -> None:
    """Backbone held-out MAPE / R2 per TP degree of each testbed profile."""
    out.write("| profile | linear ops from | TP 1 | TP 2 | TP 4 | TP 8 | other components |\n")
    out.write("|---|---|---|---|---|---|---|\n")
    for name in testbed_profiles():
        p = load_profile(name)
        bb = p.raw["components"]["backbone"]
        held = bb["fit"]["heldout"]
        source = ("Vidur's table of the model" if p.raw["provenance"].get("linear_ops", "measured") == "measured"
                  else "shape model of Vidur's tables (held out: a model it did not see)")
        cells = [_cell(held.get("all"))]
        tables = bb.get("tensor_parallel") or {}
        for tp in ("2", "4", "8"):
            cells.append(_cell(tables[tp]["fit"]["heldout"]["all"]) if tp in tables else
                         "analytical split" if int(tp) in valid_degrees(p.model) else "invalid degree")
        out.write(f"| {name} | {source} | " + " | ".join(cells) + " | estimated (see the profile's notes) |\n")


def kv_capacity_table(out: TextIO) -> None:
    """KV capacity (tokens) of every model x memory x valid TP degree up to 8."""
    out.write(f"| model | GPU | TP | backbone per rank | weights per GPU (GB) | KV tokens, LoRA off | KV tokens, "
              f"{SLOTS} slots of rank {RANK} | starts (one max_model_len request) |\n")
    out.write("|---|---|---|---|---|---|---|---|\n")
    for m in MODELS:
        for g in MEMORY_VARIANTS:
            name = f"{m}_{g}_vidur"
            if available_profiles().get(name) is None:
                continue
            p = load_profile(name)
            measured = measured_degrees(p)
            for tp in valid_degrees(p.model, 8):
                off, on = kv_capacity_tokens(p, tp, 0, 0), kv_capacity_tokens(p, tp, SLOTS, RANK)
                how = "TP 1 fit" if tp == 1 else "Vidur TP table" if tp in measured else "analytical split"
                out.write(f"| {m} | {p.gpu} | {tp} | {how} | {p.model.weight_bytes / tp / 1e9:.2f} | {off:,} | {on:,} | "
                          f"{'yes' if on >= p.model.max_model_len else 'no'} ({p.model.max_model_len:,}) |\n")


def main(out: TextIO = sys.stdout) -> int:
    out.write("## Fit quality (backbone, held-out MAPE / R2 against Vidur's linear-op time per step)\n\n")
    fit_quality_table(out)
    out.write("\n## KV capacity per model, memory and tensor-parallel degree\n\n")
    kv_capacity_table(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
