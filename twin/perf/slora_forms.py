"""S-LoRA's LoRA compute (Punica-style BGMV / Triton) and adapter-load forms.

No S-LoRA kernel or copy was measured for this project (the device lent to the task had no
GPU time for it), so both forms are **estimates derived from the fitted profile** -- the
model's dimensions and the effective rates the profile's ``curve_fit`` constants imply --
each documented where it is used. Nothing here is tuned to a target result.

**Compute** (slora.md §5, ``slora/models/peft/lora_unordered_batch_infer.py``, ``csrc/bgmv``):
S-LoRA adapts q, k, v and o of every layer (``--lora-targets`` may name others; the cost
follows the targets given). Each adapted projection is a shrink ``x·A`` (``d_in x r``) and an
expand ``(xA)·B`` (``r x d_out``), one kernel launch each per layer.

* decode (BGMV, one GEMV per request, no weight reuse between requests of one adapter):
  memory bound; a request reads its own adapter's A and B rows, ``r_i * (S_in + S_out) * L * 2``
  bytes (shrink blocks beyond the request's rank exit early; the expand's loads are masked),
  and the expand's arithmetic is padded to the batch's max rank::

      T = launches * t_launch + sum_i r_i * c_rank + n * max_r * c_pad
      c_rank = 2 B * L * (S_in + S_out) / BW_eff        [s per (request x rank)]
      c_pad  = 2 FLOP * L * S_out / FLOPS_eff           [s per (token x max rank)]

* prefill: Triton kernels padded to ``max_rank x longest sequence`` when the longest sequence
  is >= 200 tokens, ``max_rank >= 64`` and the batch has >= 2 requests; otherwise BGMV per token.
  Compute bound (a prompt's tokens share one adapter, its weights stay in cache)::

      Triton: T = launches * t_launch + n_req * max_len * max_r * 2 FLOP * L * (S_in + S_out) / FLOPS_eff
      BGMV:   T = launches * t_launch + sum_tokens r_i * 2 FLOP * L * S_in / FLOPS_eff + n_tokens * max_r * c_pad

  which is slora.md's suggested ``c1 * sum_tokens r_i + c2 * n_tokens * max_r``. The cost does
  not depend on how many adapters are resident (unlike vLLM's kernel grid).

``BW_eff`` = the model's weight bytes / the profile's one-sequence decode step (the effective
weight-streaming bandwidth of a memory-bound step, launch overheads included: a slow,
conservative rate); ``FLOPS_eff`` = ``2 * parameters`` / the profile's marginal prefill cost per
token (between 2,048 and 4,096 tokens). ``t_launch`` = 5 us per kernel launch: an estimate
(typical host-side CUDA launch latency, 3-7 us; S-LoRA runs without CUDA graphs).

**Loads** (slora.md §4, ``infer_adapter.py:load_adapters``): adapters sit in pinned host memory;
a load copies each layer's whole ``w_combined`` (A and B) twice (``load_lora_A`` then
``load_lora_B``): ``2L`` copies moving ``2 x`` the adapter's bytes::

    T_load = 2L * t_copy + 2 * bytes / BW_pinned

``BW_pinned`` = the profile's fitted CPU->GPU bandwidth (``cpu_gbps``, fitted with curve_fit on
vLLM's loads, which copy from pinned CPU tensors); ``t_copy`` = 10 us per copy: an estimate
(one ``cudaMemcpyAsync`` issue plus the scatter kernel into the pool, two host launches). vLLM's
fitted fixed activation cost (``cpu_fixed_s``) is vLLM's own bookkeeping and is not used.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Iterable

import numpy as np

from twin.model_spec import QKVO
from twin.perf.forms import PerfModel, _scalar_or_array, register_form

if TYPE_CHECKING:  # pragma: no cover
    from twin.perf.profile import Profile

#: host-side cost of one kernel launch (s): an estimate, see the module docstring
LAUNCH_S = 5e-6
#: host-side cost of one host-to-device copy of one layer's adapter rows (s): an estimate
COPY_S = 1e-5
#: S-LoRA's Triton prefill path (``lora_unordered_batch_infer.py``): longest sequence, max rank, requests
TRITON_MIN_LEN, TRITON_MIN_RANK, TRITON_MIN_REQS = 200, 64, 2


@dataclass(frozen=True)
class PunicaLoraCost:
    """S-LoRA's LoRA cost per step (see the module docstring): ``decode_s`` and ``prefill_s``."""

    layers: int
    s_in: float          # sum of d_in over the adapted projections of one layer
    s_out: float         # sum of d_out over the adapted projections of one layer
    n_proj: int          # adapted projections per layer (two launches each: shrink, expand)
    bw_eff: float        # B/s
    flops_eff: float     # FLOP/s
    launch_s: float = LAUNCH_S

    @classmethod
    def from_profile(cls, profile: "Profile", targets: Iterable[str] | None = None) -> "PunicaLoraCost":
        """The constants for ``profile``'s model, the ``targets`` projections (default: the
        profile's ``lora_targets``) and the effective rates the profile's backbone implies."""
        m = profile.model
        tg = tuple(targets) if targets is not None else tuple(profile.lora_targets)
        shapes = [m.module_shape(t) for t in tg]
        bb = profile.backbone_s
        t_one = float(bb(0, 1, 0))
        per_tok = (float(bb(4096, 0, 0)) - float(bb(2048, 0, 0))) / 2048.0
        # a profile without a decode or per-token prefill cost (hand-made test profiles) implies an
        # infinite rate: that part of the LoRA cost is then zero, as its backbone's is
        return cls(layers=m.layers, s_in=float(sum(s[0] for s in shapes)), s_out=float(sum(s[1] for s in shapes)),
                   n_proj=len(shapes), bw_eff=m.weight_bytes / t_one if t_one > 0 else math.inf,
                   flops_eff=2.0 * m.params_b * 1e9 / per_tok if per_tok > 0 else math.inf)

    @property
    def c_rank(self) -> float:
        """Decode: seconds per (request x its own rank): its A and B rows read once."""
        return 2.0 * self.layers * (self.s_in + self.s_out) / self.bw_eff

    @property
    def c_pad(self) -> float:
        """Seconds per (token x max rank): the expand's arithmetic padded to the batch's max rank."""
        return 2.0 * self.layers * self.s_out / self.flops_eff

    @property
    def launches_s(self) -> float:
        """Shrink and expand launches of every adapted projection of every layer."""
        return 2.0 * self.n_proj * self.layers * self.launch_s

    def decode_s(self, sum_rank: int, max_rank: int, n: int) -> float:
        """LoRA time of a decode step of ``n`` requests whose adapters' ranks sum to ``sum_rank``."""
        if n <= 0 or max_rank <= 0:
            return 0.0
        return self.launches_s + sum_rank * self.c_rank + n * max_rank * self.c_pad

    def prefill_s(self, tok_rank: int, n_tokens: int, max_rank: int, n_req: int, max_len: int) -> float:
        """LoRA time of a prefill of ``n_tokens`` prompt tokens of ``n_req`` requests (``tok_rank``:
        sum over tokens of their request's rank; ``max_len``: the longest prompt)."""
        if n_tokens <= 0 or max_rank <= 0:
            return 0.0
        if max_len >= TRITON_MIN_LEN and max_rank >= TRITON_MIN_RANK and n_req >= TRITON_MIN_REQS:
            return self.launches_s + n_req * max_len * max_rank * 2.0 * self.layers * (self.s_in + self.s_out) \
                / self.flops_eff
        return self.launches_s + tok_rank * 2.0 * self.layers * self.s_in / self.flops_eff + n_tokens * max_rank * self.c_pad


@register_form
@dataclass
class PagedLora(PerfModel):
    """extra = [A > 0] * (launches + r*(R*c_rank + (T - R)*c_tok + T*c_pad)): LoRA compute over
    adapter weights *paged in the KV pool* (S-LoRA's unified paging), for a vLLM-based system
    that keeps them there -- FastLibra (``shared/refs/fastlibra.md`` §2: vLLM's BlockManager
    extended so that "LoRA weights are split into blocks along the rank dimension", their other
    dimensions matching KV blocks, following S-LoRA's unified paging).

    Why not vLLM's kernel grid (:class:`twin.perf.forms.KernelGridLora`): vLLM 0.8.5's Triton
    kernels read each adapter from its slot of the stacked ``lora_a/b_stacked`` buffers
    (``max_loras`` slots, each padded to ``max_lora_rank``) and launch thread blocks for every
    slot. Weights paged in rank-row blocks are in no slot, so those kernels cannot address them:
    the system needs a kernel that gathers the rows from the pool, as S-LoRA's MBGMV does
    (``shared/refs/slora.md`` §5). FastLibra does not describe its kernel, so this form is
    S-LoRA's (:class:`PunicaLoraCost`, an estimate derived from the profile, see the module
    docstring) on vLLM's mixed steps of ``T`` tokens over ``R`` requests:

    * each request reads its adapter's rows once: ``r_i * c_rank`` (memory bound, the decode
      term of :meth:`PunicaLoraCost.decode_s`);
    * the ``T - R`` prompt tokens beyond one per request add their shrink arithmetic,
      ``c_tok = 2 FLOP * L * S_in / FLOPS_eff`` per token and rank of its request (the BGMV
      prefill term);
    * every token's expand is padded to ``r``: ``T * r * c_pad``;
    * ``launches``: a shrink and an expand launch per adapted projection and layer.

    **Own ranks** (``own_ranks``: the vLLM engine passes ``rank_sums``): S-LoRA's shrink blocks
    beyond a request's own rank exit early, so its work follows ``sum_i r_i`` (``slora.md`` §5
    and item 14: "proportional to the sum of own ranks per token, with expand padded to the
    batch's max rank"). Given ``rank_sums = (sum over the step's requests of their rank, sum
    over its LoRA tokens of their request's rank)`` the form is::

        extra = [A > 0] * (launches + rank_req * c_rank + (rank_tok - rank_req) * c_tok + T * r * c_pad)

    and only the padded expand uses ``r``, the slots' ``max_lora_rank`` (vLLM pads every slot to
    it). Without ``rank_sums`` (callers that know only the batch's shape, e.g. the validation
    diagnostics) every request counts at ``r``: the formula above with ``rank_req = R * r`` and
    ``rank_tok = T * r``, an upper bound (at most ``max_rank / min_rank`` x on the first two
    terms; 2x for ranks 32/64). It does not depend on the slots (``max_loras``) nor on the
    adapters in the batch beyond ``A > 0``. For a pure decode step (``T == R``) it equals
    ``PunicaLoraCost.decode_s(sum_i r_i, r, R)``.
    """

    uses_base: ClassVar[bool] = False
    own_ranks: ClassVar[bool] = True
    kind: ClassVar[str] = "lora"
    form: ClassVar[str] = "paged"
    param_names: ClassVar[tuple[str, ...]] = ("launches_s", "c_rank", "c_tok", "c_pad")
    units: ClassVar[dict[str, str]] = {"launches_s": "s", "c_rank": "s/(request*rank)",
                                      "c_tok": "s/(prompt token*rank)", "c_pad": "s/(token*rank)"}
    nonneg_params: ClassVar[tuple[str, ...]] = ("launches_s", "c_rank", "c_tok", "c_pad")

    @classmethod
    def from_profile(cls, profile: "Profile") -> "PagedLora":
        """The constants of :class:`PunicaLoraCost` for ``profile`` (its model, targets and rates)."""
        c = PunicaLoraCost.from_profile(profile)
        c_tok = 2.0 * c.layers * c.s_in / c.flops_eff
        return cls(params={"launches_s": c.launches_s, "c_rank": c.c_rank, "c_tok": c_tok, "c_pad": c.c_pad},
                   meta={"source": "estimate: S-LoRA's Punica form (twin/perf/slora_forms.py) on a paged pool"})

    def predict(self, base_s, n_adapters, max_rank, lora_tokens, slots=0, requests=None, rank_sums=None):
        p = self.params
        T = np.asarray(lora_tokens, float)
        R = T if requests is None else np.minimum(np.asarray(requests, float), T)
        r = np.asarray(max_rank, float)
        if rank_sums is None:
            extra = p["launches_s"] + r * (R * p["c_rank"] + (T - R) * p["c_tok"] + T * p["c_pad"])
        else:
            rq, rt = (np.asarray(x, float) for x in rank_sums)
            extra = p["launches_s"] + (rq * p["c_rank"] + (rt - rq) * p["c_tok"]) + T * r * p["c_pad"]
        return _scalar_or_array(np.where(np.asarray(n_adapters) > 0, extra, 0.0 * extra))

    def scalar(self):
        p = self.params
        l0, cr, ct, cp = (float(p[k]) for k in ("launches_s", "c_rank", "c_tok", "c_pad"))

        def f(base_s, A, max_rank, T, slots=0, requests=None, rank_sums=None):
            if A <= 0:
                return 0.0
            if rank_sums is not None:  # the requests' own ranks (the vLLM engine's steps)
                rq, rt = rank_sums
                return l0 + (rq * cr + (rt - rq) * ct) + T * max_rank * cp
            R = T if requests is None or requests > T else requests
            return l0 + max_rank * (R * cr + (T - R) * ct + T * cp)
        return f


def slora_load_s(profile: "Profile", nbytes: int, copy_s: float = COPY_S) -> float:
    """Seconds to copy one adapter of ``nbytes`` from pinned host memory into S-LoRA's pool:
    ``2L`` copies of ``2 x nbytes`` in all over the link (see the module docstring)."""
    gbps = float(profile.components["load"].params["cpu_gbps"])
    return 2 * profile.model.layers * copy_s + 2.0 * nbytes / (gbps * 1e9)


#: the projections S-LoRA adapts (``LoraLayerWeight``: q, k, v, o only)
SLORA_TARGETS = QKVO
