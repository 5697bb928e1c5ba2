"""Engine configuration: the vLLM 0.8.5 knobs the twin models."""

from __future__ import annotations

import math
from dataclasses import dataclass, asdict, field, fields
from typing import Any

import numpy as np

from traces.arguments import is_real_number, is_whole_number


#: longest simulated time a run may cover (s, about 3 years): far beyond any trace (the longest
#: built-in one spans two weeks), and float64 seconds still resolve 15 ns there. A longer
#: ``--horizon``, and arrivals beyond it (absolute, epoch timestamps), are refused: the summary's
#: rates are per simulated second from 0, so they would read ~0 (and at ~1e15 s the clock's
#: resolution, 0.125 s, breaks the latencies).
MAX_SIM_SECONDS = 1e8


class ConfigError(ValueError):
    """An engine configuration that vLLM would refuse (or that makes no sense)."""


#: vLLM 0.8.5's V1 engine picks larger defaults for ``--max-num-seqs`` and ``--max-num-batched-tokens``
#: on a GPU with at least this much memory (``EngineArgs._set_default_args_v1``,
#: ``vllm/engine/arg_utils.py``: ``device_memory >= 70 * GiB_bytes``, "GPUs like H100 and MI300x")
VLLM_LARGE_GPU_BYTES = 70 * 2**30
#: ``(max_num_seqs, max_num_batched_tokens)`` of vLLM 0.8.5's OpenAI API server (the usage context of a
#: served trace) when neither is given: on a GPU of at least :data:`VLLM_LARGE_GPU_BYTES`, and below it (also
#: vLLM's choice when it cannot read the device's memory). Offline ``LLM`` takes 16,384 / 8,192 tokens.
VLLM_SERVER_LIMITS_LARGE_GPU = (1024, 8192)
VLLM_SERVER_LIMITS = (256, 2048)


def vllm_default_limits(device_memory_bytes: float | None) -> tuple[int, int]:
    """``(max_num_seqs, max_num_batched_tokens)`` vLLM 0.8.5's API server uses on one GPU of
    ``device_memory_bytes`` (None: unknown, vLLM's own fallback, the smaller pair) when they are not given
    (``EngineArgs._set_default_args_v1``): 1,024 / 8,192 from 70 GiB up, else 256 / 2,048."""
    if device_memory_bytes is not None and device_memory_bytes >= VLLM_LARGE_GPU_BYTES:
        return VLLM_SERVER_LIMITS_LARGE_GPU
    return VLLM_SERVER_LIMITS


#: the :class:`EngineConfig` fields only the S-LoRA engine (``--system slora``, twin/slora_engine.py) reads
SLORA_ONLY_FIELDS = ("max_total_tokens", "slora_batch_max_tokens", "running_max_req_size", "slora_max_wait_tokens",
                     "slora_poll_s", "slora_prefetch", "slora_max_prompt_len", "slora_max_total_len")


def _help(text: str) -> dict[str, str]:
    return {"help": text}


def check_field_types(cfg: Any) -> None:
    """Each field of the dataclass ``cfg`` holds a value of its annotated type: an integer (numpy's
    too; a float only when whole) for ``int``, a real number for ``float``, ``True``/``False`` for
    ``bool``, a string for ``str``; ``None`` only where the annotation allows it. Else a
    :class:`ConfigError` naming the field (a fraction of a count would be truncated or break an array)."""
    hints = _HINTS.get(type(cfg))
    if hints is None:
        hints = _HINTS[type(cfg)] = {f.name: str(f.type) for f in fields(cfg)}
    for name, hint in hints.items():
        v = getattr(cfg, name)
        optional = "None" in hint
        if v is None:
            if optional:
                continue
            raise ConfigError(f"{name} needs a value ({hint}), got None")
        base = hint.replace("| None", "").strip()
        if base == "bool":
            ok = isinstance(v, (bool, np.bool_))
        elif base == "int":
            ok = is_whole_number(v)
        elif base == "float":
            ok = is_real_number(v)
        elif base == "str":
            ok = isinstance(v, str)
        else:
            continue
        if not ok:
            what = "a whole number" if base == "int" else {"bool": "true or false", "float": "a number",
                                                            "str": "a string"}[base]
            raise ConfigError(f"{name} must be {what}, got {v!r} ({type(v).__name__})")
        cast = {"int": int, "float": float, "bool": bool}.get(base)
        if cast is not None and type(v) is not cast:  # numpy scalars, whole floats: Python's own (an np.int16 block
            object.__setattr__(cfg, name, cast(v))    # size overflowed in the engine's block arithmetic)


_HINTS: dict[type, dict[str, str]] = {}


@dataclass
class EngineConfig:
    """vLLM-like server settings (names follow vLLM's CLI flags).

    ``max_loras`` is the number of GPU adapter slots (distinct adapters in one batch);
    ``max_cpu_loras`` the CPU adapter tier (disk behind it); ``max_lora_rank`` pads every
    slot's buffers. ``kv_capacity_tokens`` overrides the profile's KV model when set.
    Every field carries its help text (``twin run`` derives its server flags from them,
    :mod:`twin.scenario`).
    """

    max_num_batched_tokens: int = field(default=VLLM_SERVER_LIMITS[1], metadata=_help(
        "token budget of one engine step (vLLM --max-num-batched-tokens; 2048: vLLM 0.8.5's API-server default "
        "below 70 GiB of GPU memory, vllm_default_limits)"))
    max_num_seqs: int = field(default=VLLM_SERVER_LIMITS[0], metadata=_help(
        "most requests running at once (vLLM --max-num-seqs; 256: vLLM 0.8.5's default below 70 GiB of GPU "
        "memory, vllm_default_limits)"))
    block_size: int = field(default=16, metadata=_help("tokens per KV-cache block (vLLM --block-size)"))
    enable_lora: bool = field(default=True, metadata=_help("serve LoRA adapters (vLLM --enable-lora)"))
    max_loras: int = field(default=8, metadata=_help(
        "GPU adapter slots: distinct adapters in one batch (vLLM --max-loras)"))
    max_cpu_loras: int | None = field(default=None, metadata=_help(
        "CPU adapter slots, the tier between GPU and disk (vLLM --max-cpu-loras; default: as many as served "
        "adapters)"))
    max_lora_rank: int | None = field(default=None, metadata=_help(
        "rank every slot's buffers are padded to (vLLM --max-lora-rank; default: the largest rank in the workload)"))
    max_model_len: int | None = field(default=None, metadata=_help(
        "longest prompt + output accepted (vLLM --max-model-len; default: the model's)"))
    kv_capacity_tokens: int | None = field(default=None, metadata=_help(
        "KV-cache capacity in tokens (default: from the profile's GPU memory model)"))
    tensor_parallel: int = field(default=1, metadata=_help(
        "tensor-parallel degree: each GPU holds 1/tp of every adapter (vLLM --tensor-parallel-size)"))
    served_adapters: int | None = field(default=None, metadata=_help(
        "adapters the server knows: requests for an adapter id >= this are rejected (default: all)"))
    adapter_memory: str = field(default="slots", metadata=_help(
        "adapter memory (twin/adapter_placement.py; a cache policy's adapter_memory overrides it): 'slots' "
        "(vLLM), 'region' (a fixed region laid out by adapter_placement), 'unified' (S-LoRA's unified pool)"))
    adapter_placement: str = field(default="contiguous", metadata=_help(
        "layout of the adapter region: 'contiguous' or 'paged'"))
    adapter_region_bytes: int | None = field(default=None, metadata=_help(
        "size of the adapter region in bytes (default: the memory of max_loras slots)"))
    prefix_caching: bool = field(default=False, metadata=_help(
        "keep the history KV of conversations for their next turn (twin/prefix_kv.py)"))
    lora_targets: str | None = field(default=None, metadata=_help(
        "projections the adapters adapt: qkvo, all, or a comma list of module names; sets the adapter bytes, and "
        "the LoRA compute on --system slora (vLLM's kernels run on every linear layer whatever the adapters "
        "adapt) (default: the profile's on --system vllm, qkvo on --system slora)"))
    # S-LoRA engine (--system slora, twin/slora_engine.py); S-LoRA's defaults
    max_total_tokens: int | None = field(default=None, metadata=_help(
        "S-LoRA's pool in token slots, N_tok (--max_total_token_num; default: the GPU memory left after the "
        "weights)"))
    slora_batch_max_tokens: int | None = field(default=None, metadata=_help(
        "S-LoRA: prompt tokens of one prefill mini-batch (default max(N_tok/6, the max request length "
        "--slora-max-total-len, 3072 by default), as S-LoRA's api_server.py)"))
    running_max_req_size: int = field(default=1000, metadata=_help("S-LoRA: most running requests"))
    slora_max_wait_tokens: int = field(default=10, metadata=_help(
        "S-LoRA: decodes since the last prefill before waiting requests are considered (max_wait_tokens, "
        "hard-coded 10 in S-LoRA; 1: after every decode)"))
    slora_poll_s: float = field(default=0.01, metadata=_help("S-LoRA: idle router poll interval (s)"))
    slora_prefetch: bool = field(default=False, metadata=_help(
        "S-LoRA --prefetch (off in S-LoRA's paper runs): the scheduler's prefetch() at decode counters 5 and 7"))
    slora_max_prompt_len: int = field(default=2048, metadata=_help(
        "S-LoRA's HTTP server refuses longer prompts"))
    slora_max_total_len: int = field(default=3072, metadata=_help(
        "S-LoRA's HTTP server refuses prompt + output above this"))

    def validate(self) -> None:
        """Refuse what vLLM (or S-LoRA) would refuse, naming the field: a value of the wrong type (a
        fraction of a count, a string, ``None`` where a number is needed) first, then the bounds."""
        check_field_types(self)
        if self.max_num_batched_tokens < 1:
            raise ConfigError("max_num_batched_tokens must be >= 1")
        if self.max_num_seqs < 1:
            raise ConfigError("max_num_seqs must be >= 1")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ConfigError(f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= max_num_seqs "
                              f"({self.max_num_seqs}), as vLLM requires; raise the token budget or lower max_num_seqs")
        if self.block_size < 1:
            raise ConfigError("block_size must be >= 1")
        if self.enable_lora and self.max_loras < 1:
            raise ConfigError("max_loras (adapter slots) must be >= 1 when LoRA is enabled")
        if self.max_cpu_loras is not None and self.enable_lora and self.max_cpu_loras < self.max_loras:
            raise ConfigError(f"max_cpu_loras ({self.max_cpu_loras}) must be >= max_loras ({self.max_loras}), "
                              "as vLLM requires")
        if self.tensor_parallel < 1:
            raise ConfigError("tensor_parallel must be >= 1")
        if self.kv_capacity_tokens is not None and self.kv_capacity_tokens < 1:
            raise ConfigError(f"kv_capacity_tokens must be >= 1 (or None: from the profile), got "
                              f"{self.kv_capacity_tokens}")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ConfigError(f"max_model_len must be >= 1 (or None: the model's), got {self.max_model_len}")
        if self.max_lora_rank is not None and self.max_lora_rank < 1:
            raise ConfigError(f"max_lora_rank must be >= 1 (or None: the largest rank served), got "
                              f"{self.max_lora_rank}")
        if self.served_adapters is not None and self.served_adapters < 0:
            raise ConfigError(f"served_adapters must be >= 0, got {self.served_adapters}")
        if self.adapter_memory not in ("slots", "region", "unified"):
            raise ConfigError(f"adapter_memory must be 'slots', 'region' or 'unified', got {self.adapter_memory!r}")
        if self.adapter_placement not in ("contiguous", "paged"):
            raise ConfigError(f"adapter_placement must be 'contiguous' or 'paged', got {self.adapter_placement!r}")
        for name in ("max_total_tokens", "slora_batch_max_tokens", "adapter_region_bytes"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise ConfigError(f"{name} must be >= 1 (or None: its default), got {v}")
        for name in ("running_max_req_size", "slora_max_wait_tokens", "slora_max_prompt_len", "slora_max_total_len"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not (self.slora_poll_s > 0 and math.isfinite(self.slora_poll_s)):
            raise ConfigError(f"slora_poll_s must be > 0 seconds and finite, got {self.slora_poll_s}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
