"""Engine configuration: the vLLM 0.8.5 knobs the twin models."""

from __future__ import annotations

from dataclasses import dataclass, asdict, field
from typing import Any


class ConfigError(ValueError):
    """An engine configuration that vLLM would refuse (or that makes no sense)."""


@dataclass
class EngineConfig:
    """vLLM-like server settings (names follow vLLM's CLI flags).

    ``max_loras`` is the number of GPU adapter slots (distinct adapters in one batch);
    ``max_cpu_loras`` the CPU adapter tier (disk behind it); ``max_lora_rank`` pads every
    slot's buffers. ``kv_capacity_tokens`` overrides the profile's KV model when set.
    """

    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 256
    block_size: int = 16
    enable_lora: bool = True
    max_loras: int = 8
    max_cpu_loras: int | None = None  # None: as many as served adapters
    max_lora_rank: int | None = None  # None: the largest rank in the workload
    max_model_len: int | None = None  # None: the model's default
    kv_capacity_tokens: int | None = None
    tensor_parallel: int = 1
    served_adapters: int | None = None  # adapters with id >= this are unknown (rejected)
    # adapter memory (twin/adapter_placement.py; a cache policy's ``adapter_memory`` overrides it):
    # 'slots' (vLLM), 'region' (a fixed region, ``adapter_placement`` contiguous|paged), 'unified' (S-LoRA pool)
    adapter_memory: str = "slots"
    adapter_placement: str = "contiguous"
    adapter_region_bytes: int | None = None  # region size (None: the memory of max_loras slots)
    prefix_caching: bool = False  # keep history KV of conversations for the next turn (twin/prefix_kv.py)

    def validate(self) -> None:
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
        if self.adapter_memory not in ("slots", "region", "unified"):
            raise ConfigError(f"adapter_memory must be 'slots', 'region' or 'unified', got {self.adapter_memory!r}")
        if self.adapter_placement not in ("contiguous", "paged"):
            raise ConfigError(f"adapter_placement must be 'contiguous' or 'paged', got {self.adapter_placement!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
