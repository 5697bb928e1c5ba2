"""Model dimensions and the LoRA adapter size that follows from them.

A LoRA adapter of rank ``r`` on a linear layer ``W`` of shape ``(d_in, d_out)`` adds
``A`` (``d_in x r``) and ``B`` (``r x d_out``): ``r * (d_in + d_out)`` parameters
(Hu et al., *LoRA*, ICLR 2022). The adapter size is the sum over the target modules
of every layer, times the bytes per parameter.

Worked examples (fp16, 2 bytes):

* Llama-7B, rank 32, q,k,v,o: ``32 layers * 4 * 32*(4096+4096) * 2 B = 64 MiB``.
* Llama-70B, rank 16, q,k,v,o: 160 MiB when k and v are taken as ``h x h`` (the
  multi-head convention of the seed figures, ``assume_mha=True``); the real model uses
  grouped-query attention (8 KV heads), which gives 125 MiB.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Iterable

#: Modules a LoRA adapter can target, by their Hugging Face names.
ALL_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
QKVO = ("q_proj", "k_proj", "v_proj", "o_proj")


@dataclass(frozen=True)
class ModelSpec:
    """Dimensions of a decoder-only transformer (Llama-style, gated MLP)."""

    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    max_model_len: int
    dtype_bytes: int = 2
    params_b: float = 0.0  # total parameters, billions (for the weight memory)

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def module_shape(self, module: str, assume_mha: bool = False) -> tuple[int, int]:
        """(d_in, d_out) of one target module."""
        kv_dim = self.hidden if assume_mha else self.kv_heads * self.head_dim
        shapes = {
            "q_proj": (self.hidden, self.hidden),
            "k_proj": (self.hidden, kv_dim),
            "v_proj": (self.hidden, kv_dim),
            "o_proj": (self.hidden, self.hidden),
            "gate_proj": (self.hidden, self.intermediate),
            "up_proj": (self.hidden, self.intermediate),
            "down_proj": (self.intermediate, self.hidden),
        }
        if module not in shapes:
            raise ValueError(f"unknown LoRA target module {module!r}; choose from {', '.join(ALL_TARGETS)}")
        return shapes[module]

    def adapter_params(self, rank: int, targets: Iterable[str] = ALL_TARGETS, assume_mha: bool = False) -> int:
        if rank <= 0:
            raise ValueError(f"LoRA rank must be positive, got {rank}")
        per_layer = sum(rank * sum(self.module_shape(m, assume_mha)) for m in targets)
        return per_layer * self.layers

    def adapter_bytes(self, rank: int, targets: Iterable[str] = ALL_TARGETS, assume_mha: bool = False,
                      dtype_bytes: int | None = None) -> int:
        """Bytes of one adapter of ``rank`` on ``targets`` (see the module docstring)."""
        return self.adapter_params(rank, targets, assume_mha) * (dtype_bytes or self.dtype_bytes)

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V for every layer: ``2 * layers * kv_heads * head_dim * dtype_bytes``."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    @property
    def weight_bytes(self) -> int:
        return int(self.params_b * 1e9 * self.dtype_bytes)

    def to_dict(self) -> dict:
        return asdict(self)


MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in [
        ModelSpec("llama-2-7b", 4096, 32, 32, 32, 11008, 32000, 4096, params_b=6.74),
        # Llama-2-13B (Touvron et al. 2023b, Table 1 and the released config.json); LLaMA-1 13B has the same
        # shape with a 2048-token context
        ModelSpec("llama-2-13b", 5120, 40, 40, 40, 13824, 32000, 4096, params_b=13.0),
        # LLaMA-1 30B ("33B", Touvron et al. 2023a, Table 2: dim 6656, 52 heads, 60 layers; released
        # config.json: intermediate 17920, vocab 32000, 2048 positions; 32.5 B parameters)
        ModelSpec("llama-30b", 6656, 60, 52, 52, 17920, 32000, 2048, params_b=32.5),
        ModelSpec("llama-2-70b", 8192, 80, 64, 8, 28672, 32000, 4096, params_b=69.0),
        ModelSpec("llama-3.1-8b", 4096, 32, 32, 8, 14336, 128256, 131072, params_b=8.03),
        ModelSpec("llama-3.1-70b", 8192, 80, 64, 8, 28672, 128256, 131072, params_b=70.6),
        ModelSpec("qwen-2.5-7b", 3584, 28, 28, 4, 18944, 152064, 32768, params_b=7.62),
    ]
}
ALIASES = {
    "llama-7b": "llama-2-7b",
    "llama-13b": "llama-2-13b",
    "llama-33b": "llama-30b",
    "llama-1-30b": "llama-30b",
    "llama-70b": "llama-2-70b",
    "llama-3.1-8b-instruct": "llama-3.1-8b",
    "qwen-2.5-7b-instruct": "qwen-2.5-7b",
    "llama-2-7b-hf": "llama-2-7b",
    "meta-llama-3-8b": "llama-3.1-8b",
}


def get_model(name: str) -> ModelSpec:
    """Look a model up by name (case-insensitive, with common aliases)."""
    key = name.lower()
    key = ALIASES.get(key, key)
    if key not in MODELS:
        raise KeyError(f"unknown model {name!r}; known models: {', '.join(sorted(MODELS))} "
                       f"(aliases: {', '.join(sorted(ALIASES))})")
    return MODELS[key]
