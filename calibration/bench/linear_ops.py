"""Base-model operators of one transformer layer at the model's dimensions (Vidur's MLP profile).

Vidur (``vidur/profiling/mlp``) times the non-attention operators of one layer for a number of
tokens and a tensor-parallel degree; ``linear_ops.csv`` has exactly its columns
(:data:`calibration.bench.schema.LINEAR_OPS_COLUMNS`), times in ms, so the backbone fit reads
Vidur's published files and ours alike. The operators, as plain torch on the bench's device:

===========================  ===================================================================
``emb``                      embedding lookup, ``vocab/tp x hidden`` table
``input_layernorm``          RMSNorm over ``hidden``
``attn_pre_proj``            fused QKV projection ``hidden -> (heads + 2 kv_heads) * head_dim / tp``
``attn_rope``                rotary embedding (neox layout) of q and k at the token positions
``attn_post_proj``           output projection ``heads * head_dim / tp -> hidden``
``post_attention_layernorm`` RMSNorm
``mlp_up_proj``              fused gate+up projection ``hidden -> 2 * intermediate / tp``
``mlp_act``                  SiLU(gate) * up
``mlp_down_proj``            ``intermediate / tp -> hidden``
``add``                      residual add
===========================  ===================================================================

These are eager torch ops (vLLM fuses the norms, rope and activation into custom kernels), so
the small operators are upper bounds; the projections are the same GEMMs. Per Vidur, KV heads
are replicated when ``tp`` exceeds their number.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from calibration.bench.config import BenchConfig
from calibration.bench.schema import LINEAR_OPS, STATS
from calibration.bench.timing import stats, time_op


def _rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    var = x.float().pow(2).mean(-1, keepdim=True)
    return (x.float() * torch.rsqrt(var + eps)).to(x.dtype) * w


def _rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """Neox-style rotary embedding; ``q``: (T, h, d), ``k``: (T, kv, d), ``cos/sin``: (T, d/2)."""
    c, s = cos[:, None, :], sin[:, None, :]

    def rot(t):
        t1, t2 = t.chunk(2, dim=-1)
        return torch.cat((t1 * c - t2 * s, t2 * c + t1 * s), dim=-1)

    return rot(q), rot(k)


def _rnd(shape, device, dtype, gen, std=1.0) -> torch.Tensor:
    """Random normal values generated on ``device`` (fast for the GPU-sized weights)."""
    return torch.empty(shape, device=device, dtype=dtype).normal_(0.0, std, generator=gen)


def build_weights(cfg: BenchConfig, tp: int, device: torch.device, dtype: torch.dtype,
                  gen: torch.Generator) -> dict:
    """The layer's weights for one tensor-parallel degree (built once, reused for every num_tokens)."""
    spec = cfg.spec
    h, hd = spec.hidden, spec.head_dim
    w = dict(tp=tp, q_heads=spec.heads // tp, kv_heads=max(1, spec.kv_heads // tp), hd=hd,
             inter=spec.intermediate // tp, vocab=max(1, spec.vocab // tp))
    w["emb"] = _rnd((w["vocab"], h), device, dtype, gen, 0.02)
    w["norm"] = torch.ones(h, device=device, dtype=dtype)
    w["qkv"] = _rnd(((w["q_heads"] + 2 * w["kv_heads"]) * hd, h), device, dtype, gen, 0.02)
    w["o"] = _rnd((h, w["q_heads"] * hd), device, dtype, gen, 0.02)
    w["up"] = _rnd((2 * w["inter"], h), device, dtype, gen, 0.02)
    w["down"] = _rnd((h, w["inter"]), device, dtype, gen, 0.02)
    max_pos = min(spec.max_model_len, 8192)
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    freqs = torch.outer(torch.arange(max_pos, dtype=torch.float32), inv_freq)
    w["cos"] = freqs.cos().to(device=device, dtype=dtype)
    w["sin"] = freqs.sin().to(device=device, dtype=dtype)
    w["max_pos"] = max_pos
    return w


def build_ops(w: dict, num_tokens: int, device: torch.device, dtype: torch.dtype,
              gen: torch.Generator) -> dict[str, Callable[[], object]]:
    """The ten operators as closures over the weights and preallocated inputs of ``num_tokens``."""
    T, h = num_tokens, w["emb"].shape[1]
    q_heads, kv_heads, hd, inter = w["q_heads"], w["kv_heads"], w["hd"], w["inter"]
    ids = torch.randint(0, w["vocab"], (T,), device=device, generator=gen)
    pos = torch.randint(0, w["max_pos"], (T,), device=device, generator=gen)
    x = _rnd((T, h), device, dtype, gen)
    res = _rnd((T, h), device, dtype, gen)
    q = _rnd((T, q_heads, hd), device, dtype, gen)
    k = _rnd((T, kv_heads, hd), device, dtype, gen)
    attn_out = _rnd((T, q_heads * hd), device, dtype, gen)
    up_out = _rnd((T, 2 * inter), device, dtype, gen)
    act_out = _rnd((T, inter), device, dtype, gen)
    emb_w, norm_w, cos, sin = w["emb"], w["norm"], w["cos"], w["sin"]
    w_qkv, w_o, w_up, w_down = w["qkv"], w["o"], w["up"], w["down"]

    return {
        "emb": lambda: F.embedding(ids, emb_w),
        "input_layernorm": lambda: _rmsnorm(x, norm_w),
        "attn_pre_proj": lambda: F.linear(x, w_qkv),
        "attn_rope": lambda: _rope(q, k, cos[pos], sin[pos]),
        "attn_post_proj": lambda: F.linear(attn_out, w_o),
        "post_attention_layernorm": lambda: _rmsnorm(x, norm_w),
        "mlp_up_proj": lambda: F.linear(x, w_up),
        "mlp_act": lambda: F.silu(up_out[:, :inter]) * up_out[:, inter:],
        "mlp_down_proj": lambda: F.linear(act_out, w_down),
        "add": lambda: x + res,
    }


def run_linear_ops(cfg: BenchConfig, device: torch.device, dtype: torch.dtype, log=print,
                   rows: list | None = None) -> list[dict]:
    """One row per (num_tokens, tp) in Vidur's column layout, appended to ``rows`` (the harness passes a list
    that writes each row to the table at once) as it is measured."""
    spec = cfg.spec
    gen = torch.Generator(device=device).manual_seed(cfg.seed)
    rows = [] if rows is None else rows
    for tp in cfg.tp:
        weights = build_weights(cfg, tp, device, dtype, gen)
        for T in cfg.tokens:
            ops = build_ops(weights, T, device, dtype, gen)
            row: dict = {}
            for name in LINEAR_OPS:
                st = stats(time_op(ops[name], device, cfg.warmup, cfg.repeats))
                for s in STATS:
                    row[f"time_stats.{name}.{s}"] = st[s]
            row.update({
                "n_head": spec.heads,
                "n_kv_head": spec.kv_heads,
                "n_embd": spec.hidden,
                "n_expanded_embd": spec.intermediate,
                "vocab_size": spec.vocab,
                "use_gated_mlp": True,
                "num_tokens": T,
                "num_tensor_parallel_workers": tp,
                "model": spec.name,
                "device": device.type,
                "dtype": str(dtype).replace("torch.", ""),
                "repeats": cfg.repeats,
            })
            rows.append(row)
            del ops
            log(f"  linear_ops tp={tp} tokens={T}: up_proj {row['time_stats.mlp_up_proj.mean']:.3f} ms")
        del weights
    return rows
