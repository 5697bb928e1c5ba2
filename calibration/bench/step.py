"""Mixed prefill + decode engine steps of a Llama-shaped model with random weights (``step_bench.csv``).

The twin prices a whole engine step with its backbone form (``graph_roofline`` in
:mod:`twin.perf.forms`: ``c0 + c_eager*[T > g] + max(c_mem, c_tok*T) + c_seq*D + c_ctx*C``), fitted on
vLLM 0.8.5 windows that reach ~256 running requests and ~100k context tokens. The validation runs the
twin misses most (issue 17) sit at 500-800 running requests with a full KV cache: 2,048-token
mixed steps over 200-300k context tokens. No calibration table holds such a step; this part
measures it, one forward pass at a time, as vLLM v1's ``GPUModelRunner.execute_model`` runs a
chunked-prefill step:

* one batch of ``T = P + D`` new tokens: ``P`` prefill tokens in ``n`` equal chunks (one sequence
  each, with ``prefill_ctx_before`` tokens already in the cache), then ``D`` decodes, each with
  ``decode_ctx_per_seq`` tokens in the cache;
* per layer: RMSNorm, the fused QKV projection, rotary embedding, the new K/V written into the
  cache (vLLM's ``reshape_and_cache``; cache layout ``[tokens, kv_heads, head_dim]`` as in a
  paged block), attention of every new token over its sequence's cache (causal inside a chunk),
  the output projection, RMSNorm, the fused gate/up projection, SiLU-and-multiply, the down
  projection, the residual adds;
* the LM head only on the rows that sample (the last token of each chunk and every decode,
  vLLM's ``logits_indices``), then a greedy argmax.

Attention is ``torch.nn.functional.scaled_dot_product_attention`` with grouped KV heads
(``attention=sdpa``; lower-right causal mask for a chunk with prior context) or, where that is
not available, the same arithmetic as two batched matmuls and a softmax (``attention=matmul``).
The forward pass runs eagerly (vLLM captures CUDA graphs for decode-only batches up to 512
tokens; these steps are mixed or larger, which vLLM also runs eagerly). The KV cache is one
buffer shared by the layers: each layer's attention still reads its whole context from memory
(hundreds of MB to GB per layer, far above the L2 cache), and a GPU with less memory than the
model's full cache can run the sweep.

The rows give the step's device time (CUDA events; ``time.perf_counter`` on the CPU, where the
figures only test the harness). :func:`calibration.bench.step_report.step_report` fits the twin's
backbone form on the calibration-like part of the table and scores it where the calibration has
no data.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from calibration.bench.config import BenchConfig
from calibration.bench.timing import TimeBudget, stats, time_op

RMS_EPS = 1e-5


@dataclass(frozen=True)
class StepShape:
    """One step's composition (see the module docstring); ``prefill_tokens = seqs * chunk``."""

    prefill_seqs: int
    chunk: int
    prefill_ctx_before: int
    decodes: int
    decode_ctx_per_seq: int

    @property
    def prefill_tokens(self) -> int:
        return self.prefill_seqs * self.chunk

    @property
    def batch_tokens(self) -> int:
        return self.prefill_tokens + self.decodes

    @property
    def context_tokens(self) -> int:
        """The twin's ``C``: cache tokens the step's decodes attend to plus each chunk's prior context
        (``Engine._single_step``)."""
        return self.decodes * self.decode_ctx_per_seq + self.prefill_seqs * self.prefill_ctx_before

    @property
    def cache_tokens(self) -> int:
        """Cache slots the step uses: every sequence's prior context and its new tokens."""
        return self.prefill_seqs * (self.prefill_ctx_before + self.chunk) + self.decodes * (self.decode_ctx_per_seq + 1)


def step_shapes(cfg: BenchConfig) -> list[StepShape]:
    """The sweep: every (decodes, decode context, prefill, prior context) combination of the config
    whose tokens fit the step budget. ``prefill`` value 0 in ``cfg.step_prefill`` means none, and
    ``-1`` fills the budget (``budget - decodes``); a prefill is cut into ``ceil(P / chunk)`` equal
    chunks (rounded down to a whole number of tokens each). Decode context values are totals over the
    decodes (``decode_ctx_per_seq = total // decodes``, at least 1)."""
    out: list[StepShape] = []
    seen: set[StepShape] = set()
    for d in cfg.step_decodes:
        contexts = [0] if d == 0 else [c for c in cfg.step_context if c > 0]
        for c_total in contexts:
            per_seq = 0 if d == 0 else max(1, c_total // d)
            for p_req in cfg.step_prefill:
                p = cfg.step_budget - d if p_req < 0 else p_req
                if p < 0 or p + d > cfg.step_budget or p + d == 0:
                    continue
                pctxs = [0] if p == 0 else list(cfg.step_prefill_ctx)
                for pctx in pctxs:
                    if p == 0:
                        shape = StepShape(0, 0, 0, d, per_seq)
                    else:
                        n = math.ceil(p / cfg.step_chunk)
                        shape = StepShape(n, p // n, pctx, d, per_seq)
                    if shape not in seen:
                        seen.add(shape)
                        out.append(shape)
    return out


class RandomLlama:
    """A Llama-shaped decoder (``cfg.spec``: hidden, heads, kv_heads, intermediate, vocab, layers) with
    random weights, for timing only. Weights are fused as vLLM fuses them (QKV, gate/up)."""

    def __init__(self, cfg: BenchConfig, device: torch.device, dtype: torch.dtype, cache_tokens: int) -> None:
        s = cfg.spec
        self.device, self.dtype = device, dtype
        self.hidden, self.heads, self.kv_heads, self.head_dim = s.hidden, s.heads, s.kv_heads, s.head_dim
        self.intermediate, self.vocab, self.n_layers = s.intermediate, s.vocab, s.layers
        gen = torch.Generator(device=device).manual_seed(cfg.seed + 7)

        def rnd(*shape, std):
            return torch.empty(shape, device=device, dtype=dtype).normal_(0.0, std, generator=gen)

        h, hd = self.hidden, self.head_dim
        qkv = (self.heads + 2 * self.kv_heads) * hd
        self.embed = rnd(self.vocab, h, std=1.0)
        self.lm_head = rnd(h, self.vocab, std=h ** -0.5)
        self.norm = torch.ones(h, device=device, dtype=dtype)
        self.layers = []
        for _ in range(self.n_layers):
            self.layers.append({
                "ln1": torch.ones(h, device=device, dtype=dtype),
                "ln2": torch.ones(h, device=device, dtype=dtype),
                "qkv": rnd(h, qkv, std=h ** -0.5),
                "o": rnd(self.heads * hd, h, std=(self.heads * hd) ** -0.5),
                "gate_up": rnd(h, 2 * self.intermediate, std=h ** -0.5),
                "down": rnd(self.intermediate, h, std=self.intermediate ** -0.5),
            })
        # one KV cache for every layer (see the module docstring), filled with random values
        self.k_cache = rnd(max(cache_tokens, 1), self.kv_heads, hd, std=1.0)
        self.v_cache = rnd(max(cache_tokens, 1), self.kv_heads, hd, std=1.0)

    # ------------------------------------------------------------------ inputs of one step
    def inputs(self, shape: StepShape, seed: int = 0) -> dict:
        """Token ids, rotary tables, cache slots and the rows that sample, for ``shape``."""
        dev = self.device
        g = torch.Generator().manual_seed(seed)
        T = shape.batch_tokens
        ids = torch.randint(0, self.vocab, (T,), generator=g).to(dev)
        # positions: chunk tokens after their prior context, decodes at their context length
        pos = []
        for _ in range(shape.prefill_seqs):
            pos.append(torch.arange(shape.prefill_ctx_before, shape.prefill_ctx_before + shape.chunk))
        if shape.decodes:
            pos.append(torch.full((shape.decodes,), shape.decode_ctx_per_seq))
        positions = torch.cat(pos) if pos else torch.zeros(0, dtype=torch.long)
        half = self.head_dim // 2
        inv = 1.0 / (500000.0 ** (torch.arange(half, dtype=torch.float32) / half))
        ang = positions.to(torch.float32)[:, None] * inv[None, :]
        cos, sin = ang.cos().to(dev, self.dtype), ang.sin().to(dev, self.dtype)
        # cache slots: each chunk owns [prior context + chunk] slots, each decode [context + 1]
        slots = []
        start = 0
        for _ in range(shape.prefill_seqs):
            n = shape.prefill_ctx_before + shape.chunk
            slots.append(torch.arange(start + shape.prefill_ctx_before, start + n))
            start += n
        dec_start = start
        if shape.decodes:
            L = shape.decode_ctx_per_seq + 1
            slots.append(dec_start + torch.arange(shape.decodes) * L + shape.decode_ctx_per_seq)
            start += shape.decodes * L
        slot_idx = torch.cat(slots).to(dev) if slots else torch.zeros(0, dtype=torch.long, device=dev)
        sample = [i * shape.chunk + shape.chunk - 1 for i in range(shape.prefill_seqs)]
        sample += list(range(shape.prefill_tokens, T))
        return {"ids": ids, "cos": cos, "sin": sin, "slots": slot_idx, "dec_start": dec_start,
                "sample": torch.tensor(sample, dtype=torch.long, device=dev)}

    # ------------------------------------------------------------------ the forward pass
    @staticmethod
    def _rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + RMS_EPS)).to(x.dtype) * w

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = self.head_dim // 2
        x1, x2 = x[..., :half], x[..., half:]
        c, s = cos[:, None, :], sin[:, None, :]
        return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)

    def _attention(self, q: torch.Tensor, shape: StepShape, inp: dict, impl: str) -> torch.Tensor:
        """Attention of the step's new tokens ``q`` ``[T, heads, head_dim]`` over the cache."""
        H, Hk, hd = self.heads, self.kv_heads, self.head_dim
        out = []
        if shape.prefill_seqs:
            n, L, Lk = shape.prefill_seqs, shape.chunk, shape.prefill_ctx_before + shape.chunk
            qp = q[:shape.prefill_tokens].view(n, L, H, hd).transpose(1, 2)
            kp = self.k_cache[:n * Lk].view(n, Lk, Hk, hd).transpose(1, 2)
            vp = self.v_cache[:n * Lk].view(n, Lk, Hk, hd).transpose(1, 2)
            out.append(_attend(qp, kp, vp, causal_offset=shape.prefill_ctx_before, impl=impl)
                       .transpose(1, 2).reshape(shape.prefill_tokens, H * hd))
        if shape.decodes:
            D, Lk = shape.decodes, shape.decode_ctx_per_seq + 1
            a = inp["dec_start"]
            qd = q[shape.prefill_tokens:].view(D, 1, H, hd).transpose(1, 2)
            kd = self.k_cache[a:a + D * Lk].view(D, Lk, Hk, hd).transpose(1, 2)
            vd = self.v_cache[a:a + D * Lk].view(D, Lk, Hk, hd).transpose(1, 2)
            out.append(_attend(qd, kd, vd, causal_offset=None, impl=impl).reshape(D, H * hd))
        return out[0] if len(out) == 1 else torch.cat(out)

    def forward(self, shape: StepShape, inp: dict, impl: str) -> torch.Tensor:
        """One engine step: the logits of the sampling rows, then a greedy pick (what is timed)."""
        return self.logits(shape, inp, impl).argmax(-1)

    @torch.inference_mode()
    def logits(self, shape: StepShape, inp: dict, impl: str) -> torch.Tensor:
        """The step's forward pass up to the LM head over the rows that sample."""
        H, Hk, hd = self.heads, self.kv_heads, self.head_dim
        T = shape.batch_tokens
        x = self.embed.index_select(0, inp["ids"])
        for ly in self.layers:
            h = self._rms(x, ly["ln1"])
            qkv = h @ ly["qkv"]
            q = qkv[:, :H * hd].view(T, H, hd)
            k = qkv[:, H * hd:(H + Hk) * hd].view(T, Hk, hd)
            v = qkv[:, (H + Hk) * hd:].view(T, Hk, hd)
            q = self._rope(q, inp["cos"], inp["sin"])
            k = self._rope(k, inp["cos"], inp["sin"])
            self.k_cache.index_copy_(0, inp["slots"], k)
            self.v_cache.index_copy_(0, inp["slots"], v)
            x = x + self._attention(q, shape, inp, impl) @ ly["o"]
            h = self._rms(x, ly["ln2"])
            gu = h @ ly["gate_up"]
            x = x + (F.silu(gu[:, :self.intermediate]) * gu[:, self.intermediate:]) @ ly["down"]
        return self._rms(x.index_select(0, inp["sample"]), self.norm) @ self.lm_head


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal_offset: int | None, impl: str) -> torch.Tensor:
    """``q`` ``[B, H, Lq, d]`` over ``k``/``v`` ``[B, Hk, Lk, d]`` (grouped heads). ``causal_offset``:
    None for no mask (a decode), else the prior context of a chunk (lower-right causal)."""
    if impl == "sdpa":
        if q.device.type == "cuda":  # fused kernels only: never the math fallback, which copies K/V per head
            from torch.nn.attention import SDPBackend, sdpa_kernel

            with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION]):
                return _sdpa(q, k, v, causal_offset)
        return _sdpa(q, k, v, causal_offset)
    return _matmul_attention(q, k, v, causal_offset)


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal_offset: int | None) -> torch.Tensor:
    if causal_offset is None:
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    if causal_offset == 0:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    from torch.nn.attention.bias import causal_lower_right

    return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(q.shape[2], k.shape[2]),
                                          enable_gqa=True)


def _matmul_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal_offset: int | None) -> torch.Tensor:
    """The attention arithmetic as two batched matmuls and a softmax (grouped heads kept grouped)."""
    B, H, Lq, d = q.shape
    Hk, Lk = k.shape[1], k.shape[2]
    G = H // Hk
    qg = q.reshape(B, Hk, G * Lq, d)
    scores = (qg @ k.transpose(-1, -2)).float() * (d ** -0.5)  # [B, Hk, G*Lq, Lk]
    if causal_offset is not None:
        qi = torch.arange(Lq, device=q.device).repeat(G)[:, None] + causal_offset
        kj = torch.arange(Lk, device=q.device)[None, :]
        scores = scores.masked_fill(kj > qi, float("-inf"))
    p = torch.softmax(scores, dim=-1).to(q.dtype)
    return (p @ v).reshape(B, H, Lq, d)


def attention_impl(device: torch.device, dtype: torch.dtype, wanted: str = "auto") -> tuple[str, str]:
    """The attention implementation to time and why: ``sdpa`` unless it cannot run grouped heads with a
    lower-right causal mask here (checked on a tiny case against the matmul arithmetic)."""
    if wanted == "matmul":
        return "matmul", "attention as batched matmuls (asked for)"
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 3, 8, generator=gen).to(device, dtype)
    k = torch.randn(2, 2, 5, 8, generator=gen).to(device, dtype)
    v = torch.randn(2, 2, 5, 8, generator=gen).to(device, dtype)
    try:
        for off in (None, 0, 2):
            kk, vv = (k[:, :, :3], v[:, :, :3]) if off == 0 else (k, v)
            a = _attend(q, kk, vv, off, "sdpa").float()
            b = _attend(q, kk, vv, off, "matmul").float()
            tol = 1e-3 if dtype == torch.float32 else 3e-2
            if not torch.allclose(a, b, atol=tol, rtol=tol):
                raise ValueError(f"sdpa and matmul disagree (causal offset {off})")
    except Exception as e:  # an older torch or an unsupported backend: time the matmul arithmetic
        if wanted == "sdpa":
            raise ValueError(f"--step-attention sdpa cannot run here: {type(e).__name__}: {e}") from e
        return "matmul", f"scaled_dot_product_attention unusable ({type(e).__name__}: {e}); batched matmuls"
    return "sdpa", "torch scaled_dot_product_attention, grouped KV heads"


def _time_step(model: "RandomLlama", shape: StepShape, inp: dict, impl: str, device: torch.device,
               cfg: BenchConfig) -> np.ndarray:
    """Milliseconds of ``cfg.step_repeats`` forward passes of ``shape``, eagerly, or (``cfg.step_graphs``) as
    replays of one CUDA graph captured after the warm-ups on a side stream (``torch.cuda.graph``), as vLLM
    replays the steps it captured (``vllm/v1/worker/gpu_model_runner.py``, ``capture_model``): the GPU's
    time without the eager host launch cost, which dominates small steps of a 32-layer model."""
    def step():
        return model.forward(shape, inp, impl)
    if not cfg.step_graphs:
        return time_op(step, device, cfg.step_warmup, cfg.step_repeats, flush=False)
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(max(cfg.step_warmup, 1)):  # kernels chosen and workspaces allocated before capture
            step()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    try:
        return time_op(graph.replay, device, 1, cfg.step_repeats, flush=False)
    finally:
        del graph
        torch.cuda.empty_cache()


def run_steps(cfg: BenchConfig, device: torch.device, dtype: torch.dtype, log=print, rows: list | None = None,
              info: dict | None = None) -> tuple[list[dict], str]:
    """Time every shape of :func:`step_shapes`, in a seeded random order; returns (rows, note). Stops early,
    with a note, before a shape that would end past ``cfg.step_time_limit_s`` (:class:`TimeBudget`; the rows so
    far are kept, the first shape is always timed). ``rows``: the list the rows are appended to as each shape is
    timed (the harness passes one that writes them to the table at once); ``info`` receives
    ``cut_by_time_limit``, ``units`` and ``units_done``."""
    shapes = step_shapes(cfg)
    if not shapes:
        return [], "step: no shape fits the step budget"
    # a seeded random order: a sweep the time limit stops is an even sample of the grid, both sides of the
    # calibration's reach included (the report fits on one side and scores the other)
    random.Random(cfg.seed).shuffle(shapes)
    impl, why = attention_impl(device, dtype, cfg.step_attention)
    cache = max(s.cache_tokens for s in shapes)
    try:
        model = RandomLlama(cfg, device, dtype, cache)
    except (torch.cuda.OutOfMemoryError, MemoryError) as e:
        need = cfg.spec.weight_bytes + 2 * cache * cfg.spec.kv_heads * cfg.spec.head_dim * cfg.spec.dtype_bytes
        return [], (f"step: skipped, the model with its KV cache of {cache} tokens (~{need / 2**30:.1f} GiB) does not "
                    f"fit in {device.type} memory ({type(e).__name__}); lower --layers or --step-context")
    timer = "cuda_events" if device.type == "cuda" else "perf_counter"
    rows = [] if rows is None else rows
    oom: list[str] = []
    switched = None
    budget = TimeBudget(cfg.step_time_limit_s)
    for i, shape in enumerate(shapes):
        if not budget.next_fits():
            break
        inp = model.inputs(shape, cfg.seed + i)
        try:
            try:
                ms = _time_step(model, shape, inp, impl, device, cfg)
            except RuntimeError as e:  # no fused SDPA kernel for this shape: the matmul arithmetic from here on
                if impl != "sdpa" or isinstance(e, torch.cuda.OutOfMemoryError) or cfg.step_attention == "sdpa":
                    raise
                impl, switched = "matmul", f"SDPA failed at shape {i + 1} ({str(e).splitlines()[0][:120]})"
                ms = _time_step(model, shape, inp, impl, device, cfg)
        except torch.cuda.OutOfMemoryError:  # activations of a large step: keep the others
            oom.append(f"T={shape.batch_tokens} D={shape.decodes} C={shape.context_tokens}")
            torch.cuda.empty_cache()
            continue
        st = stats(ms)
        rows.append({"batch_tokens": shape.batch_tokens, "prefill_tokens": shape.prefill_tokens,
                     "prefill_seqs": shape.prefill_seqs, "prefill_ctx_before": shape.prefill_ctx_before,
                     "decodes": shape.decodes, "decode_ctx_per_seq": shape.decode_ctx_per_seq,
                     "context_tokens": shape.context_tokens, "time_ms_mean": st["mean"], "time_ms_std": st["std"],
                     "repeats": len(ms), "device": device.type, "model": cfg.spec.name, "layers": model.n_layers,
                     "dtype": str(dtype).replace("torch.", ""), "attention": impl, "time_ms_median": st["median"],
                     "time_ms_min": st["min"], "time_ms_max": st["max"],
                     "lm_head_rows": shape.prefill_seqs + shape.decodes,
                     "timer": timer + ("+cuda_graph" if cfg.step_graphs else "")})
        if (i + 1) % 10 == 0 or i + 1 == len(shapes):
            log(f"  step {i + 1}/{len(shapes)}: T={shape.batch_tokens} D={shape.decodes} C={shape.context_tokens} "
                f"-> {st['median']:.2f} ms")
    note = (f"step: {len(rows)} shapes of {model.n_layers} layers, attention {impl} ({why}), KV cache of "
            f"{cache} tokens shared by the layers, {timer}"
            + (", each shape captured once in a CUDA graph and replayed" if cfg.step_graphs else ", eager"))
    if switched:
        note += f"; {switched}: later shapes use batched matmuls (column attention)"
    if oom:
        note += f"; {len(oom)} shapes ran out of device memory and were skipped (first: {oom[0]})"
    if budget.stopped:
        note += (f"; stopped after {budget.stopped_at} of {len(shapes)} shapes: the next would have ended past the "
                 f"step time limit of {cfg.step_time_limit_s:g} s (--step-time-limit)")
    if info is not None:
        info.update(cut_by_time_limit=budget.stopped, units=len(shapes), units_done=budget.stopped_at or len(shapes))
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return rows, note
