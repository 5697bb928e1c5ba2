"""Tensor parallelism: the step's compute shrinks with the TP degree, adapter loads do not.

Megatron-style tensor parallelism (Shoeybi et al., 2019) splits every weight matrix over
``tp`` GPUs: each GPU computes ``1/tp`` of the GEMMs and reads ``1/tp`` of the weights and
KV, and two all-reduces per layer combine the partial results. A profile calibrated on one
GPU therefore becomes, for the variable part of a step,

    t_tp(P, D, C) = c0 + (t_1(P, D, C) - c0) / tp + 2 * layers * (alpha + bytes(P + D) * 2 (tp-1)/tp / bw)

with ``c0`` the fixed launch cost (not divided), ``bytes(n) = n * hidden * dtype_bytes`` the
activations all-reduced per layer (ring all-reduce moves ``2 (tp-1)/tp`` of them), ``alpha``
the per-collective latency and ``bw`` the NVLink bus bandwidth (``tp_allreduce_alpha_s``
and ``tp_link_gbps`` in the backbone parameters; defaults 8 us and 150 GB/s).

Adapter loads go the other way (Chameleon, MICRO'25, §3 and Figure 5): each GPU receives
its ``1/tp`` shard over its own PCIe link, but the fixed cost of a load stays, so loading
grows relative to compute as TP grows. :meth:`twin.perf.forms.LinkLoad.predict`
implements the shard (``bytes/tp`` plus the fixed cost); the engine passes ``tp`` to it.

A profile that was calibrated at the target degree says so with ``"tensor_parallel": tp``
in its JSON; it is then used as is.
"""

from __future__ import annotations

import copy

from twin.perf.profile import Profile


def tp_profile(profile: Profile, tp: int) -> Profile:
    """A copy of ``profile`` whose backbone step time is the TP-``tp`` one (see the module docstring)."""
    if tp <= 1 or int(profile.raw.get("tensor_parallel", 1)) == tp:
        return profile
    out = copy.copy(profile)
    bb = profile.components["backbone"]
    params = bb.params
    c0 = float(params.get("c0", 0.0))
    alpha = float(params.get("tp_allreduce_alpha_s", 8e-6))
    bw = float(params.get("tp_link_gbps", 150.0)) * 1e9
    m = profile.model
    per_tok = m.hidden * m.dtype_bytes * 2.0 * (tp - 1) / tp / bw
    layers2 = 2.0 * m.layers
    base = profile.backbone_s

    def backbone_s(prefill_tokens, decode_seqs, ctx_tokens):
        t1 = base(prefill_tokens, decode_seqs, ctx_tokens)
        return c0 + (t1 - c0) / tp + layers2 * (alpha + (prefill_tokens + decode_seqs) * per_tok)

    out.backbone_s = backbone_s
    out.raw = dict(profile.raw, tensor_parallel=tp, tensor_parallel_from=int(profile.raw.get("tensor_parallel", 1)))
    return out
