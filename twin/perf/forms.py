"""Performance-model forms the engine evaluates, one small class per equation.

Every duration the engine spends comes from a :class:`twin.perf.profile.Profile`, which
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
    #: parameters whose term grows with the waiting queue (scheduler forms); None: assume all
    waiting_params: ClassVar[tuple[str, ...] | None] = None
    #: backbone forms whose scalar path adds ``c * ctx_tokens`` last, so that
    #: ``scalar()(P, D, C) == scalar()(P, D, 0) + c * C`` bit for bit: the name of ``c`` (None: not so)
    ctx_last_param: ClassVar[str | None] = None
    #: lora forms: whether the extra time depends on the base step time (``base_s``)
    uses_base: ClassVar[bool] = True
    #: lora forms: whether they price each request at its own rank from ``rank_sums`` (the sums of
    #: the step's requests' ranks over its requests and over its LoRA tokens, which the engine then
    #: passes); the others take and ignore it, every request counting at ``max_rank``
    own_ranks: ClassVar[bool] = False
    units: ClassVar[dict[str, str]] = {}
    #: constants whose physical meaning requires them to be >= 0 (a time, a cost per token, block, request or
    #: adapter, a byte count), optional ones included, and those that must be > 0 (a bandwidth, a divisor): checked
    #: when a profile loads (:func:`twin.perf.profile.Profile.from_dict`), from this declaration and not from the
    #: file's own ``units``. A constant in neither may take either sign (e.g. ``linear_queue``'s ``k3``, the
    #: published twin's ``K3 ~ -K2``; ``free_bytes`` of a model one GPU cannot hold): the load-time range check
    #: (:meth:`twin.perf.profile.Profile._check_range`) then refuses a sign that makes a term negative.
    nonneg_params: ClassVar[tuple[str, ...]] = ()
    positive_params: ClassVar[tuple[str, ...]] = ()
    params: dict[str, float] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    def __getattr__(self, item: str) -> float:  # p.c0 -> params["c0"]
        params = self.__dict__.get("params", {})
        if item in params:
            return params[item]
        raise AttributeError(item)

    def scalar(self):
        """A fast callable for scalar arguments, equal to :meth:`predict` (the engine's hot
        path evaluates one step at a time). Forms override it with a closure over their
        constants; the default wraps :meth:`predict`."""
        predict = self.predict
        return lambda *args: float(predict(*args))

    def to_dict(self) -> dict[str, Any]:
        d = {"form": self.form, "equation": (type(self).__doc__ or "").strip().splitlines()[0],
             "params": dict(self.params), "units": dict(self.units)}
        d.update(self.meta)
        return d


#: the optional all-reduce constants every backbone form may carry (:mod:`twin.tensor_parallel`): a latency per
#: collective (>= 0) and a bus bandwidth (> 0)
_TP_NONNEG = ("tp_allreduce_alpha_s",)
_TP_POSITIVE = ("tp_link_gbps",)


@register_form
@dataclass
class LinearBackbone(PerfModel):
    """t = c0 + c_prefill*P + c_decode*D + c_ctx*C  (P prefill tokens, D decode sequences, C context tokens).

    A roofline-style linear model of one engine step: a fixed launch/sync cost, a
    per-prefill-token cost (compute bound GEMMs), a per-decode-sequence cost and a
    per-context-token attention cost (memory bound KV reads).
    """

    ctx_last_param: ClassVar[str | None] = "c_ctx"
    kind: ClassVar[str] = "backbone"
    form: ClassVar[str] = "linear"
    param_names: ClassVar[tuple[str, ...]] = ("c0", "c_prefill", "c_decode", "c_ctx")
    units: ClassVar[dict[str, str]] = {"c0": "s", "c_prefill": "s/token", "c_decode": "s/sequence",
                                      "c_ctx": "s/context token"}
    nonneg_params: ClassVar[tuple[str, ...]] = ("c0", "c_prefill", "c_decode", "c_ctx") + _TP_NONNEG
    positive_params: ClassVar[tuple[str, ...]] = _TP_POSITIVE

    def predict(self, prefill_tokens, decode_seqs, ctx_tokens):
        p = self.params
        return p["c0"] + p["c_prefill"] * prefill_tokens + p["c_decode"] * decode_seqs + p["c_ctx"] * ctx_tokens

    def scalar(self):
        p = self.params
        c0, cp, cd, cc = float(p["c0"]), float(p["c_prefill"]), float(p["c_decode"]), float(p["c_ctx"])
        return lambda P, D, C: c0 + cp * P + cd * D + cc * C


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
    nonneg_params: ClassVar[tuple[str, ...]] = ("k6", "k7", "rank_coef")

    def predict(self, base_s, n_adapters, max_rank, lora_tokens, slots=0, requests=None, rank_sums=None):
        p = self.params
        pct = p["k6"] * n_adapters + p["k7"] + p.get("rank_coef", 0.0) * (max_rank - 8)
        extra = base_s * (pct / 100.0) - base_s
        return np.where(n_adapters > 0, np.maximum(extra, 0.0), 0.0) if isinstance(extra, np.ndarray) else (
            max(extra, 0.0) if n_adapters > 0 else 0.0)

    def scalar(self):
        p = self.params
        k6, k7, rc = float(p["k6"]), float(p["k7"]), float(p.get("rank_coef", 0.0))

        def f(base_s, n_adapters, max_rank, lora_tokens, slots=0, requests=None, rank_sums=None):
            if n_adapters <= 0:
                return 0.0
            extra = base_s * ((k6 * n_adapters + k7 + rc * (max_rank - 8)) / 100.0) - base_s
            return extra if extra > 0.0 else 0.0
        return f

    def base_factor(self, n_adapters, max_rank) -> float | None:
        """``f`` of ``extra = base_s * f - base_s`` (as the scalar path computes it), None for no adapter."""
        if n_adapters <= 0:
            return None
        p = self.params
        k6, k7, rc = float(p["k6"]), float(p["k7"]), float(p.get("rank_coef", 0.0))
        return (k6 * n_adapters + k7 + rc * (max_rank - 8)) / 100.0


@register_form
@dataclass
class PeerScheduler(PerfModel):
    """t = k0 + k1*R_running + k2*R_waiting + k3*R_waiting*(G/N)  (G slots, N served adapters)."""

    kind: ClassVar[str] = "scheduler"
    form: ClassVar[str] = "linear_queue"
    waiting_params: ClassVar[tuple[str, ...]] = ("k2", "k3")
    param_names: ClassVar[tuple[str, ...]] = ("k0", "k1", "k2", "k3")
    units: ClassVar[dict[str, str]] = {"k0": "s", "k1": "s/running request", "k2": "s/waiting request",
                                      "k3": "s/waiting request"}
    #: ``k3`` may be negative (the published ``K3 ~ -K2``); the range check refuses a negative scheduler time
    nonneg_params: ClassVar[tuple[str, ...]] = ("k0", "k1", "k2")

    def predict(self, running, waiting, slots, served):
        p = self.params
        ratio = slots / served if served else 0.0
        return p["k0"] + p["k1"] * running + p["k2"] * waiting + p["k3"] * waiting * ratio

    def scalar(self):
        p = self.params
        k0, k1, k2, k3 = float(p["k0"]), float(p["k1"]), float(p["k2"]), float(p["k3"])
        return lambda R, W, G, N: k0 + k1 * R + k2 * W + k3 * W * (G / N if N else 0.0)


@register_form
@dataclass
class LinkLoad(PerfModel):
    """t = fixed_src + bytes / bw_src  per source ('disk' -> CPU, 'cpu' -> GPU), optionally a per-rank table.

    ``table_s`` (``{"cpu": {"8": s, ...}, "disk": {...}}``) holds measured means per rank (and
    ``table_by_max_rank_s`` per slot max rank and rank); ranks not in the tables use the link model.

    Tensor parallelism (``tp`` workers; the tables and the link model are single-GPU measurements), as vLLM 0.8.5
    loads an adapter on every worker (``WorkerLoRAManager._load_adapter``, ``vllm/lora/worker_manager.py``: each
    worker calls ``LoRAModel.from_local_checkpoint`` on the *whole* checkpoint, then its LoRA layers' ``set_lora``
    slice their shard, ``slice_lora_a`` / ``slice_lora_b``, into its GPU's slot buffers):

    * **disk -> CPU**: every worker reads the whole checkpoint, so the read is *not* divided by ``tp``. The
      workers read the same file at the same time, in parallel from one disk: the page cache serves the pages one
      worker's read brought in to the others and each parses in its own process, so the time is the single-GPU one
      at every ``tp`` (a choice, not measured at TP > 1; readers that did not share the cache would take up to
      ``tp`` times the bytes through the disk);
    * **CPU -> GPU**: each worker copies its ``1/tp`` of the bytes over its own host link, all at once, and the
      fixed cost stays (Chameleon, MICRO'25, Fig. 5). From a measured single-GPU time ``t_1`` of ``bytes`` the TP
      price is ``t_1 - min(t_1, bytes / bw) * (1 - 1/tp)``: the transfer part of the measurement (at the fitted
      bandwidth ``cpu_gbps``, at most the whole time) divided by ``tp``, its fixed part kept -- the link model's
      ``cpu_fixed_s + bytes / tp / bw`` where no table holds the rank. A load never gets slower with more GPUs of the
      same kind (before, TP > 1 dropped the tables for the link model: a rank-32 load from the CPU took 6.37 ms at
      TP 1 and 7.29 ms at TP 2 on the default profile).
    """

    kind: ClassVar[str] = "load"
    form: ClassVar[str] = "link"
    param_names: ClassVar[tuple[str, ...]] = ("disk_fixed_s", "disk_gbps", "cpu_fixed_s", "cpu_gbps")
    units: ClassVar[dict[str, str]] = {"disk_fixed_s": "s", "disk_gbps": "GB/s", "cpu_fixed_s": "s",
                                      "cpu_gbps": "GB/s"}
    nonneg_params: ClassVar[tuple[str, ...]] = ("disk_fixed_s", "cpu_fixed_s")
    positive_params: ClassVar[tuple[str, ...]] = ("disk_gbps", "cpu_gbps")

    def measured_s(self, rank: int, source: str, max_rank: int | None = None) -> float | None:
        """The single-GPU load time the tables hold for ``rank`` from ``source`` into slots padded to ``max_rank``
        (``table_by_max_rank_s`` first, then ``table_s``), None when neither holds it."""
        if max_rank is not None:
            by_max = self.params.get("table_by_max_rank_s") or self.meta.get("table_by_max_rank_s") or {}
            cell = by_max.get(source, {}).get(str(max_rank), {}).get(str(rank))
            if cell is not None:
                return float(cell)
        table = self.params.get("table_s", {})
        if source in table and str(rank) in table[source]:
            return float(table[source][str(rank)])
        return None

    def predict(self, rank: int, nbytes: int, source: str, tp: int = 1, max_rank: int | None = None) -> float:
        """``max_rank``: the slots' padded rank (vLLM copies into buffers of that rank, so a
        rank-8 adapter loads differently into rank-16 and rank-32 slots); the profile's
        ``table_by_max_rank_s`` holds those measured means where available. ``tp``: the tensor-parallel
        workers (see the class docstring)."""
        if source not in ("disk", "cpu"):
            raise ValueError(f"adapter load source must be 'disk' or 'cpu', got {source!r}")
        p = self.params
        t1 = self.measured_s(rank, source, max_rank)
        split = tp > 1 and source == "cpu"  # (each worker copies its shard over its own link; disk reads are whole)
        if t1 is None:
            return p[f"{source}_fixed_s"] + ((nbytes / tp) if split else nbytes) / (p[f"{source}_gbps"] * 1e9)
        if not split:
            return t1
        transfer = min(t1, nbytes / (p["cpu_gbps"] * 1e9))
        return t1 - transfer * (1.0 - 1.0 / tp)


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
    #: (``free_bytes`` may be negative: a model one GPU cannot hold, served with ``--tp``)
    nonneg_params: ClassVar[tuple[str, ...]] = ("slot_bytes_per_rank",)
    positive_params: ClassVar[tuple[str, ...]] = ("kv_bytes_per_token",)

    def predict(self, slots: int, max_rank: int) -> int:
        p = self.params
        free = p["free_bytes"] - slots * p["slot_bytes_per_rank"] * max_rank
        return int(max(free, 0) // p["kv_bytes_per_token"] // 16 * 16)


# ---------------------------------------------------------------------------------------------
# Forms added by the calibration fits (calibration/fitting). Each one is a better-founded
# alternative to a simple form above; a fitted profile names the one that predicted held-out
# measurements best (see the component's ``selection`` entry in the profile).
# ---------------------------------------------------------------------------------------------


def _scalar_or_array(x: Any) -> Any:
    """``np.where`` returns 0-d arrays for scalar inputs: give the engine a float back (no arithmetic)."""
    return float(x) if isinstance(x, np.ndarray) and x.ndim == 0 else x


@register_form
@dataclass
class GraphLinearBackbone(PerfModel):
    """t = c0 + c_eager*[P + D > g] + c_prefill*P + c_decode*D + c_ctx*C  (g = graph_max_tokens).

    The linear model plus a CUDA-graph term: vLLM V1 replays captured CUDA graphs only for
    steps of at most ``graph_max_tokens`` scheduled tokens (``max_capture_size``, 512 in
    vLLM 0.8.5); a bigger step (every step carrying a prefill chunk of a few hundred tokens,
    or a decode batch above 512 sequences) runs eagerly and pays the kernel-launch cost
    ``c_eager`` once. ``graph_max_tokens`` is a setting of the serving software, not fitted.
    """

    ctx_last_param: ClassVar[str | None] = "c_ctx"
    kind: ClassVar[str] = "backbone"
    form: ClassVar[str] = "graph_linear"
    param_names: ClassVar[tuple[str, ...]] = ("c0", "c_eager", "c_prefill", "c_decode", "c_ctx", "graph_max_tokens")
    units: ClassVar[dict[str, str]] = {"c0": "s", "c_eager": "s", "c_prefill": "s/token", "c_decode": "s/sequence",
                                      "c_ctx": "s/context token", "graph_max_tokens": "tokens"}
    nonneg_params: ClassVar[tuple[str, ...]] = ("c0", "c_eager", "c_prefill", "c_decode", "c_ctx", "graph_max_tokens") + _TP_NONNEG
    positive_params: ClassVar[tuple[str, ...]] = _TP_POSITIVE

    def predict(self, prefill_tokens, decode_seqs, ctx_tokens):
        p = self.params
        eager = np.where(prefill_tokens + decode_seqs > p["graph_max_tokens"], p["c_eager"], 0.0)
        return _scalar_or_array(p["c0"] + eager + p["c_prefill"] * prefill_tokens + p["c_decode"] * decode_seqs
                                + p["c_ctx"] * ctx_tokens)

    def scalar(self):
        p = self.params
        c0, ce, cp, cd, cc, g = (float(p[k]) for k in ("c0", "c_eager", "c_prefill", "c_decode", "c_ctx",
                                                        "graph_max_tokens"))
        return lambda P, D, C: c0 + (ce if P + D > g else 0.0) + cp * P + cd * D + cc * C


@register_form
@dataclass
class GraphRooflineBackbone(PerfModel):
    """t = c0 + c_eager*[T > g] + max(c_mem, c_tok*T) + c_seq*D + c_ctx*C  (T = P + D tokens in the step).

    A roofline step: the weight GEMMs cost the larger of reading the weights once
    (``c_mem``, memory bound, small batches) and their arithmetic (``c_tok`` per token,
    compute bound); each decode sequence adds ``c_seq`` (logits over the vocabulary, sampling),
    each context token ``c_ctx`` (attention reads of the KV cache), and steps above the
    CUDA-graph capture size ``g`` run eagerly (``c_eager``, see ``graph_linear``).
    """

    ctx_last_param: ClassVar[str | None] = "c_ctx"
    kind: ClassVar[str] = "backbone"
    form: ClassVar[str] = "graph_roofline"
    param_names: ClassVar[tuple[str, ...]] = ("c0", "c_eager", "c_mem", "c_tok", "c_seq", "c_ctx", "graph_max_tokens")
    units: ClassVar[dict[str, str]] = {"c0": "s", "c_eager": "s", "c_mem": "s", "c_tok": "s/token",
                                      "c_seq": "s/decode sequence", "c_ctx": "s/context token",
                                      "graph_max_tokens": "tokens"}
    nonneg_params: ClassVar[tuple[str, ...]] = ("c0", "c_eager", "c_mem", "c_tok", "c_seq", "c_ctx", "graph_max_tokens") + _TP_NONNEG
    positive_params: ClassVar[tuple[str, ...]] = _TP_POSITIVE

    def predict(self, prefill_tokens, decode_seqs, ctx_tokens):
        p = self.params
        tokens = prefill_tokens + decode_seqs
        eager = np.where(tokens > p["graph_max_tokens"], p["c_eager"], 0.0)
        gemm = np.maximum(p["c_mem"], p["c_tok"] * tokens)
        return _scalar_or_array(p["c0"] + eager + gemm + p["c_seq"] * decode_seqs + p["c_ctx"] * ctx_tokens)

    def scalar(self):
        p = self.params
        c0, ce, cm, ct, cs, cc, g = (float(p[k]) for k in ("c0", "c_eager", "c_mem", "c_tok", "c_seq", "c_ctx",
                                                            "graph_max_tokens"))

        def f(P, D, C):
            T = P + D
            gemm = ct * T
            return c0 + (ce if T > g else 0.0) + (gemm if gemm > cm else cm) + cs * D + cc * C
        return f


@register_form
@dataclass
class AdditiveLora(PerfModel):
    """extra = [A > 0] * (l0 + s*(l_adapter*A + l_token*T + l_adapter_token*A*T)),  s = 1 + rank_coef*(max_rank - 8).

    The LoRA kernels of a step (shrink/expand over every target layer) cost a fixed launch
    overhead ``l0`` as soon as one adapter is active, a cost per distinct adapter ``A`` (its
    A/B matrices are read once per step), a cost per token ``T`` routed through them and,
    with ``l_adapter_token``, a term growing with both (kernel grids span tokens x adapters).
    Unlike ``percent_of_base`` the extra time does not scale with the base step, which the
    measured prefill and decode steps with LoRA support better. ``rank_coef`` (optional,
    default 0) scales the adapter/token terms with the batch's max rank, where data on
    several ranks exist.
    """

    uses_base: ClassVar[bool] = False
    kind: ClassVar[str] = "lora"
    form: ClassVar[str] = "additive"
    param_names: ClassVar[tuple[str, ...]] = ("l0", "l_adapter", "l_token")
    units: ClassVar[dict[str, str]] = {"l0": "s", "l_adapter": "s/distinct adapter", "l_token": "s/token",
                                      "l_adapter_token": "s/(adapter*token)", "rank_coef": "1/rank above 8"}
    nonneg_params: ClassVar[tuple[str, ...]] = ("l0", "l_adapter", "l_token", "l_adapter_token", "rank_coef")

    def predict(self, base_s, n_adapters, max_rank, lora_tokens, slots=0, requests=None, rank_sums=None):
        p = self.params
        scale = 1.0 + p.get("rank_coef", 0.0) * (max_rank - 8)
        var = (p["l_adapter"] * n_adapters + p["l_token"] * lora_tokens
               + p.get("l_adapter_token", 0.0) * n_adapters * lora_tokens)
        extra = p["l0"] + scale * var
        return _scalar_or_array(np.where(n_adapters > 0, extra, 0.0 * extra))

    def scalar(self):
        p = self.params
        l0, la, lt = float(p["l0"]), float(p["l_adapter"]), float(p["l_token"])
        lat, rc = float(p.get("l_adapter_token", 0.0)), float(p.get("rank_coef", 0.0))

        def f(base_s, A, max_rank, T, slots=0, requests=None, rank_sums=None):
            if A <= 0:
                return 0.0
            return l0 + (1.0 + rc * (max_rank - 8)) * (la * A + lt * T + lat * A * T)
        return f


def _cdiv(a, b):
    """Ceiling division for ints, floats and float arrays (exact for the integer values used here)."""
    return -((-a) // b)


@register_form
@dataclass
class KernelGridLora(PerfModel):
    """extra = [A > 0] * (l0 + l_cta*(G + 1)*n_grid(M, R, r) + l_active*n_active(M, R, A, r) + l_adapter*A + l_token*M).

    vLLM 0.8.5's Triton LoRA kernels (``vllm/lora/ops/triton_ops/lora_shrink.py`` and
    ``lora_expand.py``) launch one set of thread blocks (CTAs) for *every* adapter slot,
    ``grid = (..., NUM_SLICES, max_loras + 1)``; blocks of slots that hold no token of the
    step "simply exit" (the kernels' own TODO calls it "wasteful thread block launch"). So a
    step pays for ``(G + 1) * n_grid`` launched blocks, ``G`` = GPU adapter slots, whatever
    the number ``A`` of adapters in use, and ``n_active`` blocks that do the work:

    * shrink, per LoRA linear layer and slot: ``SPLIT_K * cdiv(M, 32) * cdiv(r, 16) * slices``
      blocks with ``SPLIT_K = 64`` if ``M < 128`` else 8 (``r`` = the slots' max rank);
    * expand, per layer and slot: ``cdiv(M, 64) * cdiv(N_out, 128) * slices``;
    * per decoder layer: qkv (3 slices, ``N_out = max(q, kv)``), o (``hidden``), gate_up
      (2 slices, ``intermediate``), down (``hidden``); once per step the embedding (expand,
      ``hidden``) and the LM head over the step's ``R`` requests (shrink + expand over the
      vocabulary);
    * a slot's blocks beyond its own tokens exit too: the working blocks are those of the
      ``A`` adapters' token tiles, ``A + x/32`` shrink and ``A + x/64`` expand row tiles, with
      ``x = M - R`` the tokens beyond one per request (prefill chunks), plus each adapter's
      LM-head blocks; every one of the
      ``SPLIT_K`` split-K blocks of an active tile works, so an adapter costs about twice as
      much in a step of fewer than 128 tokens (64 splits) as in a bigger one (8 splits).

    ``M`` is padded to vLLM's CUDA-graph capture size (1, 2, 4, then multiples of 8) when
    ``M <= graph_max_tokens``. The block counts come from the model's dimensions (fixed
    parameters); ``l_cta`` is the cost of a launched block that exits, ``l_active`` of one that
    works; ``l_adapter``, ``l_token`` and ``l0`` are optional per-adapter, per-token and fixed
    costs. ``n_tile_cost`` (optional, default 1: absent from the fitted profiles) prices the
    working shrink blocks of the rank tiles beyond the first (``max_lora_rank`` > 16 needs
    ``cdiv(rank, 16)`` tiles) relative to the first: such blocks read the same input slice, which
    the first tile has brought into L2; the calibration measured rank 8 only, so it can only be
    identified on end-to-end runs (the ``ranktile`` profile variant, issue 17). ``split64_cost``
    (optional, default 1) prices a working shrink block of a step
    with ``SPLIT_K = 64`` (fewer than 128 tokens; the LM head: fewer than 128 requests) relative to
    one with 8 splits: it reduces an eighth of the input features of the latter. The calibration's
    300-slot windows hold almost no step under 128 tokens; its published serving runs without a queue
    do, and :mod:`calibration.fitting.split64` fits it on them together with the ``mixed`` term
    (Llama-3.1-8B: 0.58; the Vidur profiles carry that value over; :mod:`twin.validation.light_step`
    measures what the validation's light runs say).
    With the grid term, the ~19 ms LoRA overhead measured at 300 slots and 200 tokens
    per step falls to ~0.3 ms at 8 slots, as the published 600 s serving runs at 8-448 slots
    show.
    """

    uses_base: ClassVar[bool] = False
    kind: ClassVar[str] = "lora"
    form: ClassVar[str] = "kernel_grid"
    param_names: ClassVar[tuple[str, ...]] = ("l0", "l_cta", "l_active", "l_adapter", "l_token", "layers", "hidden",
                                              "intermediate", "q_dim", "kv_dim", "vocab", "graph_max_tokens")
    units: ClassVar[dict[str, str]] = {"l0": "s", "l_cta": "s/launched thread block",
                                      "l_active": "s/working thread block", "l_adapter": "s/distinct adapter",
                                      "l_token": "s/token", "layers": "count", "hidden": "features",
                                      "intermediate": "features", "q_dim": "features", "kv_dim": "features",
                                      "vocab": "tokens", "graph_max_tokens": "tokens",
                                      "split64_cost": "working-block cost of a 64-split shrink block relative to "
                                                      "an 8-split one (optional, default 1)",
                                      "n_tile_cost": "working-block cost of a shrink rank tile beyond the first, "
                                                     "relative to the first (optional, default 1)"}
    nonneg_params: ClassVar[tuple[str, ...]] = ("l0", "l_cta", "l_active", "l_adapter", "l_token", "n_tile_cost",
                                                "split64_cost")
    #: vLLM 0.8.5 kernel configuration (lora_shrink.py / lora_expand.py)
    SHRINK_BLOCK_M: ClassVar[int] = 32
    SHRINK_BLOCK_N: ClassVar[int] = 16
    EXPAND_BLOCK_M: ClassVar[int] = 64
    EXPAND_BLOCK_N: ClassVar[int] = 128

    @staticmethod
    def _layer_slices(p: dict[str, float]) -> tuple[tuple[int, float], ...]:
        """LoRA linear layers of a decoder layer: (slices, widest output) of qkv, o, gate_up, down.

        Every one of them, whatever modules the adapters adapt (``--lora-targets``): vLLM 0.8.5 wraps every
        linear layer of the model in a LoRA layer (``get_supported_lora_modules``, ``vllm/lora/utils.py``: "all
        linear layers support LoRA"; ``LoRAModelManager._create_lora_modules``) and runs the shrink and expand
        kernels on each for every slot; a module an adapter lacks is zeros in its slot
        (``LoRAModelManager.activate_adapter``: ``reset_lora``). The targets set the adapter's bytes only."""
        return ((3, max(p["q_dim"], p["kv_dim"])), (1, p["hidden"]), (2, p["intermediate"]), (1, p["hidden"]))

    def _constants(self) -> tuple[float, float, float]:
        """(expand blocks per row tile: all layers + embedding; shrink slices of all layers; LM-head N tiles)."""
        p = self.params
        bn = self.EXPAND_BLOCK_N
        per_layer = sum(sl * _cdiv(n, bn) for sl, n in self._layer_slices(p))
        slices = sum(sl for sl, _ in self._layer_slices(p))
        return (float(p["layers"] * per_layer + _cdiv(p["hidden"], bn)), float(p["layers"] * slices),
                float(_cdiv(p["vocab"], float(bn))))

    @staticmethod
    def _pad(M, g):
        """vLLM V1 pads a step of at most ``g`` tokens to the next CUDA-graph capture size."""
        small = np.where(M <= 1, 1.0, np.where(M <= 2, 2.0, np.where(M <= 4, 4.0, _cdiv(M, 8.0) * 8.0)))
        return np.where(M <= g, small, M)

    def ctas(self, M, R, A, max_rank):
        """(blocks launched per slot, working blocks) of a step of ``M`` tokens, ``R`` requests, ``A`` adapters."""
        p = self.params
        M = np.asarray(M, float)
        R = np.maximum(np.asarray(R, float), 1.0)
        Mp = self._pad(M, p["graph_max_tokens"])
        e_tile, s_slices, v_tiles = self._constants()
        kr = _cdiv(np.asarray(max_rank, float), float(self.SHRINK_BLOCK_N))
        split = np.where(Mp < 128, 64.0, 8.0)
        head_split = np.where(R < 128, 64.0, 8.0)
        per_slot = (s_slices * split * _cdiv(Mp, float(self.SHRINK_BLOCK_M)) * kr + e_tile * _cdiv(Mp, float(
            self.EXPAND_BLOCK_M)) + head_split * _cdiv(R, float(self.SHRINK_BLOCK_M)) * kr
            + _cdiv(R, float(self.EXPAND_BLOCK_M)) * v_tiles)
        x = np.maximum(M - R, 0.0)
        A = np.asarray(A, float)
        c = float(p.get("n_tile_cost", 1.0))
        krw = kr if c == 1.0 else 1.0 + c * (kr - 1.0)  # working shrink blocks beyond the first rank tile
        c64 = float(p.get("split64_cost", 1.0))
        if c64 != 1.0:  # a 64-split working block against an 8-split one
            split = np.where(split == 64.0, 64.0 * c64, split)
            head_split = np.where(head_split == 64.0, 64.0 * c64, head_split)
        active = (s_slices * split * krw * (A + x / self.SHRINK_BLOCK_M) + e_tile * (A + x / self.EXPAND_BLOCK_M)
                  + (head_split * krw + v_tiles) * A)
        return _scalar_or_array(per_slot), _scalar_or_array(active)

    def predict(self, base_s, n_adapters, max_rank, lora_tokens, slots=0, requests=None, rank_sums=None):
        p = self.params
        M = np.asarray(lora_tokens, float)
        R = M if requests is None else requests
        per_slot, active = self.ctas(M, R, n_adapters, max_rank)
        extra = (p["l0"] + p["l_cta"] * (np.asarray(slots, float) + 1.0) * per_slot + p["l_active"] * active
                 + p["l_adapter"] * n_adapters + p["l_token"] * M)
        return _scalar_or_array(np.where(np.asarray(n_adapters) > 0, extra, 0.0 * extra))

    def scalar(self):
        p = self.params
        l0, lc, lw, la, lt = (float(p[k]) for k in ("l0", "l_cta", "l_active", "l_adapter", "l_token"))
        ntc = float(p.get("n_tile_cost", 1.0))
        w64 = 64.0 * float(p.get("split64_cost", 1.0))  # a 64-split working block, in 8-split blocks x 8
        e_tile, s_slices, v_tiles = self._constants()
        g = float(p["graph_max_tokens"])
        bms, bme = float(self.SHRINK_BLOCK_M), float(self.EXPAND_BLOCK_M)
        cache: dict[tuple[float, float, float], tuple[float, float, float]] = {}

        def blocks(M: float, R: float, r: float) -> tuple[float, float, float]:
            """(blocks per slot, working shrink blocks per row tile, x = extra tokens, LM-head blocks per adapter)."""
            x = M - R
            if x < 0.0:
                x = 0.0
            if M <= g:
                M = 1.0 if M <= 1 else 2.0 if M <= 2 else 4.0 if M <= 4 else -((-M) // 8.0) * 8.0
            if R < 1.0:
                R = 1.0
            kr = -((-r) // 16.0)
            split = 64.0 if M < 128 else 8.0
            per_slot = (s_slices * split * -((-M) // bms) * kr + e_tile * -((-M) // bme)
                        + (64.0 if R < 128 else 8.0) * -((-R) // bms) * kr + -((-R) // bme) * v_tiles)
            krw = kr if ntc == 1.0 else 1.0 + ntc * (kr - 1.0)
            wsplit = w64 if split == 64.0 else split
            return per_slot, s_slices * wsplit * krw, x, (w64 if R < 128 else 8.0) * krw + v_tiles

        def f(base_s, A, max_rank, T, slots=0, requests=None, rank_sums=None):
            if A <= 0:
                return 0.0
            R = T if requests is None else requests
            key = (T, R, max_rank)
            b = cache.get(key)
            if b is None:
                b = blocks(float(T), float(R), float(max_rank))
                if len(cache) < 65536:
                    cache[key] = b
            per_slot, sk, x, hd = b
            active = sk * (A + x / bms) + e_tile * (A + x / bme) + hd * A
            return l0 + lc * (slots + 1.0) * per_slot + lw * active + la * A + lt * T
        return f


@register_form
@dataclass
class LoraQueueScheduler(PerfModel):
    """t = k0 + k1*R + k1_sq*R^2 + k2*W + k_blocked*W*max(1 - G/N, 0)*[G > 0]  (R running, W waiting, G slots, N served).

    The scheduler walks the running list every step (``k1``; ``k1_sq`` for the list
    removals of finished/preempted requests, each O(R)) and the waiting queue; with LoRA,
    a waiting request whose adapter cannot get a slot is skipped and the walk continues,
    so the share ``1 - G/N`` of the queue that is blocked costs ``k_blocked`` per request.
    Without LoRA (G = 0) no request is blocked. Replaces the published
    ``K1*R + K2*W + K3*W*(G/N)`` (``linear_queue``), whose ``K3 ~ -K2`` is the same idea.
    """

    kind: ClassVar[str] = "scheduler"
    form: ClassVar[str] = "lora_queue"
    waiting_params: ClassVar[tuple[str, ...]] = ("k2", "k_blocked")
    param_names: ClassVar[tuple[str, ...]] = ("k0", "k1", "k1_sq", "k2", "k_blocked")
    units: ClassVar[dict[str, str]] = {"k0": "s", "k1": "s/running request", "k1_sq": "s/running request^2",
                                      "k2": "s/waiting request", "k_blocked": "s/blocked waiting request"}
    nonneg_params: ClassVar[tuple[str, ...]] = ("k0", "k1", "k1_sq", "k2", "k_blocked")

    def predict(self, running, waiting, slots, served):
        p = self.params
        frac = np.maximum(1.0 - slots / np.maximum(served, 1), 0.0)
        blocked = np.where(slots > 0, frac, 0.0)
        return _scalar_or_array(p["k0"] + p["k1"] * running + p["k1_sq"] * running * running + p["k2"] * waiting
                                + p["k_blocked"] * waiting * blocked)

    def scalar(self):
        p = self.params
        k0, k1, k1s, k2, kb = (float(p[k]) for k in ("k0", "k1", "k1_sq", "k2", "k_blocked"))

        def f(R, W, G, N):
            frac = 1.0 - G / (N if N > 1 else 1)
            blocked = (frac if frac > 0.0 else 0.0) if G > 0 else 0.0
            return k0 + k1 * R + k1s * R * R + k2 * W + kb * W * blocked
        return f


@register_form
@dataclass
class LoraQueueWalkScheduler(LoraQueueScheduler):
    """t = lora_queue(R, W, G, N) + k_walk*W*max(1 - G/N, 0)*[G > 0]  (host time per blocked waiting request).

    :class:`LoraQueueScheduler` (the scheduler time the fork logs per step) plus ``k_walk``: engine
    host time per step and *blocked* waiting request (one whose adapter cannot get a slot, so the
    v1 scheduler skips it and puts it back at the head of the queue every step) that the logged
    scheduler time does not hold. Identified on the calibration's queued 600 s serving runs, where
    the token interval of a running request (Little's law: mean running / output token rate, which
    the client's ITL confirms) exceeds ``duration / steps`` and the model in proportion to the
    blocked queue, while the 300-slot windows (thousands waiting, none blocked) show no excess
    (:mod:`calibration.fitting.serving_interval`). Used only by the profile variant
    ``*_interval``; the default profiles keep ``lora_queue``.
    """

    form: ClassVar[str] = "lora_queue_walk"
    waiting_params: ClassVar[tuple[str, ...]] = ("k2", "k_blocked", "k_walk")
    param_names: ClassVar[tuple[str, ...]] = ("k0", "k1", "k1_sq", "k2", "k_blocked", "k_walk")
    units: ClassVar[dict[str, str]] = {**LoraQueueScheduler.units, "k_walk": "s/blocked waiting request/step"}
    nonneg_params: ClassVar[tuple[str, ...]] = LoraQueueScheduler.nonneg_params + ("k_walk",)

    def predict(self, running, waiting, slots, served):
        p = self.params
        frac = np.maximum(1.0 - slots / np.maximum(served, 1), 0.0)
        blocked = np.where(slots > 0, frac, 0.0)
        return _scalar_or_array(p["k0"] + p["k1"] * running + p["k1_sq"] * running * running + p["k2"] * waiting
                                + (p["k_blocked"] + p["k_walk"]) * waiting * blocked)

    def scalar(self):
        p = self.params
        k0, k1, k1s, k2, kb = (float(p[k]) for k in ("k0", "k1", "k1_sq", "k2", "k_blocked"))
        kb = kb + float(p["k_walk"])

        def f(R, W, G, N):
            frac = 1.0 - G / (N if N > 1 else 1)
            blocked = (frac if frac > 0.0 else 0.0) if G > 0 else 0.0
            return k0 + k1 * R + k1s * R * R + k2 * W + kb * W * blocked
        return f


@register_form
@dataclass
class AffineMemoryKV(PerfModel):
    """tokens = floor((free_bytes - [G>0]*lora_fixed_bytes - G*(slot_fixed_bytes + slot_bytes_per_rank*r)) / kv_bytes_per_token / 16) * 16.

    vLLM allocates, per adapter slot ``G``, LoRA buffers padded to the max rank ``r`` for
    every supported module (the seven linear layers plus embedding / LM-head extras:
    ``slot_bytes_per_rank``) and rank-independent per-slot buffers (``slot_fixed_bytes``);
    enabling LoRA at all costs ``lora_fixed_bytes`` (punica metadata and larger activation
    peaks). What is left of ``gpu_memory_utilization * memory`` (``free_bytes``, after
    weights, activations and CUDA graphs of a server without LoRA) becomes KV blocks of
    16 tokens. A start fails when the result is below ``max_model_len``.
    """

    kind: ClassVar[str] = "kv"
    form: ClassVar[str] = "memory_budget_affine"
    param_names: ClassVar[tuple[str, ...]] = ("free_bytes", "lora_fixed_bytes", "slot_fixed_bytes",
                                              "slot_bytes_per_rank", "kv_bytes_per_token")
    units: ClassVar[dict[str, str]] = {"free_bytes": "bytes", "lora_fixed_bytes": "bytes",
                                      "slot_fixed_bytes": "bytes per slot",
                                      "slot_bytes_per_rank": "bytes per slot per rank",
                                      "kv_bytes_per_token": "bytes"}
    nonneg_params: ClassVar[tuple[str, ...]] = ("lora_fixed_bytes", "slot_fixed_bytes", "slot_bytes_per_rank")
    positive_params: ClassVar[tuple[str, ...]] = ("kv_bytes_per_token",)

    def predict(self, slots: int, max_rank: int) -> int:
        p = self.params
        free = p["free_bytes"] - slots * (p["slot_fixed_bytes"] + p["slot_bytes_per_rank"] * max_rank)
        if slots > 0:
            free -= p["lora_fixed_bytes"]
        return int(max(free, 0) // p["kv_bytes_per_token"] // 16 * 16)



@register_form
@dataclass
class PrefillAdaptersMixed(PerfModel):
    """extra = h_adapter * A * [P > 0]  (A distinct adapters in the batch, P prefill tokens of the step).

    Serving time of a step that carries a prefill, per distinct adapter of the batch, beyond
    what the backbone, the LoRA kernel-grid count (:class:`KernelGridLora`, fitted on
    decode-sized batches) and the measured scheduler time give. Identified on the
    calibration's published 600 s serving runs (``scheduler_overhead.csv``; 8-448 slots, one
    ~250-token prompt on 30-100 % of the steps): their measured mean step exceeds the model by
    0-35 ms, in proportion to the distinct adapters per step times the share of steps with a
    prefill, not with the running batch or the waiting queue, while the 300-slot offline
    windows (almost no prefill steps; up to 3,900 waiting, 220 running, 140 adapters) show no
    excess (:mod:`calibration.fitting.mixed` scores the alternatives). In vLLM 0.8.5 a step
    with a prefill runs the LoRA shrink/expand kernels over segments of tokens per adapter
    (``PunicaWrapperGPU``, prefill metadata per adapter) and the host prepares the mapping
    without overlapping the GPU; which of these carries the cost the tables cannot say, so
    the term is kept at the granularity the data identify. Pure-decode steps get 0 (the term
    never enters a decode run).
    """

    kind: ClassVar[str] = "mixed"
    form: ClassVar[str] = "prefill_adapters"
    param_names: ClassVar[tuple[str, ...]] = ("h_adapter",)
    units: ClassVar[dict[str, str]] = {"h_adapter": "s/distinct adapter/step with prefill"}
    nonneg_params: ClassVar[tuple[str, ...]] = ("h_adapter",)

    def predict(self, prefill_tokens, active, slots):
        return _scalar_or_array(self.params["h_adapter"] * np.asarray(active, float)
                                * (np.asarray(prefill_tokens, float) > 0))

    def scalar(self):
        h = float(self.params["h_adapter"])

        def f(P, A, G):
            return h * A if P > 0 else 0.0
        return f


@register_form
@dataclass
class RegistryPairsAdapterCheck(PerfModel):
    """extra = c_pair * A * N  (A distinct adapters in the step's batch, N registered adapters).

    vLLM 0.8.5's host time for the per-step adapter check: ``LRUCacheWorkerLoRAManager._apply_adapters`` asks, for
    each of the batch's ``A`` distinct adapters, whether it is registered (``adapter_id not in self.list_adapters()``),
    and ``list_adapters`` copies the registry (a ``vllm.utils.LRUCache`` of ``max_cpu_loras`` entries, through
    Python-level ``__setitem__`` / ``__getitem__`` calls) each time, so the check costs about ``A * N`` entry copies,
    without overlapping the GPU. ``N`` is the adapters registered at the step (the engine's
    :meth:`twin.engine_state.EngineState._registered`: the CPU tier, those requested so far, or every served adapter
    on a server that pre-loads them, as the calibration's and the validation's servers do). Fitted by :mod:`calibration.fitting.adapter_check` on the
    calibration tables *beside* the kernel grid's ``l_cta``/``l_active``/``split64_cost`` and the mixed ``h_slot``,
    which, fitted without it, held it at the calibration's own ``A`` and ``N``; a replica of the code timed on a CPU
    (``benchmarks/vllm085_lora_mapping_host.py``) costs the same order per pair. Only the
    ``llama-3.1-8b_h100_vllm085_adaptercheck`` profile carries it (issue 17; the default profile since stop 63).
    """

    kind: ClassVar[str] = "adapter_check"
    form: ClassVar[str] = "registry_pairs"
    param_names: ClassVar[tuple[str, ...]] = ("c_pair",)
    units: ClassVar[dict[str, str]] = {"c_pair": "s/(distinct adapter x registered adapter)/step"}
    nonneg_params: ClassVar[tuple[str, ...]] = ("c_pair",)

    def predict(self, active, served):
        return _scalar_or_array(self.params["c_pair"] * np.asarray(active, float) * np.asarray(served, float))

    def scalar(self):
        c = float(self.params["c_pair"])

        def f(A, N):
            return c * A * N
        return f


@register_form
@dataclass
class PrefillSlotsMixed(PerfModel):
    """extra = h_slot * G * [P > 0]  (G adapter slots, P prefill tokens of the step).

    The alternative to :class:`PrefillAdaptersMixed` per adapter slot, and the Llama-3.1-8B profile's form since
    the kernel grid's 64-split price is fitted with it (:mod:`calibration.fitting.split64`: at their fixed points
    3.16 % held-out against 3.80 % per distinct adapter on the calibration's serving runs and windows; fitted after
    a grid without that price, 4.52 % against 4.47 %). Serving time of a step that carries a prefill, per GPU adapter slot, beyond what the
    backbone, the LoRA kernel-grid count (:class:`KernelGridLora`, fitted on decode-sized
    batches) and the measured scheduler time give. Identified on the calibration's published
    600 s serving runs (``scheduler_overhead.csv``; 8-448 slots, one ~250-token prompt on
    30-100 % of the steps): their measured mean step exceeds the model by 0-35 ms, in
    proportion to the slots times the share of steps with a prefill (0.125 ms per slot), not
    with the running batch, the waiting queue or the distinct adapters, while the 300-slot
    offline windows (almost no prefill; up to 3,900 waiting, 220 running, 140 adapters)
    show no excess. vLLM 0.8.5 runs the Triton LoRA kernels with a grid over every slot
    (``max_loras + 1``) for the step's token tiles and prepares the LoRA mapping on the host
    without overlapping the GPU; which of these carries the cost the tables cannot say, so
    the term is kept at the granularity the data identify: per slot, per step with a
    prefill. Pure-decode steps get 0 (the term never enters a decode run).
    """

    kind: ClassVar[str] = "mixed"
    form: ClassVar[str] = "prefill_slots"
    param_names: ClassVar[tuple[str, ...]] = ("h_slot",)
    units: ClassVar[dict[str, str]] = {"h_slot": "s/adapter slot/step with prefill"}
    nonneg_params: ClassVar[tuple[str, ...]] = ("h_slot",)

    def predict(self, prefill_tokens, active, slots):
        return _scalar_or_array(self.params["h_slot"] * np.asarray(slots, float)
                                * (np.asarray(prefill_tokens, float) > 0))

    def scalar(self):
        h = float(self.params["h_slot"])

        def f(P, A, G):
            return h * G if P > 0 else 0.0
        return f
