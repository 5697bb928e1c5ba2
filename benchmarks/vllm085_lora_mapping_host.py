"""Host CPU time of vLLM 0.8.5's per-step LoRA mapping, and whether the real runs show it (issue 17, item 1).

vLLM 0.8.5 (V1 engine) prepares every step's LoRA inputs on the host, in Python, before it
launches the forward pass and without overlapping the GPU:

* ``InputBatch.make_lora_inputs`` (``vllm/v1/worker/gpu_input_batch.py``) builds the token
  mapping as ``tuple(req_lora_mapping.repeat(num_scheduled_tokens))``: one numpy ``int32``
  scalar per scheduled token;
* ``LRUCacheWorkerLoRAManager._apply_adapters`` / ``add_adapter``
  (``vllm/lora/worker_manager.py``) calls ``self.list_adapters()`` for every distinct adapter of
  the batch: ``set(dict(self._registered_adapters.cache))`` (``LRUCacheLoRAModelManager.list_adapters``,
  ``adapter_commons/utils.py``), O(served). The registered adapters are a ``vllm.utils.LRUCache``
  (cachetools), whose ``cache`` property builds a ``_MappingOrderCacheView`` -- a ``UserDict`` that
  copies the entries with Python-level ``__setitem__`` calls -- which ``dict`` then reads through
  Python-level ``__getitem__`` calls: about 0.5 us per registered adapter per call on the stop-56 machine, not the
  ~9 ns of a plain dict's copy (the replica used a plain dict until stop 56);
* ``set_adapter_mapping`` compares the new mapping with the last one, then
  ``convert_mapping`` (``vllm/lora/punica_wrapper/utils.py``) walks the scheduled tokens in a
  Python loop and looks each token's adapter up with ``lora_index_to_id.index(...)`` -- a linear
  scan of the slot table (``max_loras`` entries, ``None`` for a free slot) that compares a Python
  int or ``None`` with a numpy scalar at every entry before the adapter's slot ("TODO index can
  be slow. optimize", in the source).

So a step costs about ``T * (a + b * position) + A * N * c`` of host time: ``T`` scheduled
tokens, ``position`` the mean slot index of their adapters, ``A`` distinct adapters of the
batch, ``N`` registered adapters. This script times a replica of that code (the same Python
operations on the same types, without torch: the final ``torch.tensor`` conversions are left
out) on this machine's CPU, fits ``a``, ``b`` and ``c`` by least squares, and prints the cost at
the validation runs' saturated step (``T`` = 2,048 tokens, vLLM's ``max_num_batched_tokens``
there). With ``--per-run results/validation/per_run.csv`` it also evaluates that cost at every
KV-saturated run of the fit split (``dt_modelling``; mean KV usage >= 0.9; the slot table
filled, position ``(min(slots, served) - 1) / 2``) and prints how the real-minus-twin ITL
residual relates to it, per slot range and by rank correlation. The real server's CPU is not
this one; the figures are this CPU's.

    python benchmarks/vllm085_lora_mapping_host.py
    python benchmarks/vllm085_lora_mapping_host.py --per-run results/validation/per_run.csv
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections import OrderedDict, UserDict
from collections.abc import KeysView
from pathlib import Path
from types import MappingProxyType

import numpy as np

#: vLLM's token budget per step in the validation runs (``max_num_batched_tokens``)
SATURATED_TOKENS = 2048


def _convert_mapping_loop(index_mapping: tuple, prompt_mapping: tuple, lora_index_to_id: list) -> list:
    """The Python part of vLLM 0.8.5 ``convert_mapping`` (up to the ``torch.tensor`` calls)."""
    index_mapping_indices = list(index_mapping).copy()
    embedding_indices = index_mapping_indices.copy()
    lora_indices = index_mapping_indices.copy()
    prompt = [lora_index_to_id.index(x) if x > 0 else -1 for x in prompt_mapping]
    for i in range(len(index_mapping_indices)):
        lora_idx = (lora_index_to_id.index(index_mapping_indices[i]) if index_mapping_indices[i] > 0 else -1)
        embedding_indices[i] = lora_idx if index_mapping_indices[i] > 0 else 0
        lora_indices[i] = lora_idx
    return [index_mapping_indices, lora_indices, embedding_indices, prompt]


class _MappingOrderCacheView(UserDict):
    """``vllm/utils.py`` (0.8.5): what ``LRUCache.cache`` returns, built anew at every access."""

    def __init__(self, data, ordered_keys) -> None:
        super().__init__(data)
        self.ordered_keys = ordered_keys

    def __iter__(self):
        return iter(self.ordered_keys)

    def keys(self):
        return KeysView(self.ordered_keys)


def apply_adapters(req_lora: np.ndarray, registered: dict, order: OrderedDict) -> None:
    """``_apply_adapters``: ``add_adapter`` per distinct adapter, each asking ``list_adapters()``
    (``set(dict(self._registered_adapters.cache))``: the view over cachetools' data and its LRU order,
    ``LRUCache.order`` a ``MappingProxyType``) whether the adapter is registered."""
    for lora_id in {int(x) for x in req_lora}:
        if lora_id not in set(dict(_MappingOrderCacheView(registered, MappingProxyType(order)))):
            raise RuntimeError("adapter not registered")


def map_tokens(req_lora: np.ndarray, tokens_per_req: np.ndarray, lora_index_to_id: list, last: tuple | None) -> tuple:
    """``make_lora_inputs``, the mapping comparison of ``set_adapter_mapping``, ``convert_mapping``."""
    prompt_mapping = tuple(req_lora)
    token_mapping = tuple(req_lora.repeat(tokens_per_req))
    mapping = (token_mapping, prompt_mapping, True)
    if last != mapping:
        _convert_mapping_loop(token_mapping, prompt_mapping, lora_index_to_id)
    return mapping


def _mean_ms(fn, min_s: float) -> float:
    n, t0 = 0, time.perf_counter()
    while True:
        fn()
        n += 1
        el = time.perf_counter() - t0
        if el >= min_s and n >= 3:
            return el / n * 1e3


def time_case(slots: int, served: int, n_req: int, tokens: int, seed: int = 0, min_s: float = 0.2) -> dict:
    """Mean host time of steps of ``tokens`` tokens over ``n_req`` requests whose adapters sit in a
    full slot table (``min(slots, served)`` adapters at random positions): the adapter checks
    (``apply_ms``) and the token mapping (``map_ms``), each timed on its own; every step's mapping
    is new, as in serving."""
    rng = random.Random(seed)
    occupied = min(slots, served)
    ids = rng.sample(range(1, served + 1), occupied)
    table: list = [None] * slots
    for pos, lid in zip(rng.sample(range(slots), occupied), ids):
        table[pos] = lid
    registered = {i: object() for i in range(1, served + 1)}
    order = OrderedDict.fromkeys(registered)
    req = np.array([rng.choice(ids) for _ in range(n_req)], dtype=np.int32)
    per = np.full(n_req, tokens // n_req)
    per[: tokens - int(per.sum())] += 1
    distinct = len(set(req.tolist()))
    mean_pos = float(np.mean([table.index(int(x)) for x in req.repeat(per)]))
    return {"slots": slots, "served": served, "requests": n_req, "tokens": tokens, "distinct": distinct,
            "mean_position": mean_pos, "apply_ms": _mean_ms(lambda: apply_adapters(req, registered, order), min_s),
            "map_ms": _mean_ms(lambda: map_tokens(req, per, table, None), min_s)}


def fit(rows: list[dict]) -> tuple[float, float, float]:
    """Least squares in relative terms (each case weighted by 1/its time) of
    map_ms = T*(a + b*position) and apply_ms = A*N*c; returns a, b, c in ns."""
    y = np.array([r["map_ms"] * 1e6 for r in rows])
    X = np.array([[r["tokens"], r["tokens"] * r["mean_position"]] for r in rows], float)
    (a, b), *_ = np.linalg.lstsq(X / y[:, None], np.ones(len(y)), rcond=None)
    ya = np.array([r["apply_ms"] * 1e6 for r in rows])
    an = np.array([r["distinct"] * r["served"] for r in rows], float) / ya
    c = float(an.sum() / (an @ an))
    return float(a), float(b), c


def per_run_check(path: Path, a: float, b: float, c: float, source: str) -> None:
    import pandas as pd
    from scipy import stats

    d = pd.read_csv(path)
    d = d[(d["source"] == source) & d["real_itl"].notna() & d["twin_itl"].notna() & (d["ts_mean_kv_usage"] >= 0.9)]
    if d.empty:
        print(f"no KV-saturated {source} run with both ITLs in {path}")
        return
    G, N = d["adapter_slots"].to_numpy(float), d["served_adapters"].to_numpy(float)
    occupied = np.minimum(G, N)
    host = (SATURATED_TOKENS * (a + b * (occupied - 1) / 2) + occupied * N * c) * 1e-6
    res = (d["real_itl"] - d["twin_itl"]).to_numpy(float)
    rho = stats.spearmanr(host, res).correlation
    print(f"\nKV-saturated {source} runs: {len(d)}; residual = real - twin mean ITL (ms)")
    print("slots     runs  residual median  host mapping cost median (ms, this CPU)")
    for lo, hi in ((0, 16), (16, 32), (32, 96), (96, 192), (192, 10_000)):
        m = (G > lo) & (G <= hi)
        if m.any():
            print(f"{lo + 1:>3}-{hi:<5} {m.sum():>5}  {np.median(res[m]):>15.1f}  {np.median(host[m]):>10.2f}")
    print(f"spearman(host cost, residual)={rho:.2f}")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-run", type=Path, default=None, help="a twin validate per_run.csv to check against")
    ap.add_argument("--source", default="dt_modelling", help="the split of --per-run to use (default: the fit split)")
    ap.add_argument("--quick", action="store_true", help="fewer cases (a smoke run)")
    a = ap.parse_args(argv)
    if a.per_run is not None and not a.per_run.is_file():
        ap.error(f"--per-run {a.per_run} is not a file; give a per_run.csv written by twin validate")
    slot_values = (8, 64, 256) if a.quick else (8, 16, 32, 64, 128, 192, 256, 448)
    rows = []
    print("slots served requests tokens distinct mean_position apply_ms map_ms")
    for slots in slot_values:
        for served, n_req, tokens in ((slots, 64, 256), (2 * slots, 256, SATURATED_TOKENS), (384, 512, SATURATED_TOKENS)):
            r = time_case(slots, max(served, 8), n_req, tokens, min_s=0.05 if a.quick else 0.2)
            rows.append(r)
            print(f"{r['slots']:>5} {r['served']:>6} {r['requests']:>8} {r['tokens']:>6} {r['distinct']:>8} "
                  f"{r['mean_position']:>13.1f} {r['apply_ms']:>8.3f} {r['map_ms']:>6.2f}", flush=True)
    ca, cb, cc = fit(rows)
    print(f"ns_per_token={ca:.1f}")
    print(f"ns_per_token_per_slot_position={cb:.2f}")
    print(f"ns_per_adapter_per_registered={cc:.2f}")
    for g in (16, 64, 128, 192, 448):
        ms = (SATURATED_TOKENS * (ca + cb * (g - 1) / 2) + g * 384 * cc) * 1e-6
        print(f"saturated_step_host_ms slots={g} served=384 tokens={SATURATED_TOKENS}: {ms:.2f}")
    if a.per_run is not None:
        per_run_check(a.per_run, ca, cb, cc, a.source)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
