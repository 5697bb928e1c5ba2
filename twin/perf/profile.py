"""The performance model ("profile") every engine duration comes from.

A profile is one versioned JSON file per (model, GPU, serving software); see
``calibration/profiles/``. It holds five components (see :mod:`twin.perf.forms`)
plus the model dimensions. The engine asks it:

* :meth:`Profile.backbone_s` -- base-model step latency for a batch;
* :meth:`Profile.lora_s` -- extra LoRA compute of that step (distinct adapters, ranks);
* :meth:`Profile.scheduler_s` -- scheduler CPU time per step;
* :meth:`Profile.load_s` -- adapter load time (rank/bytes, from ``disk`` or ``cpu``);
* :meth:`Profile.kv_capacity_tokens` -- KV capacity given adapter slots and max rank;
* optionally :attr:`Profile.mixed_s` -- the per-slot serving time of a step that carries a
  prefill per distinct adapter (component ``mixed``, :class:`twin.perf.forms.PrefillAdaptersMixed`); a profile
  without it (or :meth:`Profile.without` ``("mixed")``) gives the step without that term;
* optionally the serving path's host time per running request and step
  (:meth:`Profile.with_serving_host`, :attr:`Profile.serving_s_per_running`; 0 in every shipped
  profile): added to the scheduler term, so every path that prices a step includes it;
* optionally the cost of a LoRA shrink rank tile beyond the first (:meth:`Profile.with_rank_tile_cost`;
  the ``kernel_grid`` form's ``n_tile_cost``, 1 in the calibrated profiles).

``twin run --profile NAME|FILE`` picks one; :func:`load_profile` resolves names against the
profiles shipped in ``calibration/profiles`` and the embedded :data:`DEFAULT_PROFILE`.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, ClassVar, Sequence

from traces.arguments import did_you_mean, is_real_number
from twin.perf.forms import FORMS, PerfModel, make_component
from twin.perf.slora_forms import PagedLora
from twin.model_spec import ALL_TARGETS, QKVO, ModelSpec, get_model

PROFILE_SCHEMA = "lora-twin-profile/1"
KINDS = ("backbone", "lora", "scheduler", "load", "kv")
#: components a profile may add to :data:`KINDS` (absent: the term is 0)
OPTIONAL_KINDS = ("mixed", "adapter_check")
PROFILE_DIR = Path(__file__).resolve().parents[2] / "calibration" / "profiles"

#: Shipped variants that stand in for a calibrated profile wherever the twin picks the profile itself (no
#: ``--profile``: ``twin run``, ``twin validate`` by the runs' model, ``twin configure``): Llama-3.1-8B's
#: ``adaptercheck`` variant, the calibrated profile plus vLLM 0.8.5's per-step adapter check fitted beside the
#: kernel grid on the calibration tables (``calibration/fitting/adapter_check.py``; README.md, "Profile variant
#: ``adaptercheck``": chosen on the fit split of the real runs, every figure better, since stop 63 the default).
#: Giving the calibrated name itself still selects the profile without the check.
DEFAULT_VARIANTS = {"llama-3.1-8b_h100_vllm085": "llama-3.1-8b_h100_vllm085_adaptercheck"}
#: the shipped fitted profile that the name ``default`` (or none) resolves to when it is present
DEFAULT_FITTED = DEFAULT_VARIANTS["llama-3.1-8b_h100_vllm085"]


def default_variant(calibrated: str) -> str:
    """The profile the twin picks for ``calibrated``'s model when no ``--profile`` is given
    (:data:`DEFAULT_VARIANTS`; a profile without a variant is its own, and a variant maps to itself)."""
    return DEFAULT_VARIANTS.get(calibrated, calibrated)


#: The embedded default: Llama-3.1-8B on an H100 with vLLM 0.8.5, hand-set from public
#: figures before any fit (decode 10.5 ms + 0.044 ms/seq and the LoRA percent model are the
#: published adapter twin's constants; prefill 0.07 ms/token is a typical H100 figure for
#: an 8B model; loads 7 ms CPU->GPU; KV 305k tokens at 8 slots of rank 8 falling by 47
#: tokens per slot-rank unit). Fitted profiles in ``calibration/profiles`` replace it.
DEFAULT_PROFILE: dict[str, Any] = {
    "schema": PROFILE_SCHEMA,
    "name": "default-llama-3.1-8b-h100",
    "version": 1,
    "model": "llama-3.1-8b",
    "gpu": "H100-64GB",
    "software": "vllm-0.8.5",
    "description": "embedded hand-set default (not fitted); see calibration/profiles for fitted ones",
    "lora_targets": list(ALL_TARGETS),
    "components": {
        "backbone": {"form": "linear", "params": {"c0": 0.0105, "c_prefill": 7.0e-5, "c_decode": 4.4e-5,
                                                   "c_ctx": 0.0}},
        "lora": {"form": "percent_of_base", "params": {"k6": 1.93, "k7": 200.0}},
        "scheduler": {"form": "linear_queue", "params": {"k0": 2.0e-4, "k1": 4.0e-6, "k2": 2.0e-7, "k3": 0.0}},
        "load": {"form": "link", "params": {"disk_fixed_s": 0.05, "disk_gbps": 2.0, "cpu_fixed_s": 0.004,
                                             "cpu_gbps": 25.0}},
        "kv": {"form": "memory_budget", "params": {"free_bytes": 40.47e9, "slot_bytes_per_rank": 6.15e6,
                                                    "kv_bytes_per_token": 131072}},
    },
}


@dataclass
class Profile:
    """Five fitted components and the model they describe."""

    name: str
    model: ModelSpec
    components: dict[str, PerfModel]
    gpu: str = ""
    software: str = ""
    lora_targets: tuple[str, ...] = ALL_TARGETS
    raw: dict[str, Any] = field(default_factory=dict, repr=False)
    #: host time per running request and engine step of a server behind an API front end with
    #: streaming clients (seconds; 0: the calibrated engine alone). See :meth:`with_serving_host`.
    serving_s_per_running: float = 0.0

    def __post_init__(self) -> None:
        missing = [k for k in KINDS if k not in self.components]
        if missing:
            raise ValueError(f"profile {self.name!r} lacks components {missing}")
        c = self.components
        # scalar fast paths, built once (the engine's hot path)
        self.backbone_s = c["backbone"].scalar()
        self.lora_s = c["lora"].scalar()
        sched = c["scheduler"].scalar()
        h = self.serving_s_per_running
        if not (h >= 0.0 and math.isfinite(h)):
            raise ValueError(f"serving_s_per_running {h!r}: give seconds per running request and step, >= 0")
        if h:
            def scheduler_s(running: int, waiting: int, slots: int, served: int, _sched=sched, _h=h) -> float:
                return _sched(running, waiting, slots, served) + _h * running
            self.scheduler_s = scheduler_s
        else:
            self.scheduler_s = sched
        self._load = c["load"].predict
        self._kv = c["kv"].predict
        #: per-slot time of a step with a prefill (None: the profile has no such component)
        self.mixed_s = c["mixed"].scalar() if "mixed" in c else None
        #: host time of vLLM's per-step adapter check, ``f(active, served)`` (None: the profile has no such component;
        #: :class:`twin.perf.forms.RegistryPairsAdapterCheck`)
        self.adapter_check_s = c["adapter_check"].scalar() if "adapter_check" in c else None
        if self.adapter_check_s is not None:
            self.step_s = self._step_s_adapter_check
        # a decode run's steps differ only in their context tokens (and the waiting count at
        # arrivals): when the backbone adds its context term last and the LoRA term does not
        # depend on the base time (or is a percentage of it), a step is a few float operations
        # on constants of the run (:meth:`_decode_run_fast`)
        bb, lo = c["backbone"], c["lora"]
        self._ctx_coef = float(bb.params[bb.ctx_last_param]) if bb.ctx_last_param else None
        self._bb_scalar = self.backbone_s
        self._lora_scalar = self.lora_s
        self._lora_const = not lo.uses_base
        self._lora_factor = getattr(lo, "base_factor", None) if lo.uses_base else None
        #: the LoRA form prices each request at its own rank when given ``rank_sums``
        #: (:class:`twin.perf.slora_forms.PagedLora`); the engine then passes them
        self.lora_own_ranks = lo.own_ranks

    # ------------------------------------------------------------------ the step-time entry point
    def step_s(self, prefill_tokens: int, n_dec: int, ctx_tokens: int, n_req: int, active: int, max_rank: int,
               slots: int, running: int, waiting: int, served: int,
               rank_sums: tuple[int, int] | None = None, registered: int | None = None) -> float:
        """Duration of one engine step: scheduler CPU time + (backbone + LoRA overhead).

        ``prefill_tokens`` and ``n_dec`` (one token each) are the step's work, ``ctx_tokens``
        the context its decodes attend to, ``n_req`` its requests (LM-head rows). The LoRA
        term sees ``active`` adapters in the batch, the ``slots`` (``max_loras``: vLLM 0.8.5's
        kernels launch thread blocks for every slot, :class:`twin.perf.forms.KernelGridLora`)
        and ``max_rank`` (``max_lora_rank``: vLLM pads every slot's A/B buffers to it and the
        kernels run over the padded rank). The scheduler term sees ``running`` and ``waiting``
        requests and the ``served`` adapters. A step with prefill tokens adds the profile's
        ``mixed`` term (per distinct adapter; :class:`twin.perf.forms.PrefillAdaptersMixed`) when it
        has one. ``rank_sums`` (only for a LoRA form with ``lora_own_ranks``): the sums of the
        step's requests' own ranks over its requests and over its LoRA tokens. ``registered``: the adapters in
        the CPU tier at the step (vLLM's ``list_adapters()``), priced by an ``adapter_check`` component only
        (None: ``served``, every served adapter registered). The engine, its
        decode-run fast path (:meth:`decode_run`) and the validation diagnostic all use this formula."""
        base = self.backbone_s(prefill_tokens, n_dec, ctx_tokens)
        comp = base + self.lora_s(base, active, max_rank, prefill_tokens + n_dec, slots, n_req, rank_sums)
        if prefill_tokens > 0 and self.mixed_s is not None:  # never in a decode run (see :meth:`decode_run`)
            comp = comp + self.mixed_s(prefill_tokens, active, slots)
        return self.scheduler_s(running, waiting, slots, served) + comp

    def _step_s_adapter_check(self, prefill_tokens: int, n_dec: int, ctx_tokens: int, n_req: int, active: int,
                              max_rank: int, slots: int, running: int, waiting: int, served: int,
                              rank_sums: tuple[int, int] | None = None, registered: int | None = None) -> float:
        """:meth:`step_s` of a profile with an ``adapter_check`` component (the instance's ``step_s``, set when it
        loads, so the others pay nothing): its host time added to the scheduler term (constant within a decode
        run, where :meth:`_decode_run_fast` adds it the same way). Its ``N`` is ``registered`` (the CPU tier's
        adapters: ``LRUCacheWorkerLoRAManager.list_adapters()``), ``served`` when not given."""
        base = self.backbone_s(prefill_tokens, n_dec, ctx_tokens)
        comp = base + self.lora_s(base, active, max_rank, prefill_tokens + n_dec, slots, n_req, rank_sums)
        if prefill_tokens > 0 and self.mixed_s is not None:
            comp = comp + self.mixed_s(prefill_tokens, active, slots)
        n_reg = served if registered is None else registered
        return (self.scheduler_s(running, waiting, slots, served) + self.adapter_check_s(active, n_reg)) + comp

    def decode_run(self, t: float, k_max: int, t_end: float, n_dec: int, ctx_tokens: int, active: int,
                   max_rank: int, slots: int, running: int, served: int, waiting: int, varying: bool,
                   arrivals: Sequence[float] = (), ok_cum: Sequence[int] = (0,), ptr: int = 0,
                   next_arrival: float = math.inf,
                   rank_sums: tuple[int, int] | None = None,
                   registered: int | None = None) -> tuple[int, float, float, list[float] | None]:
        """A run of up to ``k_max`` pure-decode steps starting at ``t``, stopped after the first
        step that ends at or after ``t_end``: returns ``(steps, end time, first duration,
        per-step durations or None when they are all equal)``.

        Each step's duration is :meth:`step_s` of the batch at its start: the context grows by
        ``n_dec`` tokens a step, and (when ``varying``) requests arriving before a step's start
        join the waiting queue (``arrivals`` is the arrival-time column, ``ok_cum`` the prefix
        counts of requests that are not rejected, ``ptr`` the next arrival's index; ``rank_sums``
        and ``registered`` as in :meth:`step_s`, constant over the run). The clock is summed step by step in the
        engine's order, so it is bit-identical to single steps."""
        k = 0
        ctx_tok = ctx_tokens
        if not varying:
            d = self.step_s(0, n_dec, ctx_tok, n_dec, active, max_rank, slots, running, waiting, served, rank_sums,
                            registered)
            while k < k_max:
                t += d
                k += 1
                if t >= t_end:
                    break
            return k, t, d, None
        if (self._ctx_coef is not None and self.backbone_s is self._bb_scalar and self.lora_s is self._lora_scalar
                and (self._lora_const or self._lora_factor is not None)):
            return self._decode_run_fast(t, k_max, t_end, n_dec, ctx_tokens, active, max_rank, slots, running, served,
                                         waiting, arrivals, ok_cum, ptr, next_arrival, rank_sums, registered)
        durs: list[float] = []
        n = len(arrivals)
        p = ptr
        next_t = next_arrival
        w0 = waiting - ok_cum[p]
        step = self.step_s
        while k < k_max:
            if t >= next_t:  # arrivals before this step's start join the waiting queue
                while p < n and arrivals[p] <= t:
                    p += 1
                next_t = arrivals[p] if p < n else math.inf
                waiting = w0 + ok_cum[p]
            d = step(0, n_dec, ctx_tok, n_dec, active, max_rank, slots, running, waiting, served, rank_sums,
                     registered)
            durs.append(d)
            t += d
            k += 1
            ctx_tok += n_dec
            if t >= t_end:
                break
        return k, t, durs[0], durs

    def _decode_run_fast(self, t: float, k_max: int, t_end: float, n_dec: int, ctx_tokens: int, active: int,
                         max_rank: int, slots: int, running: int, served: int, waiting: int, arrivals: Sequence[float],
                         ok_cum: Sequence[int], ptr: int, next_arrival: float,
                         rank_sums: tuple[int, int] | None = None,
                         registered: int | None = None) -> tuple[int, float, float, list[float]]:
        """:meth:`decode_run` (varying steps) with each step's :meth:`step_s` written out on
        the run's constants: ``base = backbone(0, D, 0) + c_ctx * C`` (the backbone adds its
        context term last), the LoRA term once (it does not depend on ``base``) or as
        ``base * f - base`` (a percentage of it), the scheduler term again only when the
        waiting count changes. Every float operation is the one :meth:`step_s` performs, in
        the same order, so the durations are bit-identical (tests compare with single steps)."""
        k = 0
        ctx_tok = ctx_tokens
        durs: list[float] = []
        append = durs.append
        n = len(arrivals)
        p = ptr
        next_t = next_arrival
        w0 = waiting - ok_cum[p]
        sch = self.scheduler_s
        if self.adapter_check_s is not None:  # (added to the scheduler term, as :meth:`step_s` adds it)
            chk = self.adapter_check_s(active, served if registered is None else registered)
            sch = lambda r, w, g, n, _sch=sch, _chk=chk: _sch(r, w, g, n) + _chk  # noqa: E731
        s = sch(running, waiting, slots, served)
        k0 = self.backbone_s(0, n_dec, 0)
        cc = self._ctx_coef
        f = None if self._lora_const else self._lora_factor(active, max_rank)
        if f is None:  # a LoRA term independent of base (or none: no adapter in the batch)
            lo = self.lora_s(k0, active, max_rank, n_dec, slots, n_dec, rank_sums) if self._lora_const else 0.0
            while k < k_max:
                if t >= next_t:  # arrivals before this step's start join the waiting queue
                    while p < n and arrivals[p] <= t:
                        p += 1
                    next_t = arrivals[p] if p < n else math.inf
                    s = sch(running, w0 + ok_cum[p], slots, served)
                d = s + ((k0 + cc * ctx_tok) + lo)
                append(d)
                t += d
                k += 1
                ctx_tok += n_dec
                if t >= t_end:
                    break
            return k, t, durs[0], durs
        while k < k_max:
            if t >= next_t:
                while p < n and arrivals[p] <= t:
                    p += 1
                next_t = arrivals[p] if p < n else math.inf
                s = sch(running, w0 + ok_cum[p], slots, served)
            base = k0 + cc * ctx_tok
            extra = base * f - base
            d = s + (base + (extra if extra > 0.0 else 0.0))
            append(d)
            t += d
            k += 1
            ctx_tok += n_dec
            if t >= t_end:
                break
        return k, t, durs[0], durs

    def with_serving_host(self, s_per_running: float) -> "Profile":
        """A copy whose steps also cost ``s_per_running`` seconds per running request: host time that
        grows with the batch when vLLM serves through its API server to streaming clients, and that the
        calibration's offline runs do not contain (issue 17, item 1; fitted on the validation's fit split
        by :mod:`twin.validation.serving_host`). It is added to the scheduler term (vLLM 0.8.5 overlaps
        none of its host work with the GPU), so single steps, decode runs and the fast path all see it."""
        return dataclasses.replace(self, serving_s_per_running=float(s_per_running))

    def with_rank_tile_cost(self, cost: float) -> "Profile":
        """A copy whose LoRA shrink kernel prices the working blocks of each rank tile beyond the first
        at ``cost`` times the first's (``n_tile_cost`` of :class:`twin.perf.forms.KernelGridLora`).

        vLLM 0.8.5's shrink kernel tiles the rank in blocks of 16, so slots padded to rank 32 run two
        tiles; the calibration measured rank 8 only, and its profiles price every tile alike (1), an
        extrapolation. The fit split of the real runs puts it near a quarter
        (:mod:`twin.validation.rank_tile`, :data:`twin.validation.specs.RANK_TILE_COST`): the second
        tile reads the input slice the first brought into L2. Slots of rank <= 16 are unchanged.
        Only the ``kernel_grid`` LoRA form has rank tiles; any other form is refused (unless ``cost`` is 1,
        which changes nothing)."""
        return self._with_kernel_grid_cost(
            "n_tile_cost", cost, "rank tile cost",
            "give the working-block cost of a rank tile beyond the first relative to the first, >= 0 (1: every "
            "tile alike, the calibrated profiles)", "rank tiles to price (a rank tile cost applies")

    def with_split64_cost(self, cost: float) -> "Profile":
        """A copy whose LoRA shrink kernel prices a working block of a 64-split step (fewer than 128 tokens;
        the LM head: fewer than 128 requests) at ``cost`` times an 8-split one (``split64_cost`` of
        :class:`twin.perf.forms.KernelGridLora`; 1 prices them alike; the Llama-3.1-8B profile's own, 0.58, is
        fitted by :mod:`calibration.fitting.split64`). A what-if of :mod:`twin.validation.light_step`."""
        return self._with_kernel_grid_cost(
            "split64_cost", cost, "split64 cost",
            "give the cost of a 64-split working shrink block relative to an 8-split one, >= 0 (1: alike; the "
            "Llama-3.1-8B profile's own: 0.58)", "split-K blocks to price (a split64 cost applies")

    def _with_kernel_grid_cost(self, param: str, cost: float, what: str, fix: str, none: str) -> "Profile":
        """A copy with the ``kernel_grid`` LoRA form's relative block cost ``param`` set to ``cost`` (finite,
        >= 0; a profile with another LoRA form is refused unless ``cost`` is 1, which changes nothing)."""
        c = float(cost) if is_real_number(cost) else math.nan  # (not "2", not True)
        if not (c >= 0.0 and math.isfinite(c)):
            raise ValueError(f"{what} {cost!r}: {fix}")
        lo = self.components["lora"]
        if getattr(lo, "form", None) != "kernel_grid":
            if c == 1.0:
                return self
            raise ValueError(f"profile {self.name!r}: its LoRA form {getattr(lo, 'form', type(lo).__name__)!r} has no "
                             f"{none} to the kernel_grid form of vLLM 0.8.5's Triton kernels); leave the {what} "
                             f"out or at 1")
        lo = copy.copy(lo)
        lo.params = {**lo.params, param: c}
        return dataclasses.replace(self, components={**self.components, "lora": lo})

    def with_lora_targets(self, targets: "Sequence[str] | str") -> "Profile":
        """A copy whose adapters adapt ``targets`` (``'qkvo'``, ``'all'``, a comma list or a
        sequence of module names): the adapter bytes follow them (loads, copies, S-LoRA's pool slots), and
        the LoRA compute of the forms that run per adapted projection (S-LoRA's Punica form, the paged form:
        :class:`twin.perf.slora_forms.PunicaLoraCost` reads ``lora_targets``). vLLM's own kernels
        (``kernel_grid``) run on every linear layer whatever the targets
        (:meth:`twin.perf.forms.KernelGridLora._layer_slices`), and its slot buffers are the fitted ones."""
        return dataclasses.replace(self, lora_targets=parse_lora_targets(targets))

    def with_paged_lora(self) -> "Profile":
        """A copy whose LoRA compute is :class:`twin.perf.slora_forms.PagedLora` (adapter weights
        paged in the KV pool, FastLibra §2), with the constants this profile implies."""
        comps = dict(self.components)
        comps["lora"] = PagedLora.from_profile(self)
        return dataclasses.replace(self, components=comps)

    def without(self, *kinds: str) -> "Profile":
        """This profile without the optional components ``kinds`` (e.g. ``"mixed"``): the off
        switch of a mechanism; the other components are the same objects."""
        bad = [k for k in kinds if k not in OPTIONAL_KINDS]
        if bad:
            raise ValueError(f"only optional components can be removed ({', '.join(OPTIONAL_KINDS)}), not {bad}")
        raw = dict(self.raw)
        if "components" in raw:
            raw["components"] = {k: v for k, v in raw["components"].items() if k not in kinds}
        return Profile(name=self.name, model=self.model,
                       components={k: v for k, v in self.components.items() if k not in kinds}, gpu=self.gpu,
                       software=self.software, lora_targets=self.lora_targets, raw=raw,
                       serving_s_per_running=self.serving_s_per_running)

    def adapter_bytes(self, rank: int) -> int:
        return self.model.adapter_bytes(rank, self.lora_targets)

    def load_s(self, rank: int, source: str, tp: int = 1, max_rank: int | None = None) -> float:
        """Seconds to load one adapter of ``rank`` from ``source`` ('disk' or 'cpu') into
        slots padded to ``max_rank``."""
        return self._load(rank, self.adapter_bytes(rank), source, tp, max_rank)

    def kv_capacity_tokens(self, slots: int, max_rank: int) -> int:
        return self._kv(slots, max_rank)

    @classmethod
    def from_dict(cls, d: dict[str, Any], origin: str = "<dict>") -> "Profile":
        if d.get("schema") != PROFILE_SCHEMA:
            raise ValueError(f"{origin}: not a LoRA Twin profile (schema {d.get('schema')!r}, "
                             f"expected {PROFILE_SCHEMA!r})")
        _check_layout(d, origin)
        bad = _non_finite(d["components"], "components")
        if bad:
            raise ValueError(f"{origin}: {bad[0]} is {bad[1]}; every constant of a profile must be a finite number "
                             f"(refit it with `twin calibrate fit`)")
        comps = {k: make_component(k, v) for k, v in d["components"].items()}
        _check_physical(d["components"], origin)
        if "model" not in d:
            raise ValueError(f"{origin}: no 'model' key; give the name of the model the profile was fitted on (e.g. "
                             f"\"model\": \"llama-3.1-8b\")")
        try:
            model = get_model(d["model"])
        except KeyError as e:
            raise ValueError(f"{origin}: model: {e.args[0]}; give the name of the model the profile was fitted "
                             f"on") from None
        prof = cls(name=d["name"], model=model, components=comps, gpu=d.get("gpu", ""),
                   software=d.get("software", ""), lora_targets=tuple(d.get("lora_targets", ALL_TARGETS)), raw=d)
        _check_tensor_parallel(d, model, origin)
        prof._check_positive_steps(origin)
        _check_signs(d["components"], origin)
        prof._check_range(origin)
        return prof

    def _check_gpu_memory(self, origin: str) -> None:
        """A GPU named with its memory (``H100-64GB``) holds the weights and the KV memory the profile gives
        (``kv.params.free_bytes``): a run sizes its KV cache from ``free_bytes``, so a profile relabelled
        ``H100-8GB`` ran with 37 GB of KV on an 8 GB GPU (the GPU's GB: :data:`GPU_GB`)."""
        gb = gpu_memory_gb(self.gpu)
        free = self.raw.get("components", {}).get("kv", {}).get("params", {}).get("free_bytes")
        if gb is None or free is None:
            return
        need = free + self.model.weight_bytes
        if need > gb * GPU_GB:
            raise ValueError(f"{origin}: gpu {self.gpu!r} names {gb:g} GB, less than {self.model.name}'s weights "
                             f"({self.model.weight_bytes / 1e9:.1f} GB) and the KV memory of "
                             f"components.kv.params.free_bytes ({free / 1e9:.1f} GB) take; fix the profile's gpu or "
                             f"refit it on that GPU (`twin calibrate fit`)")

    #: batches the profile's terms are checked on when it loads (:meth:`_check_positive_steps`): what, prefill
    #: tokens, decode tokens, context tokens, adapters in the batch, max rank, slots, running, waiting, served
    CHECK_STEPS: ClassVar[tuple[tuple[str, int, int, int, int, int, int, int, int, int], ...]] = (
        ("one decode token", 0, 1, 512, 0, 8, 1, 1, 0, 1),
        ("a 512-token prefill", 512, 0, 512, 0, 8, 1, 1, 0, 1),
        ("one decode token of one rank-8 adapter in 1 slot", 0, 1, 512, 1, 8, 1, 1, 0, 1),
        ("64 decodes of 8 rank-16 adapters in 128 slots, 100 waiting", 0, 64, 65536, 8, 16, 128, 64, 100, 256),
        ("a 2048-token prefill beside 16 decodes, 4 rank-64 adapters in 32 slots", 2048, 16, 8192, 4, 64, 32, 20, 10,
         64),
    )
    #: the longest step a profile may price (s): a step of minutes is a constant edited into nonsense
    MAX_STEP_S: ClassVar[float] = 60.0

    def _check_positive_steps(self, origin: str) -> None:
        """On :attr:`CHECK_STEPS`' batches, the base-model time is a finite number > 0, the LoRA, mixed-step and
        scheduler terms are finite and >= 0, and the step is at most :attr:`MAX_STEP_S` (a constant fitted or
        edited into nonsense, e.g. a negative intercept, would make the clock run backwards, or a negative LoRA
        constant make adapters free: runs that end at once or report negative latencies)."""
        for what, pre, dec, ctx, act, rank, slots, running, waiting, served in self.CHECK_STEPS:
            base = self.backbone_s(pre, dec, ctx)
            terms = [("base-model (backbone)", "backbone", base, False)]
            if act:
                terms.append(("LoRA", "lora", self.lora_s(base, act, rank, pre + dec, slots, dec + (pre > 0)), True))
            if pre and self.mixed_s is not None:
                terms.append(("mixed-step", "mixed", self.mixed_s(pre, act, slots), True))
            terms.append(("scheduler", "scheduler", self.scheduler_s(running, waiting, slots, served), True))
            for term, comp, v, zero_ok in terms:
                if not (math.isfinite(v) and (v >= 0 if zero_ok else v > 0)):
                    raise ValueError(f"{origin}: the {term} time of {what} is {v!r} s, not a duration "
                                     f"{'>= 0' if zero_ok else '> 0'}; check components.{comp}.params (refit the "
                                     f"profile with `twin calibrate fit`)")
            t = self.step_s(pre, dec, ctx, dec + (pre > 0), act, rank, slots, running, waiting, served)
            if not (math.isfinite(t) and 0 < t <= self.MAX_STEP_S):
                raise ValueError(f"{origin}: the step time of {what} is {t!r} s, not a duration in (0, "
                                 f"{self.MAX_STEP_S:g}] s; check the profile's constants (refit it with `twin "
                                 f"calibrate fit`)")

    #: The range of batches the twin runs a profile over (:meth:`_check_range`): contexts up to 300,000 tokens (a
    #: KV cache beyond any shipped GPU's), 512 adapter slots, max ranks 8 to 128, batches up to 1,024 sequences
    #: (``max_num_seqs`` of vLLM 0.8.5's server on a GPU of 70 GiB and more, :data:`twin.config.VLLM_SERVER_LIMITS_LARGE_GPU`),
    #: prefills up to 16,384 tokens (offline ``LLM``'s ``max_num_batched_tokens``), a waiting queue of a million
    #: requests and up to 100,000 served adapters. Each term is affine in these (or bounded by ``max``/clipping), so
    #: its extremes lie on the corners checked.
    RANGE_CONTEXT, RANGE_SLOTS, RANGE_RANKS, RANGE_BATCH = 300_000, 512, (8, 16, 128), 1024
    RANGE_PREFILL, RANGE_WAITING, RANGE_SERVED = 16_384, 1_000_000, 100_000

    def _check_range(self, origin: str) -> None:
        """Every term of a step (base model, LoRA, mixed step, scheduler, adapter check) is a finite number >= 0 on
        the corners of the range the twin runs (:attr:`RANGE_CONTEXT` ...): :attr:`CHECK_STEPS` samples five batches
        only, so a negative constant whose term grows with the batch (``l_active``, ``k_blocked``, ``k1_sq``,
        ``c_pair``, a TP table's ``c_ctx``) loaded and priced large batches below zero, running the clock backwards.
        ``ValueError`` naming the term, the batch and the component to fix."""
        _check_backbone_range(self.backbone_s, "components.backbone.params", origin)
        ctxs, slots_max, batch, pre = (0, self.RANGE_CONTEXT), self.RANGE_SLOTS, self.RANGE_BATCH, self.RANGE_PREFILL

        def refuse(term: str, comp: str, v: float, what: str) -> None:
            raise ValueError(f"{origin}: the {term} time of {what} is {v!r} s, not a duration >= 0 (the twin runs "
                             f"batches up to {batch} sequences, {pre:,}-token prefills, {self.RANGE_CONTEXT:,} context "
                             f"tokens, {slots_max} adapter slots of rank {self.RANGE_RANKS[0]}-{self.RANGE_RANKS[-1]}); "
                             f"check the signs of components.{comp}.params {_FIX}")
        for A in (1, slots_max):
            for r in self.RANGE_RANKS:
                for G in sorted({A, slots_max}):
                    for T, R in ((1, 1), (batch, batch), (batch + pre, batch), (pre, 1)):
                        for C in ctxs:
                            base = self.backbone_s(T - R, R, C)
                            v = self.lora_s(base, A, r, T, G, R)
                            if not (math.isfinite(v) and v >= 0):
                                refuse("LoRA", "lora", v, f"a step of {T} tokens of {R} requests, {A} adapters of max "
                                                          f"rank {r} in {G} slots, {C:,} context tokens")
        if self.mixed_s is not None:
            for P in (1, pre):
                for A in (1, slots_max):
                    for G in sorted({A, slots_max}):
                        v = self.mixed_s(P, A, G)
                        if not (math.isfinite(v) and v >= 0):
                            refuse("mixed-step", "mixed", v, f"a {P}-token prefill, {A} adapters in {G} slots")
        for R in (0, 1, batch):
            for W in (0, self.RANGE_WAITING):
                for G in (0, 1, slots_max):
                    for N in (1, slots_max, self.RANGE_SERVED):
                        v = self.scheduler_s(R, W, G, N)
                        if not (math.isfinite(v) and v >= 0):
                            refuse("scheduler", "scheduler", v, f"{R} running and {W:,} waiting requests, {G} slots, "
                                                                f"{N:,} served adapters")
        if self.adapter_check_s is not None:
            for A in (1, slots_max):
                for N in (1, slots_max, self.RANGE_SERVED):
                    v = self.adapter_check_s(A, N)
                    if not (math.isfinite(v) and v >= 0):
                        refuse("adapter-check", "adapter_check", v, f"{A} adapters in the batch, {N:,} registered")

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.raw)
        d["components"] = {k: v.to_dict() for k, v in self.components.items()}
        return d


def _non_finite(v: Any, where: str) -> tuple[str, str] | None:
    """``(path, value)`` of the first number under ``v`` that is NaN or infinite, else None."""
    if isinstance(v, float) and not math.isfinite(v):
        return where, repr(v)
    if isinstance(v, dict):
        items = v.items()
    elif isinstance(v, (list, tuple)):
        items = enumerate(v)
    else:
        return None
    for k, x in items:
        hit = _non_finite(x, f"{where}.{k}")
        if hit:
            return hit
    return None


#: parameters a component may carry besides its form's required ones (read with a default when absent)
OPTIONAL_PARAMS: dict[str, tuple[str, ...]] = {
    "backbone": ("tp_allreduce_alpha_s", "tp_link_gbps"),
    "lora": ("rank_coef", "l_adapter_token", "n_tile_cost", "split64_cost"),
    "load": ("table_s", "table_by_max_rank_s"),
}
#: load-time tables: source -> rank -> seconds (``table_by_max_rank_s``: source -> max rank -> rank -> seconds)
_LOAD_TABLES = {"table_s": 2, "table_by_max_rank_s": 3}
_FIX = "(refit it with `twin calibrate fit`)"
#: the most bytes a profile's memory constants may hold (a petabyte) and the largest count or dimension
MAX_BYTES, MAX_COUNT = 1e15, 1e8
#: parameters that are the model's dimensions (the kernel_grid LoRA form's block counts)
_DIMENSIONS = ("layers", "hidden", "intermediate", "q_dim", "kv_dim", "vocab")


def _describe(v: Any) -> str:
    """A JSON value as the profile file writes it, for an error message."""
    if isinstance(v, bool):
        return f"{str(v).lower()} (a JSON boolean)"
    if v is None:
        return "null"
    if isinstance(v, str):
        return f"the text {v!r}"
    return f"a JSON {'list' if isinstance(v, (list, tuple)) else 'object' if isinstance(v, dict) else type(v).__name__}"


def _check_layout(d: dict[str, Any], origin: str) -> None:
    """The profile's shape, as a hand edit can break it: ``name`` and ``model`` strings, ``lora_targets`` a
    non-empty list of module names, ``components`` an object of known components, each with a ``form`` name
    and a ``params`` object of numbers (the load tables: objects of numbers), no parameter its form does not
    read. ``ValueError`` naming the key, the value and the fix (before: ``'str' object has no attribute
    'get'``, ``float() argument must be ... not 'list'``, a ``true`` constant taken as 1, a misspelt
    optional parameter silently at its default)."""
    for key in ("name", "model"):
        if key in d and not (isinstance(d[key], str) and d[key].strip()):
            raise ValueError(f"{origin}: {key} is {_describe(d[key]) if not isinstance(d[key], str) else 'empty'}; "
                             f"give the profile's {key} as text{' (e.g. llama-3.1-8b)' if key == 'model' else ''}")
    for key, example in (("gpu", "H100-64GB"), ("software", "vllm-0.8.5")):  # (optional; read as text)
        if key in d and not isinstance(d[key], str):
            raise ValueError(f"{origin}: {key} is {_describe(d[key])}; give it as text (e.g. {example!r}) or leave "
                             f"it out")
    if "lora_targets" in d:
        t = d["lora_targets"]
        if not isinstance(t, list) or not t or not all(isinstance(x, str) for x in t):
            what = "an empty list" if isinstance(t, list) and not t else _describe(t)
            raise ValueError(f"{origin}: lora_targets is {what}; give a list of the modules the adapters adapt, "
                             f"e.g. [\"q_proj\", \"k_proj\", \"v_proj\", \"o_proj\"] (of {', '.join(ALL_TARGETS)})")
        bad = [x for x in t if x not in ALL_TARGETS]
        if bad:
            raise ValueError(f"{origin}: lora_targets names unknown module {bad[0]!r}; choose from "
                             f"{', '.join(ALL_TARGETS)}")
    comps = d.get("components")
    if "components" not in d:
        raise KeyError("components")
    if not isinstance(comps, dict):
        raise ValueError(f"{origin}: components is {_describe(comps)}; give an object of components "
                         f"({', '.join(KINDS + OPTIONAL_KINDS)}), each {{\"form\": ..., \"params\": {{...}}}}")
    known = KINDS + OPTIONAL_KINDS
    for kind, spec in comps.items():
        if kind not in known:
            raise ValueError(f"{origin}: unknown component {kind!r}; a profile has {', '.join(KINDS)} (and "
                             f"optionally {', '.join(OPTIONAL_KINDS)})")
        if not isinstance(spec, dict):
            raise ValueError(f"{origin}: components.{kind} is {_describe(spec)}; give an object "
                             f"{{\"form\": ..., \"params\": {{...}}}}")
        form = spec.get("form")
        if not isinstance(form, str):
            forms = sorted(f for k, f in FORMS if k == kind)
            raise ValueError(f"{origin}: components.{kind}.form is {_describe(form) if 'form' in spec else 'missing'}; "
                             f"give one of the forms {forms}")
        params = spec.get("params", {})
        if not isinstance(params, dict):
            raise ValueError(f"{origin}: components.{kind}.params is {_describe(params)}; give an object of the "
                             f"form's constants by name")
        cls = FORMS.get((kind, form))
        if cls is None:
            continue  # (make_component names the unknown form and the known ones)
        allowed = set(cls.param_names) | set(OPTIONAL_PARAMS.get(kind, ()))
        extra = sorted(k for k in params if k not in allowed)
        if extra:
            raise ValueError(f"{origin}: components.{kind}.params: unknown parameter(s) {extra} of form {form!r}, "
                             f"which reads {sorted(allowed)}; correct the name or remove it")
        for key, v in params.items():
            where = f"components.{kind}.params.{key}"
            depth = _LOAD_TABLES.get(key, 0) if kind == "load" else 0
            _check_numbers(v, where, depth, origin)
        if kind == "load" and "table_by_max_rank_s" in spec:  # (the fit writes it beside the params; LinkLoad reads
            # it there too, :meth:`twin.perf.forms.LinkLoad.predict`)
            _check_numbers(spec["table_by_max_rank_s"], "components.load.table_by_max_rank_s", 3, origin)
    _check_tp_layout(d, origin)


def _check_numbers(v: Any, where: str, depth: int, origin: str) -> None:
    """``v`` a number (``depth`` 0) or an object of such, ``depth`` levels deep (a load table)."""
    if depth == 0:
        if not is_real_number(v):
            raise ValueError(f"{origin}: {where} is {_describe(v)}, not a number; every constant of a profile must "
                             f"be a finite number (written without quotes) {_FIX}")
        return
    if not isinstance(v, dict):
        raise ValueError(f"{origin}: {where} is {_describe(v)}; give an object of load times in seconds, keyed as "
                         f"the shipped profiles key them (table_s: source, then rank, e.g. {{\"cpu\": {{\"8\": 0.007}}}}; "
                         f"table_by_max_rank_s: source, then max rank, then rank)")
    for k, x in v.items():
        _check_numbers(x, f"{where}.{k}", depth - 1, origin)


def _check_physical(comps: dict[str, Any], origin: str) -> None:
    """Constants whose sign the engine divides by or waits on: a KV token's bytes > 0,
    the link bandwidths > 0, fixed and tabulated load times >= 0, the load tables keyed by source
    (disk, cpu) and whole ranks. Before: a ZeroDivisionError traceback, SimPy's bare 'Negative delay', or a
    KV cache of 0 tokens blamed on the weights (with a --tp hint)."""
    rules = {"kv": (("kv_bytes_per_token", "a KV token's bytes", False),  # (free_bytes < 0: a model one GPU
                    # cannot hold, as the shipped llama-2-13b A100-24GB profile, served with --tp)
                    ("slot_bytes_per_rank", "an adapter slot's bytes per rank", True),
                    ("slot_fixed_bytes", "an adapter slot's fixed bytes", True),
                    ("lora_fixed_bytes", "LoRA's fixed bytes", True)),
             "lora": (("n_tile_cost", "a rank tile's cost (a share of the first tile's)", True),
                      ("split64_cost", "a 64-split block's cost (a share of an 8-split block's)", True)),
             "load": (("disk_gbps", "the disk -> CPU bandwidth (GB/s)", False),
                      ("cpu_gbps", "the CPU -> GPU bandwidth (GB/s)", False),
                      ("disk_fixed_s", "a load's fixed time from disk (s)", True),
                      ("cpu_fixed_s", "a load's fixed time from the CPU (s)", True))}
    for kind, checks in rules.items():
        params = comps.get(kind, {}).get("params", {})
        for key, what, zero_ok in checks:
            if key in params and not (params[key] >= 0 if zero_ok else params[key] > 0):
                raise ValueError(f"{origin}: components.{kind}.params.{key} is {params[key]!r}; {what} must be "
                                 f"{'>= 0' if zero_ok else '> 0'} {_FIX}")
    backbone = comps.get("backbone", {})
    cls = FORMS.get(("backbone", backbone.get("form")))
    if cls is not None:
        # a time or a time per token, sequence or context token of the base model: a negative one is no cost (a
        # roofline's max() would hide a negative c_tok behind its memory floor: a 2048-token prefill at 16 ms). The
        # signs are the form's own (PerfModel.nonneg_params), not the file's ``units``: without them a negative c_ctx
        # loaded and priced a 300,000-token context at -17 ms
        _check_backbone_signs(cls, backbone.get("params") or {}, "components.backbone.params", origin)
    kv = comps.get("kv", {}).get("params", {})
    if "kv_bytes_per_token" in kv and kv["kv_bytes_per_token"] < 1:  # (1e-300: "cannot convert float NaN to integer")
        raise ValueError(f"{origin}: components.kv.params.kv_bytes_per_token is {kv['kv_bytes_per_token']!r}; a KV "
                         f"token takes at least a byte {_FIX}")
    if "free_bytes" in kv and not abs(kv["free_bytes"]) <= MAX_BYTES:  # (1e300: a 300-digit KV capacity)
        raise ValueError(f"{origin}: components.kv.params.free_bytes is {kv['free_bytes']!r}; memory for the KV cache "
                         f"beyond {MAX_BYTES:.0e} bytes (a petabyte) is no GPU's {_FIX}")
    for kind, spec in comps.items():  # counts: the model's dimensions, the CUDA-graph capture size
        for key, v in spec.get("params", {}).items():
            low = 0 if key == "graph_max_tokens" else 1 if key in _DIMENSIONS else None
            if low is not None and v > MAX_COUNT:  # (layers = 1e15 ran as given)
                raise ValueError(f"{origin}: components.{kind}.params.{key} is {v!r}; beyond {MAX_COUNT:.0e}, no "
                                 f"model's {'token count' if low == 0 else 'dimension'} {_FIX}")
            if low is not None and not (v >= low and float(v).is_integer()):
                raise ValueError(f"{origin}: components.{kind}.params.{key} is {v!r}; "
                                 f"{'a token count' if low == 0 else 'a dimension of the model'} must be a whole "
                                 f"number >= {low} {_FIX}")
    load = comps.get("load", {})
    params = load.get("params", {})
    tables = [(f"components.load.params.{key}", params[key], depth) for key, depth in _LOAD_TABLES.items()
              if key in params]
    if "table_by_max_rank_s" in load:  # (where the fit writes it: calibration.fitting.components.fit_load)
        tables.append(("components.load.table_by_max_rank_s", load["table_by_max_rank_s"], 3))
    for at, tab, depth in tables:
        for source, table in tab.items():
            if source not in ("disk", "cpu"):
                raise ValueError(f"{origin}: {at}: unknown source {source!r}; the tables "
                                 f"are by source 'disk' (disk -> CPU) and 'cpu' (CPU -> GPU)")
            stack = [(f"{at}.{source}", table, depth - 1)]
            while stack:
                where, t, level = stack.pop()
                for r, x in t.items():
                    if not (str(r).isdigit() and int(r) >= 1):
                        raise ValueError(f"{origin}: {where}: key {r!r} is not a LoRA rank; key the load times by "
                                         f"rank, e.g. \"8\"")
                    if level > 1:
                        stack.append((f"{where}.{r}", x, level - 1))
                    elif not x >= 0:  # (0: an instant load, as tests and what-if profiles write)
                        raise ValueError(f"{origin}: {where}.{r} is {x!r}; a load time must be >= 0 s {_FIX}")


def _check_backbone_signs(cls: type[PerfModel], params: dict[str, Any], where: str, origin: str) -> None:
    """The signs a backbone form declares (:attr:`twin.perf.forms.PerfModel.nonneg_params`, ``positive_params``)."""
    for key in cls.nonneg_params:
        if key in params and not params[key] >= 0:
            if key == "graph_max_tokens":  # (a count, not a time)
                raise ValueError(f"{origin}: {where}.{key} is {params[key]!r}; a token count must be a whole number "
                                 f">= 0 {_FIX}")
            raise ValueError(f"{origin}: {where}.{key} is {params[key]!r} {cls.units.get(key, 's')}; a base-model time "
                             f"must be >= 0 {_FIX}")
    for key in cls.positive_params:
        if key in params and not params[key] > 0:
            raise ValueError(f"{origin}: {where}.{key} is {params[key]!r}; the all-reduce bus bandwidth (GB/s) must be "
                             f"> 0 (leave it out for the default) {_FIX}")


def _check_signs(comps: dict[str, Any], origin: str) -> None:
    """Every constant a component's form declares non-negative (``nonneg_params``: a time, a cost per token, block,
    request or adapter, a byte count) is >= 0, and those it declares positive (``positive_params``) are > 0 --
    whatever the batch: :meth:`Profile._check_positive_steps` samples five batches, at which a negative ``l_active``,
    ``k_blocked``, ``k1_sq`` or ``c_pair`` is outweighed by the other terms while larger batches get a negative
    component time. Runs after the sampled batches are checked (their messages name the step they price)."""
    for kind, spec in comps.items():
        cls = FORMS.get((kind, spec.get("form")))
        if cls is None:
            continue
        params = spec.get("params") or {}
        for key in cls.nonneg_params:
            if key in params and not params[key] >= 0:
                unit = cls.units.get(key, "")
                raise ValueError(f"{origin}: components.{kind}.params.{key} is {params[key]!r}"
                                 f"{f' ({unit})' if unit else ''}; the {cls.form} form's {key} is a cost (or a size) "
                                 f"and must be >= 0: a negative one makes the {kind} time negative at large batches "
                                 f"{_FIX}")
        for key in cls.positive_params:
            if key in params and not params[key] > 0:
                raise ValueError(f"{origin}: components.{kind}.params.{key} is {params[key]!r}; the {cls.form} form's "
                                 f"{key} must be > 0 {_FIX}")


def _check_backbone_range(backbone_s: Any, where: str, origin: str) -> None:
    """The base-model time is a finite number >= 0 at the corners of :class:`Profile`'s range (prefill 0, 1 and
    :attr:`Profile.RANGE_PREFILL` tokens; 0, 1 and :attr:`Profile.RANGE_BATCH` decodes; 0 and
    :attr:`Profile.RANGE_CONTEXT` context tokens): every backbone form is affine in these, or a ``max`` of such."""
    for P in (0, 1, Profile.RANGE_PREFILL):
        for D in (0, 1, Profile.RANGE_BATCH):
            for C in (0, Profile.RANGE_CONTEXT):
                if P == 0 and D == 0:
                    continue
                v = backbone_s(P, D, C)
                if not (math.isfinite(v) and v >= 0):
                    raise ValueError(f"{origin}: the base-model (backbone) time of a step of {P} prefill tokens and {D} "
                                     f"decodes over {C:,} context tokens is {v!r} s, not a duration >= 0; check the "
                                     f"signs of {where} {_FIX}")


def _check_tp_layout(d: dict[str, Any], origin: str) -> None:
    """The profile's tensor-parallel entries, as a hand edit can break them: the top-level ``tensor_parallel`` (the
    degree the profile was calibrated at) a whole number >= 1, and the backbone's measured tables
    ``components.backbone.tensor_parallel`` an object ``{"2": {"params": {...}}, ...}`` keyed by degrees >= 2 whose
    params give *every* constant of the backbone's form (:func:`twin.tensor_parallel.tp_profile` replaces the TP-1
    constants by them: a missing one was silently the TP-1 value), as numbers. Before: ``invalid literal for
    int()``, ``could not convert string to float``, a TP-2 run at -0.1 simulated seconds."""
    if "tensor_parallel" in d:
        v = d["tensor_parallel"]
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            what = repr(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else _describe(v)
            raise ValueError(f"{origin}: tensor_parallel is {what}; "
                             f"give the tensor-parallel degree the profile was calibrated at as a whole number >= 1 "
                             f"(e.g. 2), or leave it out (1: one GPU)")
    backbone = d["components"].get("backbone")
    if not isinstance(backbone, dict) or "tensor_parallel" not in backbone:
        return
    tables = backbone["tensor_parallel"]
    where = "components.backbone.tensor_parallel"
    fix = ("give an object of the backbone constants measured per TP degree, e.g. {\"2\": {\"params\": {...}}}, or "
           "remove it (the analytical split c0 + (t_1 - c0) / tp is then used)")
    if not isinstance(tables, dict):
        raise ValueError(f"{origin}: {where} is {_describe(tables)}; {fix}")
    cls = FORMS.get(("backbone", backbone.get("form")))
    for tp, table in tables.items():
        if not (str(tp).isdigit() and int(tp) >= 2):
            raise ValueError(f"{origin}: {where}: key {tp!r} is not a tensor-parallel degree; key the tables by the "
                             f"degree they were measured at, a whole number >= 2 (e.g. \"2\"; TP 1 is the profile's "
                             f"own components.backbone.params)")
        if not isinstance(table, dict) or not isinstance(table.get("params"), dict):
            what = _describe(table) if not isinstance(table, dict) else (
                f"an object whose params is {_describe(table['params'])}" if "params" in table else
                "an object without params")
            raise ValueError(f"{origin}: {where}.{tp} is {what}; {fix}")
        params = table["params"]
        if cls is None:
            continue  # (the backbone's unknown form is named by make_component)
        allowed = set(cls.param_names) | set(OPTIONAL_PARAMS["backbone"])
        extra = sorted(k for k in params if k not in allowed)
        if extra:
            raise ValueError(f"{origin}: {where}.{tp}.params: unknown parameter(s) {extra} of form {cls.form!r}, which "
                             f"reads {sorted(allowed)}; correct the name or remove it")
        missing = [k for k in cls.param_names if k not in params]
        if missing:
            raise ValueError(f"{origin}: {where}.{tp}.params lacks {missing}; a TP table replaces the TP-1 constants "
                             f"of form {cls.form!r} as a whole: give every one of {list(cls.param_names)}, or remove "
                             f"the table (the analytical split is then used)")
        for key, v in params.items():
            _check_numbers(v, f"{where}.{tp}.params.{key}", 0, origin)


def valid_degrees(model: ModelSpec, limit: int | None = None) -> list[int]:
    """TP degrees vLLM accepts for ``model``: divisors of the attention heads that divide the KV heads or are a
    multiple of them (``limit``: at most this degree). vLLM's ``QKVParallelLinear`` asserts exactly this; see
    :mod:`twin.tensor_parallel`, which re-exports it (defined here, where a profile's calibrated degree is checked)."""
    top = model.heads if limit is None else min(model.heads, limit)
    return [d for d in range(1, top + 1)
            if model.heads % d == 0 and (model.kv_heads % d == 0 or d % model.kv_heads == 0)]


def _check_tensor_parallel(d: dict[str, Any], model: ModelSpec, origin: str) -> None:
    """The signs and the range of each measured TP table's backbone (as for the TP-1 constants), and a calibrated
    degree the model accepts (:func:`twin.tensor_parallel.check_degree`)."""
    if "tensor_parallel" in d and d["tensor_parallel"] not in valid_degrees(model):
        raise ValueError(f"{origin}: tensor_parallel is {d['tensor_parallel']}, a degree {model.name} cannot be split "
                         f"by (vLLM refuses it); use one of {', '.join(map(str, valid_degrees(model)))}")
    backbone = d["components"]["backbone"]
    cls = FORMS[("backbone", backbone["form"])]
    for tp, table in (backbone.get("tensor_parallel") or {}).items():
        where = f"components.backbone.tensor_parallel.{tp}.params"
        params = {**backbone["params"], **table["params"]}
        _check_backbone_signs(cls, table["params"], where, origin)
        for key in ("graph_max_tokens",):
            v = table["params"].get(key)
            if v is not None and not (v <= MAX_COUNT and float(v).is_integer()):
                raise ValueError(f"{origin}: {where}.{key} is {v!r}; a token count must be a whole number >= 0 {_FIX}")
        comp = cls(params=params)
        _check_backbone_range(comp.scalar(), where, origin)
        t = comp.scalar()(0, 1, 512)
        if not (math.isfinite(t) and 0 < t <= Profile.MAX_STEP_S):
            raise ValueError(f"{origin}: the base-model time of one decode token at TP {tp} is {t!r} s, not a "
                             f"duration in (0, {Profile.MAX_STEP_S:g}] s; check {where} {_FIX}")


def parse_lora_targets(targets: "Sequence[str] | str") -> tuple[str, ...]:
    """``'qkvo'``, ``'all'``, ``'q_proj,v_proj'`` or a sequence of module names -> module names;
    ``ValueError`` naming an unknown module."""
    if isinstance(targets, str):
        t = targets.strip()
        names = QKVO if t == "qkvo" else ALL_TARGETS if t == "all" else tuple(x.strip() for x in t.split(",") if x.strip())
    else:
        names = tuple(targets)
    bad = [m for m in names if m not in ALL_TARGETS]
    if bad or not names:
        raise ValueError(f"--lora-targets: unknown module {bad[0] if bad else '(none)'!r}; give qkvo, all, or a comma "
                         f"list of {', '.join(ALL_TARGETS)}")
    return tuple(m for m in ALL_TARGETS if m in names)


def available_profiles() -> dict[str, Path | None]:
    """Profiles by name: the shipped JSON files plus the embedded default (path None)."""
    out: dict[str, Path | None] = {"default": None}
    if PROFILE_DIR.is_dir():
        for p in sorted(PROFILE_DIR.glob("*.json")):
            out[p.stem] = p
    return out


@lru_cache(maxsize=32)
def _load_file(path: str) -> dict[str, Any]:
    """A profile file's JSON; ``ValueError`` naming the file when it is not a readable JSON object."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except IsADirectoryError:
        raise ValueError(f"profile file {path} is a directory; give a profile JSON file") from None
    except OSError as e:
        raise ValueError(f"profile file {path} cannot be read ({e.strerror or e})") from None
    if not raw.strip():
        raise ValueError(f"profile file {path} is empty; give a profile JSON file (`twin calibrate list` shows the "
                         f"shipped ones)")
    try:
        d = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ValueError(f"profile file {path} is not a text file (not UTF-8 JSON); give a profile JSON file") from None
    except (json.JSONDecodeError, RecursionError) as e:
        raise ValueError(f"profile file {path} is not valid JSON ({e}); give a profile JSON file") from None
    if not isinstance(d, dict):
        raise ValueError(f"profile file {path} holds a JSON {type(d).__name__}, not a profile object")
    return d


def _from_file(path: str, origin: str) -> Profile:
    d = _load_file(path)
    if d.get("schema") != PROFILE_SCHEMA:
        raise ValueError(f"profile file {origin} is not a LoRA Twin profile (schema {d.get('schema')!r}, expected "
                         f"{PROFILE_SCHEMA!r}); `twin calibrate fit` writes one")
    try:
        prof = Profile.from_dict(d, origin)
        prof._check_gpu_memory(origin)  # (a profile file's claim; a dict built in code may size its KV freely)
        return prof
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
        msg = f"missing key {e.args[0]!r}" if isinstance(e, KeyError) and e.args else str(e)
        msg = msg[len(origin) + 2:] if msg.startswith(f"{origin}: ") else msg  # (the file is named once)
        raise ValueError(f"profile file {origin} is not a valid profile: {msg}") from None


def load_profile(name_or_path: str | None = None) -> Profile:
    """Resolve ``name_or_path``: None/'default', a shipped profile name, or a JSON file.
    Raises ``KeyError`` for an unknown name (listing the shipped ones), ``FileNotFoundError``
    and ``ValueError`` naming the file for a missing, unreadable or malformed one."""
    if name_or_path in (None, "", "default"):
        avail = available_profiles()
        # a fitted profile of the default model takes precedence over the hand-set constants
        for cand in (DEFAULT_FITTED,):
            if avail.get(cand):
                return _from_file(str(avail[cand]), str(avail[cand]))
        return Profile.from_dict(DEFAULT_PROFILE, "embedded default")
    p = Path(name_or_path)
    if p.suffix == ".json" or p.exists():
        if not p.exists():
            raise FileNotFoundError(f"profile file {p} does not exist; `twin calibrate list` shows the shipped ones")
        return _from_file(str(p.resolve()), str(p))
    avail = available_profiles()
    if name_or_path == "embedded":
        return Profile.from_dict(DEFAULT_PROFILE, "embedded default")
    if name_or_path not in avail:
        raise KeyError(f"unknown profile {name_or_path!r}{did_you_mean(name_or_path, avail)}; available: "
                       f"{', '.join(avail)} "
                       f"(or give a path to a profile JSON file)")
    return _from_file(str(avail[name_or_path]), str(avail[name_or_path]))


#: bytes in one "GB" of a GPU's stated memory: binary, as GPUs are sized (an H100-80GB holds 81,559 MiB, 79.6 GiB,
#: 85.5e9 bytes; vLLM's ``gpu_memory_utilization`` applies to those bytes). The calibration's H100-64GB profile
#: agrees: 0.9 x 64 GiB - 16.06 GB of weights - the 5 GB runtime reserve = 40.79 GB, against the 40.65 GB of KV
#: memory vLLM measured (``kv.params.free_bytes``); 64e9 bytes would give 36.54 GB
GPU_GB = 2 ** 30


def kv_tokens_for_memory(profile: Profile, gpu_mem_gb: float, slots: int, max_rank: int,
                         utilization: float = 0.9, runtime_overhead_gb: float = 5.0) -> int:
    """KV capacity (tokens) of a GPU with ``gpu_mem_gb`` GB as GPUs state it (:data:`GPU_GB`: GiB), as vLLM sizes it.

    ``utilization * memory - weights - runtime overhead (activations, CUDA graphs) -
    slots * LoRA slot buffers`` divided by the KV bytes per token, rounded down to blocks.
    The slot buffer per rank comes from the profile's KV model when it has one, else
    from the model's dimensions (all target modules). The 5 GB (1e9 bytes) runtime overhead is the
    typical activation + CUDA-graph reserve of a 7-8B model in vLLM 0.8.5.
    """
    model = profile.model
    kv = profile.components["kv"].params
    per_rank = kv.get("slot_bytes_per_rank") or profile.adapter_bytes(max(max_rank, 1)) / max(max_rank, 1)
    if not (gpu_mem_gb > 0 and math.isfinite(gpu_mem_gb)):
        raise ValueError(f"GPU memory must be a positive number of GB, got {gpu_mem_gb}")
    fixed = model.weight_bytes + runtime_overhead_gb * 1e9 + slots * per_rank * max_rank
    free = utilization * gpu_mem_gb * GPU_GB - fixed
    tokens = int(free // model.kv_bytes_per_token // 16 * 16) if free > 0 else 0
    if tokens < 16:  # (every size in the GPU's GB, GiB)
        need = (fixed + 16 * model.kv_bytes_per_token) / utilization / GPU_GB
        buffers = (f" and {slots} adapter slots of rank {max_rank} ({slots * per_rank * max_rank / GPU_GB:.1f} GiB)"
                   if slots and max_rank else "")
        raise ValueError(f"{gpu_mem_gb:g} GB of GPU memory (GiB, as GPUs state it) cannot hold {model.name}'s weights "
                         f"({model.weight_bytes / GPU_GB:.1f} GiB){',' if buffers else ' and'} the "
                         f"{runtime_overhead_gb * 1e9 / GPU_GB:.3g} GiB runtime reserve{buffers} at "
                         f"{utilization:.0%} utilization: it needs more than {need:.1f} GiB")
    return tokens


def gpu_memory_gb(gpu: str | None) -> float | None:
    """The memory (GB) a GPU's name states (``H100-64GB`` -> 64.0), or None."""
    m = re.search(r"(\d+(?:\.\d+)?)\s*GB", gpu or "", re.IGNORECASE)
    return float(m.group(1)) if m else None
