"""Tensor parallelism: which degrees a model accepts, and a single-GPU profile split over ``tp`` GPUs.

Megatron-style tensor parallelism (Shoeybi et al., 2019), as vLLM implements it
(``vllm/model_executor/layers/linear.py``: ``QKVParallelLinear``, ``MergedColumnParallelLinear``,
``RowParallelLinear``; ``VocabParallelEmbedding``/``ParallelLMHead``), splits every weight matrix
over ``tp`` GPUs. What follows for the twin, all in :func:`tp_profile`:

* **Degrees** (:func:`valid_degrees`, :func:`check_degree`): the attention heads are split evenly, so
  ``tp`` must divide them; the KV heads too, or (grouped-query attention with fewer KV heads than
  GPUs) ``tp`` must be a multiple of them and each KV head is replicated -- vLLM's
  ``QKVParallelLinear`` asserts exactly this.
* **Compute** (backbone): each rank computes ``1/tp`` of every GEMM and reads ``1/tp`` of the weights
  and of the KV, and two all-reduces per layer combine the partial results. When the profile holds
  timings measured per TP degree (``components.backbone.tensor_parallel[str(tp)]``: Vidur's
  TP-specific operator tables, :mod:`calibration.fitting.vidur`), those parameters replace the
  single-GPU ones; otherwise the analytical split

      t_tp(P, D, C) = c0 + (t_1(P, D, C) - c0) / tp

  is used, ``c0`` the fixed launch/CPU cost (not divided). Either way the all-reduces are added:
  ``2 * layers * (alpha + bytes(P + D) * 2 (tp-1)/tp / bw)`` with ``bytes(n) = n * hidden *
  dtype_bytes`` (a ring all-reduce moves ``2 (tp-1)/tp`` of them), ``alpha`` the per-collective
  latency and ``bw`` the bus bandwidth (``tp_allreduce_alpha_s`` and ``tp_link_gbps`` in the backbone
  parameters; defaults 8 us and 150 GB/s).
* **LoRA compute**: vLLM's LoRA layers (``vllm/lora/layers.py``, ``fully_sharded_loras=False``) keep
  the column-parallel layers' ``A`` whole and shard their ``B`` over the outputs, and shard the
  row-parallel layers' ``A`` over the inputs with ``B`` whole. The ``kernel_grid`` form counts thread
  blocks from the output widths, so it is split by giving it each rank's widths (q, kv,
  gate/up and the LM head's vocabulary ``/tp``; o, down and the embedding keep ``hidden``); the
  ``additive`` form's per-adapter and per-token terms are divided by ``tp`` (launch ``l0`` kept);
  ``percent_of_base`` follows the split base step. A form that defines ``shard(model, tp)`` (e.g.
  a serving system's own LoRA form) is split by it; any other form is kept and the profile's
  ``tensor_parallel_split`` says so.
* **Loads** (:meth:`twin.perf.forms.LinkLoad.predict`; the engine passes ``tp``): vLLM loads an adapter on every
  worker (``WorkerLoRAManager._load_adapter`` reads the *whole* checkpoint, each LoRA layer's ``set_lora`` slices
  the worker's shard), so the disk -> CPU read is not divided by ``tp`` (the workers read the same file in
  parallel: the single-GPU time); each GPU receives its ``1/tp`` shard over its own host link, but the fixed
  cost of a load stays, so loading grows relative to compute as TP grows (Chameleon, MICRO'25, §3 and
  Figure 5). The measured single-GPU tables stay in use: their transfer part (at the fitted bandwidth) is
  divided by ``tp``, their fixed part kept, so a load never gets slower with more GPUs.
* **KV capacity** (:func:`kv_capacity_tokens`): each GPU holds ``1/tp`` of the weights, so its free
  memory grows by ``weights * (1 - 1/tp)``; a token's KV on a rank is ``2 * layers *
  max(1, kv_heads/tp) * head_dim * dtype_bytes``; the LoRA slot buffers per rank are the share
  :func:`lora_buffer_share` of the single-GPU ones. The runtime reserve (activations, CUDA graphs)
  and the LoRA-enable cost are kept per rank (an estimate on the safe side: vLLM's activation peak
  shrinks somewhat with TP). The KV capacity in tokens is the same on every rank and is the
  server's.

A profile that was calibrated at the target degree says so with ``"tensor_parallel": tp`` in its
JSON; it is then used as is -- its load tables too, which were measured with ``tp`` workers, so the engine
splits its loads by the run's degree over the calibrated one (:func:`load_split`, 1 there) -- and it runs at
that degree only: the splits above start from single-GPU times, so :func:`tp_profile` refuses to move a
TP-``N`` calibration to another degree (TP 1 included) instead of dividing TP-``N`` times again. The
serving engines call :func:`check_degree` (through the scenario's checks) and :func:`tp_profile`; a system
that cannot run tensor parallelism refuses ``tp > 1`` itself.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from twin.model_spec import ModelSpec
from twin.perf.forms import FORMS, PerfModel
from twin.perf.profile import Profile, kv_tokens_for_memory as _kv_tokens_for_memory_1
from twin.perf.profile import valid_degrees  # noqa: F401  (TP degrees vLLM accepts; defined beside the profile checks)

#: defaults of the all-reduce constants when the profile has none (estimates: NCCL ring latency, NVLink bus bandwidth)
DEFAULT_ALLREDUCE_ALPHA_S = 8e-6
DEFAULT_TP_LINK_GBPS = 150.0


class TensorParallelError(ValueError):
    """A tensor-parallel degree the model cannot be split by (the message names the valid degrees)."""


def check_degree(model: ModelSpec, tp: int) -> None:
    """Raise :class:`TensorParallelError` naming the valid degrees when ``tp`` cannot split ``model``."""
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise TensorParallelError(f"tensor-parallel degree must be a positive integer, got {tp!r}; valid degrees for "
                                  f"{model.name}: {', '.join(map(str, valid_degrees(model)))}")
    if tp not in valid_degrees(model):
        raise TensorParallelError(
            f"tensor-parallel degree {tp} does not divide {model.name}'s {model.heads} attention heads and "
            f"{model.kv_heads} KV heads (vLLM refuses it); use one of {', '.join(map(str, valid_degrees(model)))}")


def kv_heads_per_rank(model: ModelSpec, tp: int) -> int:
    """KV heads each rank holds: ``kv_heads / tp``, at least one (replicated when ``tp > kv_heads``)."""
    return max(1, model.kv_heads // tp)


def kv_bytes_per_token_per_rank(model: ModelSpec, tp: int) -> int:
    """Bytes of one token's K and V on one rank: ``2 * layers * kv_heads_per_rank * head_dim * dtype_bytes``."""
    return 2 * model.layers * kv_heads_per_rank(model, tp) * model.head_dim * model.dtype_bytes


def weight_bytes_per_rank(model: ModelSpec, tp: int) -> float:
    """Weights on one rank: every linear layer, the embedding and the LM head are split ``tp`` ways (the
    norms, replicated, are below 0.01 % of the weights)."""
    return model.weight_bytes / tp


def lora_buffer_share(model: ModelSpec, tp: int) -> float:
    """Share of the single-GPU LoRA slot buffers one rank holds under vLLM's layout (``fully_sharded_loras``
    off): column-parallel q, k, v, gate, up keep ``A`` (``hidden x r``) whole and shard ``B``; row-parallel
    o and down shard ``A`` and keep ``B`` (``r x hidden``) whole."""
    if tp <= 1:
        return 1.0
    h, q, kv, inter = model.hidden, model.heads * model.head_dim, model.kv_heads * model.head_dim, model.intermediate
    kv_r = kv_heads_per_rank(model, tp) * model.head_dim
    full = (3 * h + q + 2 * kv) + (q + h) + (2 * h + 2 * inter) + (inter + h)
    rank = (3 * h + q / tp + 2 * kv_r) + (q / tp + h) + (2 * h + 2 * inter / tp) + (inter / tp + h)
    return rank / full


# ------------------------------------------------------------------------------------ components
def _component(kind: str, form: str, params: dict[str, Any], meta: dict[str, Any]) -> PerfModel:
    obj = FORMS[(kind, form)](params=dict(params))
    obj.meta = dict(meta)
    return obj


def _split_kv(comp: PerfModel, model: ModelSpec, tp: int) -> PerfModel:
    """The KV component of one rank: weights ``/tp`` freed, per-rank KV bytes per token, per-rank LoRA buffers."""
    p = dict(comp.params)
    share = lora_buffer_share(model, tp)
    p["free_bytes"] = p["free_bytes"] + (model.weight_bytes - weight_bytes_per_rank(model, tp))
    p["slot_bytes_per_rank"] = p["slot_bytes_per_rank"] * share
    if "slot_fixed_bytes" in p:
        p["slot_fixed_bytes"] = p["slot_fixed_bytes"] * share
    p["kv_bytes_per_token"] = float(kv_bytes_per_token_per_rank(model, tp))
    return _component("kv", comp.form, p, comp.meta)


def _split_lora(comp: PerfModel, model: ModelSpec, tp: int) -> tuple[PerfModel, str]:
    """The LoRA component of one rank and how it was split (see the module docstring)."""
    if hasattr(comp, "shard"):
        return comp.shard(model, tp), f"{comp.form}: its own shard()"
    p = dict(comp.params)
    if comp.form == "kernel_grid":
        p.update(q_dim=float(model.heads // tp * model.head_dim),
                 kv_dim=float(kv_heads_per_rank(model, tp) * model.head_dim),
                 intermediate=float(model.intermediate // tp), vocab=float(math.ceil(model.vocab / tp)))
        return _component("lora", comp.form, p, comp.meta), "kernel_grid: per-rank widths of q, kv, gate/up, LM head"
    if comp.form == "additive":
        for key in ("l_adapter", "l_token", "l_adapter_token"):
            if key in p:
                p[key] = p[key] / tp
        return _component("lora", comp.form, p, comp.meta), "additive: per-adapter and per-token terms / tp"
    if comp.form == "percent_of_base":
        return comp, "percent_of_base: follows the split base step"
    return comp, f"{comp.form}: not split (no rule for this form)"


def _allreduce(params: dict[str, Any], model: ModelSpec, tp: int) -> tuple[float, float]:
    """(latency, seconds per token of the step) of one of the ``2 * layers`` all-reduces of a step."""
    alpha = float(params.get("tp_allreduce_alpha_s", DEFAULT_ALLREDUCE_ALPHA_S))
    bw = float(params.get("tp_link_gbps", DEFAULT_TP_LINK_GBPS)) * 1e9
    return alpha, model.hidden * model.dtype_bytes * 2.0 * (tp - 1) / tp / bw


def measured_degrees(profile: Profile) -> list[int]:
    """TP degrees the profile holds measured backbone parameters for (besides its own)."""
    tables = profile.components["backbone"].meta.get("tensor_parallel") or {}
    return sorted(int(k) for k in tables)


def calibrated_degree(profile: Profile) -> int:
    """The tensor-parallel degree ``profile`` prices: its JSON's ``tensor_parallel`` (1 when absent), or the degree
    :func:`tp_profile` split it to."""
    return int(profile.raw.get("tensor_parallel", 1))


def load_split(profile: Profile, tp: int) -> int:
    """The split of ``profile``'s adapter loads at TP ``tp`` (:meth:`twin.perf.forms.LinkLoad.predict`'s ``tp``):
    ``tp`` over the degree its load tables were measured at -- ``tp`` for a single-GPU calibration (also once
    :func:`tp_profile` has split its step times, which leaves the load tables single-GPU), 1 for a profile
    calibrated at ``tp`` (measured with ``tp`` workers)."""
    measured = int(profile.raw.get("tensor_parallel_from", profile.raw.get("tensor_parallel", 1)))
    return max(tp // measured, 1)


def tp_profile(profile: Profile, tp: int) -> Profile:
    """``profile`` split over ``tp`` GPUs (see the module docstring); the profile itself when ``tp`` is 1
    or the degree it was calibrated at. Raises :class:`TensorParallelError` for a degree the model refuses, and
    for a degree other than the calibrated one of a profile calibrated at TP > 1 (the splits start from
    single-GPU times)."""
    base = calibrated_degree(profile)
    if base == tp:
        return profile
    if base != 1:
        raise TensorParallelError(
            f"profile {profile.name!r} prices a server at tensor-parallel degree {base} (its \"tensor_parallel\": "
            f"{base}), not {tp}; run it at degree {base} (twin run --tp {base}; in a grid, [configs.engine] "
            f"tensor_parallel = {base}; EngineConfig(tensor_parallel={base})), or use a single-GPU profile" + (f", which the twin splits to TP {tp}" if tp > 1 else ""))
    if tp <= 1:
        return profile
    model = profile.model
    check_degree(model, tp)
    comps = dict(profile.components)
    bb = comps["backbone"]
    tables = bb.meta.get("tensor_parallel") or {}
    measured = str(tp) in tables
    if measured:
        meta = {k: v for k, v in bb.meta.items() if k != "tensor_parallel"}
        comps["backbone"] = _component("backbone", bb.form, {**bb.params, **tables[str(tp)]["params"]}, meta)
    comps["kv"] = _split_kv(comps["kv"], model, tp)
    comps["lora"], lora_how = _split_lora(comps["lora"], model, tp)
    raw = dict(profile.raw, tensor_parallel=tp, tensor_parallel_from=int(profile.raw.get("tensor_parallel", 1)),
               tensor_parallel_split={
                   "backbone": (f"measured TP-{tp} parameters" if measured else
                                "analytical: c0 + (t_1 - c0) / tp") + " + all-reduces",
                   "lora": lora_how, "load": "disk -> CPU: the whole checkpoint per worker, in parallel (the TP-1 time); "
                                            "CPU -> GPU: the TP-1 time's transfer part / tp + its fixed part",
                   "kv": "weights / tp, KV heads per rank, per-rank LoRA buffers"})
    out = Profile(name=profile.name, model=model, components=comps, gpu=profile.gpu, software=profile.software,
                  lora_targets=profile.lora_targets, raw=raw, serving_s_per_running=profile.serving_s_per_running)
    alpha, per_tok = _allreduce(bb.params, model, tp)
    layers2 = 2.0 * model.layers
    inner = out.backbone_s
    if measured:
        def backbone_s(prefill_tokens, decode_seqs, ctx_tokens):
            return inner(prefill_tokens, decode_seqs, ctx_tokens) + layers2 * (
                alpha + (prefill_tokens + decode_seqs) * per_tok)
    else:
        c0 = float(bb.params.get("c0", 0.0))

        def backbone_s(prefill_tokens, decode_seqs, ctx_tokens):
            t1 = inner(prefill_tokens, decode_seqs, ctx_tokens)
            return c0 + (t1 - c0) / tp + layers2 * (alpha + (prefill_tokens + decode_seqs) * per_tok)
    out.backbone_s = backbone_s
    return out


# ------------------------------------------------------------------------------------ KV capacity
def kv_capacity_tokens(profile: Profile, tp: int, slots: int, max_rank: int) -> int:
    """KV capacity (tokens) of ``profile``'s server at TP ``tp`` with ``slots`` adapter slots of ``max_rank``."""
    return tp_profile(profile, tp).kv_capacity_tokens(slots, max_rank)


def kv_tokens_for_memory(profile: Profile, gpu_mem_gb: float, slots: int, max_rank: int, tp: int = 1,
                         utilization: float = 0.9, runtime_overhead_gb: float = 5.0) -> int:
    """:func:`twin.perf.profile.kv_tokens_for_memory` per rank of a TP-``tp`` server: ``gpu_mem_gb`` GB per
    GPU, ``1/tp`` of the weights, per-rank KV bytes per token and LoRA buffers (see the module docstring)."""
    if tp <= 1:
        return _kv_tokens_for_memory_1(profile, gpu_mem_gb, slots, max_rank, utilization, runtime_overhead_gb)
    check_degree(profile.model, tp)
    m = profile.model
    # one rank's share of the model: 1/tp of the weights, its KV heads (head_dim = hidden / heads unchanged)
    shard = dataclasses.replace(m, params_b=m.params_b / tp, kv_heads=kv_heads_per_rank(m, tp))
    split = Profile(name=profile.name, model=shard, components=dict(profile.components), gpu=profile.gpu,
                    software=profile.software, lora_targets=profile.lora_targets, raw=profile.raw)
    kv = dict(split.components["kv"].params)
    if kv.get("slot_bytes_per_rank"):
        kv["slot_bytes_per_rank"] = kv["slot_bytes_per_rank"] * lora_buffer_share(m, tp)
        split.components["kv"] = _component("kv", split.components["kv"].form, kv, split.components["kv"].meta)
    return _kv_tokens_for_memory_1(split, gpu_mem_gb, slots, max_rank, utilization, runtime_overhead_gb)
