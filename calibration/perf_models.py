"""Performance-model forms the engine evaluates, one small class per equation.

Every duration the engine spends comes from a :class:`twin.profile.Profile`, which
holds one component per *kind*:

==============  ==============================================================
kind            question answered
==============  ==============================================================
``backbone``    step latency of the base model for a batch
``lora``        extra compute of the LoRA kernels in that step
``scheduler``   CPU time of the scheduler per step
``load``        time to bring an adapter to the GPU (from disk or CPU memory)
``kv``          KV-cache capacity (tokens) given adapter slots and max rank
==============  ==============================================================

A form is registered under ``(kind, name)``; a profile file names the form and its
parameters, so a fitted profile can choose a better-founded equation than the default
one without any change to the engine. ``predict`` methods accept numpy arrays for the
batch-size arguments (the engine evaluates runs of identical decode steps at once), and
must only use ``+ - * /`` and ``np.maximum``/``np.minimum`` so that evaluating one
step or many gives bit-identical results.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

FORMS: dict[tuple[str, str], type["PerfModel"]] = {}


def register_form(cls: type["PerfModel"]) -> type["PerfModel"]:
    FORMS[(cls.kind, cls.form)] = cls
    return cls


def make_component(kind: str, spec: dict[str, Any]) -> "PerfModel":
    """Build a component from its profile entry ``{"form": ..., "params": {...}, ...}``."""
    form = spec.get("form")
    if (kind, form) not in FORMS:
        known = sorted(f for k, f in FORMS if k == kind)
        raise ValueError(f"profile component {kind!r} names unknown form {form!r}; known forms: {known}")
    cls = FORMS[(kind, form)]
    missing = [p for p in cls.param_names if p not in spec.get("params", {})]
    if missing:
        raise ValueError(f"profile component {kind}/{form} lacks parameters {missing}")
    obj = cls(params={k: spec["params"][k] for k in spec["params"]})
    obj.meta = {k: v for k, v in spec.items() if k not in ("form", "params")}
    return obj


@dataclass
class PerfModel:
    """Base class: a named equation with named parameters."""

    kind: ClassVar[str] = ""
    form: ClassVar[str] = ""
    param_names: ClassVar[tuple[str, ...]] = ()
    units: ClassVar[dict[str, str]] = {}
    params: dict[str, float] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    def __getattr__(self, item: str) -> float:  # p.c0 -> params["c0"]
        params = self.__dict__.get("params", {})
        if item in params:
            return params[item]
        raise AttributeError(item)

    def to_dict(self) -> dict[str, Any]:
        d = {"form": self.form, "equation": (type(self).__doc__ or "").strip().splitlines()[0],
             "params": dict(self.params), "units": dict(self.units)}
        d.update(self.meta)
        return d


@register_form
@dataclass
class LinearBackbone(PerfModel):
    """t = c0 + c_prefill*P + c_decode*D + c_ctx*C  (P prefill tokens, D decode sequences, C context tokens).

    A roofline-style linear model of one engine step: a fixed launch/sync cost, a
    per-prefill-token cost (compute bound GEMMs), a per-decode-sequence cost and a
    per-context-token attention cost (memory bound KV reads).
    """

    kind: ClassVar[str] = "backbone"
    form: ClassVar[str] = "linear"
    param_names: ClassVar[tuple[str, ...]] = ("c0", "c_prefill", "c_decode", "c_ctx")
    units: ClassVar[dict[str, str]] = {"c0": "s", "c_prefill": "s/token", "c_decode": "s/sequence",
                                      "c_ctx": "s/context token"}

    def predict(self, prefill_tokens, decode_seqs, ctx_tokens):
        p = self.params
        return p["c0"] + p["c_prefill"] * prefill_tokens + p["c_decode"] * decode_seqs + p["c_ctx"] * ctx_tokens


@register_form
@dataclass
class PercentLora(PerfModel):
    """extra = base * (k6*A + k7)/100 - base  for A >= 1 distinct adapters in the step, else 0.

    The published adapter twin's form (Agullo et al. 2025): the step time with LoRA is
    ``K6*A + K7`` percent of the step time without it. ``rank_coef`` adds a per-rank
    term ``rank_coef*(max_rank - 8)`` percent (0 when the data cannot tell ranks apart).
    """

    kind: ClassVar[str] = "lora"
    form: ClassVar[str] = "percent_of_base"
    param_names: ClassVar[tuple[str, ...]] = ("k6", "k7")
    units: ClassVar[dict[str, str]] = {"k6": "% of base per adapter", "k7": "% of base",
                                      "rank_coef": "% of base per rank above 8"}

    def predict(self, base_s, n_adapters, max_rank, lora_tokens):
        p = self.params
        pct = p["k6"] * n_adapters + p["k7"] + p.get("rank_coef", 0.0) * (max_rank - 8)
        extra = base_s * (pct / 100.0) - base_s
        return np.where(n_adapters > 0, np.maximum(extra, 0.0), 0.0) if isinstance(extra, np.ndarray) else (
            max(extra, 0.0) if n_adapters > 0 else 0.0)


@register_form
@dataclass
class PeerScheduler(PerfModel):
    """t = k0 + k1*R_running + k2*R_waiting + k3*R_waiting*(G/N)  (G slots, N served adapters)."""

    kind: ClassVar[str] = "scheduler"
    form: ClassVar[str] = "linear_queue"
    param_names: ClassVar[tuple[str, ...]] = ("k0", "k1", "k2", "k3")
    units: ClassVar[dict[str, str]] = {"k0": "s", "k1": "s/running request", "k2": "s/waiting request",
                                      "k3": "s/waiting request"}

    def predict(self, running, waiting, slots, served):
        p = self.params
        ratio = slots / served if served else 0.0
        return p["k0"] + p["k1"] * running + p["k2"] * waiting + p["k3"] * waiting * ratio


@register_form
@dataclass
class LinkLoad(PerfModel):
    """t = fixed_src + bytes / bw_src  per source ('disk' -> CPU, 'cpu' -> GPU), optionally a per-rank table.

    ``table_s`` (``{"cpu": {"8": s, ...}, "disk": {...}}``) holds measured means per rank;
    ranks not in the table use the link model. With tensor parallelism each GPU receives
    ``bytes/tp`` over its own link, but the fixed cost stays (Chameleon Fig. 5).
    """

    kind: ClassVar[str] = "load"
    form: ClassVar[str] = "link"
    param_names: ClassVar[tuple[str, ...]] = ("disk_fixed_s", "disk_gbps", "cpu_fixed_s", "cpu_gbps")
    units: ClassVar[dict[str, str]] = {"disk_fixed_s": "s", "disk_gbps": "GB/s", "cpu_fixed_s": "s",
                                      "cpu_gbps": "GB/s"}

    def predict(self, rank: int, nbytes: int, source: str, tp: int = 1) -> float:
        table = self.params.get("table_s", {})
        if tp == 1 and source in table and str(rank) in table[source]:
            return float(table[source][str(rank)])
        if source not in ("disk", "cpu"):
            raise ValueError(f"adapter load source must be 'disk' or 'cpu', got {source!r}")
        p = self.params
        return p[f"{source}_fixed_s"] + (nbytes / tp) / (p[f"{source}_gbps"] * 1e9)


@register_form
@dataclass
class MemoryBudgetKV(PerfModel):
    """tokens = floor((free_bytes - slots * slot_bytes_per_rank * max_rank) / kv_bytes_per_token / 16) * 16.

    vLLM reserves, for every adapter slot, LoRA buffers padded to ``max_lora_rank`` for
    all target modules; what is left of ``gpu_memory_utilization * memory`` after the
    weights, activations, CUDA graphs and those buffers becomes KV blocks.
    """

    kind: ClassVar[str] = "kv"
    form: ClassVar[str] = "memory_budget"
    param_names: ClassVar[tuple[str, ...]] = ("free_bytes", "slot_bytes_per_rank", "kv_bytes_per_token")
    units: ClassVar[dict[str, str]] = {"free_bytes": "bytes", "slot_bytes_per_rank": "bytes per slot per rank",
                                      "kv_bytes_per_token": "bytes"}

    def predict(self, slots: int, max_rank: int) -> int:
        p = self.params
        free = p["free_bytes"] - slots * p["slot_bytes_per_rank"] * max_rank
        return int(max(free, 0) // p["kv_bytes_per_token"] // 16 * 16)
