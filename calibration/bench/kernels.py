"""Multi-LoRA kernels in Triton (Punica / S-LoRA style), each with a plain torch reference.

A batch of tokens ``x`` (``T x d_in``) is served by several adapters at once. Adapter ``i``
adds ``scale * x @ A_i @ B_i`` to the base layer's output. Two kernel families compute that:

* **SGMV** (segmented gather matrix-vector, Punica; used for prefill): the tokens are grouped
  into contiguous *segments*, one adapter per segment (``seg_starts``, ``seg_lens``,
  ``seg_adapter_idx``). One program instance computes a ``BLOCK_M x BLOCK_N`` tile of one
  segment with ``tl.dot``.
* **BGMV** (batched gather matrix-vector, Punica; used for decode): every token names its
  adapter (``token_adapter_idx``). One program instance computes a ``BLOCK_N`` slice of one
  token's output row as a reduction (``tl.sum``), no tensor cores (one row is too thin).

Each family has a **shrink** (``x @ A``: ``d_in -> rank``) and an **expand** (``y @ B``:
``rank -> d_out``, accumulated into the output like Punica's ``y += x @ B``).

Layouts (row-major, any strides accepted):

* ``lora_a_stack``: ``(S, d_in, R_max)`` -- adapter slot ``s`` holds ``A_s`` in its first
  ``ranks[s]`` columns;
* ``lora_b_stack``: ``(S, R_max, d_out)`` -- ``B_s`` in the first ``ranks[s]`` rows;
* shrink output ``y``: ``(T, R_max)``, zero beyond each token's rank.

**Mixed ranks.** The weights are stored *padded* to ``R_max`` in fixed slots (like vLLM's
``lora_a_stacked`` / ``lora_b_stacked``), but the kernels take S-LoRA MBGMV's per-adapter
*rank array* and do the work of each adapter's own rank only: a shrink program whose rank tile
starts past the adapter's rank returns at once, and the expand's reduction loop runs over
``ceil(rank / BLOCK_K)`` blocks only. (vLLM's own kernels compute the padded ``R_max``; S-LoRA
keeps unpadded weights in a unified memory pool. We keep the padded slots so that the slot
buffers match vLLM's memory accounting, and S-LoRA's compute.)

Index ``-1`` (a segment or a token without an adapter) contributes nothing. A segment of length
0 launches programs that return at once. The same adapter may appear in several segments.

**Slot-grid kernels** (``slot_shrink`` / ``slot_expand``) follow vLLM 0.8.5's v1 LoRA kernels
(``vllm/lora/ops/triton_ops/lora_shrink.py`` and ``lora_expand.py``) instead: the tokens are
sorted by adapter slot (:func:`slot_meta`, vLLM's ``LoRAKernelMeta``) and the grid launches one
set of thread blocks for *every* slot of the ``S`` slots plus the no-adapter group, each spanning
the whole batch's row tiles; a block whose slot holds no token, or whose row tile lies beyond its
slot's tokens, exits at once. They compute the padded rank (vLLM's weights are padded to
``max_lora_rank``), with vLLM 0.8.5's block sizes: shrink ``BLOCK_M 32, BLOCK_N 16`` and
``BLOCK_K 256, SPLIT_K 64`` below 128 tokens (``32, 8`` from 128), accumulating split-K partial
sums atomically into a float32 buffer; expand ``BLOCK_M 64, BLOCK_N 128, BLOCK_K 16``. This is the
launch pattern the twin's ``kernel_grid`` LoRA form counts (:class:`twin.perf.forms.KernelGridLora`);
:func:`slot_grid_blocks` gives a call's launched and working blocks, so a GPU bench over 8-512 slots
measures what a launched block that exits and one that works each cost.

Under ``TRITON_INTERPRET=1`` (set before this module is imported) the kernels run on CPU
tensors through Triton's interpreter; that is how they are tested without a GPU. Block sizes
are fixed heuristics (no autotuning).
"""

from __future__ import annotations

import os
from typing import Sequence

import torch

from calibration.bench.config import env_flag_set

try:  # triton is part of the optional calibration extra, like torch
    import triton
    import triton.language as tl

    HAS_TRITON = True
    TRITON_IMPORT_ERROR: str | None = None
except Exception as _e:  # pragma: no cover - depends on the environment
    triton = None
    tl = None
    HAS_TRITON = False
    TRITON_IMPORT_ERROR = f"{type(_e).__name__}: {_e}"

#: Whether the kernels were defined for Triton's interpreter (TRITON_INTERPRET=1 at import).
INTERPRETED = env_flag_set(os.environ.get("TRITON_INTERPRET"))

IntSeq = Sequence[int] | torch.Tensor


def triton_version() -> str | None:
    return getattr(triton, "__version__", None) if HAS_TRITON else None


def triton_usable(device: torch.device | str) -> tuple[bool, str]:
    """Whether the Triton kernels can run on ``device`` here, and why not."""
    if not HAS_TRITON:
        return False, f"triton is not importable ({TRITON_IMPORT_ERROR})"
    dev = torch.device(device)
    if dev.type == "cuda":
        if INTERPRETED:  # Triton fixed interpretation at the kernels' definition: they would not be compiled
            return False, ("TRITON_INTERPRET was set when calibration.bench.kernels was imported: the kernels run "
                           "in Triton's interpreter, not compiled; unset it and restart")
        return True, "compiled"
    if INTERPRETED:
        return True, "TRITON_INTERPRET=1"
    return False, "Triton needs a GPU, or TRITON_INTERPRET=1 set before calibration.bench.kernels is imported"


# --------------------------------------------------------------------------------------------
# Triton kernels
# --------------------------------------------------------------------------------------------
if HAS_TRITON:

    @triton.jit
    def _sgmv_shrink_kernel(
        x_ptr, a_ptr, out_ptr,
        seg_start_ptr, seg_len_ptr, seg_adapter_ptr, rank_ptr,
        K,
        stride_xm, stride_xk,
        stride_as, stride_ak, stride_an,
        stride_om, stride_on,
        scale,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    ):
        seg = tl.program_id(0)
        pid_m = tl.program_id(1)
        pid_n = tl.program_id(2)
        seg_len = tl.load(seg_len_ptr + seg)
        if pid_m * BLOCK_M >= seg_len:
            return
        adapter = tl.load(seg_adapter_ptr + seg)
        if adapter < 0:
            return
        rank = tl.load(rank_ptr + adapter)
        if pid_n * BLOCK_N >= rank:
            return
        start = tl.load(seg_start_ptr + seg).to(tl.int64)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        m_mask = offs_m < seg_len
        n_mask = offs_n < rank
        rows = start + offs_m
        x_ptrs = x_ptr + rows[:, None] * stride_xm + offs_k[None, :] * stride_xk
        a_ptrs = (a_ptr + adapter.to(tl.int64) * stride_as + offs_k[:, None] * stride_ak
                  + offs_n[None, :] * stride_an)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, tl.cdiv(K, BLOCK_K)):
            k_rem = K - k * BLOCK_K
            xt = tl.load(x_ptrs, mask=m_mask[:, None] & (offs_k[None, :] < k_rem), other=0.0)
            at = tl.load(a_ptrs, mask=(offs_k[:, None] < k_rem) & n_mask[None, :], other=0.0)
            acc += tl.dot(xt, at, input_precision="ieee")
            x_ptrs += BLOCK_K * stride_xk
            a_ptrs += BLOCK_K * stride_ak
        acc = acc * scale
        o_ptrs = out_ptr + rows[:, None] * stride_om + offs_n[None, :] * stride_on
        tl.store(o_ptrs, acc.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])

    @triton.jit
    def _sgmv_expand_kernel(
        y_ptr, b_ptr, out_ptr,
        seg_start_ptr, seg_len_ptr, seg_adapter_ptr, rank_ptr,
        N,
        stride_ym, stride_yk,
        stride_bs, stride_bk, stride_bn,
        stride_om, stride_on,
        ADD_INPUTS: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    ):
        seg = tl.program_id(0)
        pid_m = tl.program_id(1)
        pid_n = tl.program_id(2)
        seg_len = tl.load(seg_len_ptr + seg)
        if pid_m * BLOCK_M >= seg_len:
            return
        adapter = tl.load(seg_adapter_ptr + seg)
        if adapter < 0:
            return
        rank = tl.load(rank_ptr + adapter)
        start = tl.load(seg_start_ptr + seg).to(tl.int64)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        m_mask = offs_m < seg_len
        n_mask = offs_n < N
        rows = start + offs_m
        y_ptrs = y_ptr + rows[:, None] * stride_ym + offs_k[None, :] * stride_yk
        b_ptrs = (b_ptr + adapter.to(tl.int64) * stride_bs + offs_k[:, None] * stride_bk
                  + offs_n[None, :] * stride_bn)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, tl.cdiv(rank, BLOCK_K)):
            k_rem = rank - k * BLOCK_K
            yt = tl.load(y_ptrs, mask=m_mask[:, None] & (offs_k[None, :] < k_rem), other=0.0)
            bt = tl.load(b_ptrs, mask=(offs_k[:, None] < k_rem) & n_mask[None, :], other=0.0)
            acc += tl.dot(yt, bt, input_precision="ieee")
            y_ptrs += BLOCK_K * stride_yk
            b_ptrs += BLOCK_K * stride_bk
        o_ptrs = out_ptr + rows[:, None] * stride_om + offs_n[None, :] * stride_on
        o_mask = m_mask[:, None] & n_mask[None, :]
        if ADD_INPUTS:
            acc += tl.load(o_ptrs, mask=o_mask, other=0.0).to(tl.float32)
        tl.store(o_ptrs, acc.to(out_ptr.dtype.element_ty), mask=o_mask)

    @triton.jit
    def _bgmv_shrink_kernel(
        x_ptr, a_ptr, out_ptr,
        idx_ptr, rank_ptr,
        K,
        stride_xm, stride_xk,
        stride_as, stride_ak, stride_an,
        stride_om, stride_on,
        scale,
        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    ):
        tok = tl.program_id(0)
        pid_n = tl.program_id(1)
        adapter = tl.load(idx_ptr + tok)
        if adapter < 0:
            return
        rank = tl.load(rank_ptr + adapter)
        if pid_n * BLOCK_N >= rank:
            return
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        n_mask = offs_n < rank
        row = tok.to(tl.int64)
        x_ptrs = x_ptr + row * stride_xm + offs_k * stride_xk
        a_ptrs = (a_ptr + adapter.to(tl.int64) * stride_as + offs_k[:, None] * stride_ak
                  + offs_n[None, :] * stride_an)
        acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
        for k in range(0, tl.cdiv(K, BLOCK_K)):
            k_rem = K - k * BLOCK_K
            xk = tl.load(x_ptrs, mask=offs_k < k_rem, other=0.0).to(tl.float32)
            at = tl.load(a_ptrs, mask=(offs_k[:, None] < k_rem) & n_mask[None, :], other=0.0).to(tl.float32)
            acc += tl.sum(xk[:, None] * at, axis=0)
            x_ptrs += BLOCK_K * stride_xk
            a_ptrs += BLOCK_K * stride_ak
        acc = acc * scale
        tl.store(out_ptr + row * stride_om + offs_n * stride_on, acc.to(out_ptr.dtype.element_ty), mask=n_mask)

    @triton.jit
    def _bgmv_expand_kernel(
        y_ptr, b_ptr, out_ptr,
        idx_ptr, rank_ptr,
        N,
        stride_ym, stride_yk,
        stride_bs, stride_bk, stride_bn,
        stride_om, stride_on,
        ADD_INPUTS: tl.constexpr,
        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    ):
        tok = tl.program_id(0)
        pid_n = tl.program_id(1)
        adapter = tl.load(idx_ptr + tok)
        if adapter < 0:
            return
        rank = tl.load(rank_ptr + adapter)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        n_mask = offs_n < N
        row = tok.to(tl.int64)
        y_ptrs = y_ptr + row * stride_ym + offs_k * stride_yk
        b_ptrs = (b_ptr + adapter.to(tl.int64) * stride_bs + offs_k[:, None] * stride_bk
                  + offs_n[None, :] * stride_bn)
        acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
        for k in range(0, tl.cdiv(rank, BLOCK_K)):
            k_rem = rank - k * BLOCK_K
            yk = tl.load(y_ptrs, mask=offs_k < k_rem, other=0.0).to(tl.float32)
            bt = tl.load(b_ptrs, mask=(offs_k[:, None] < k_rem) & n_mask[None, :], other=0.0).to(tl.float32)
            acc += tl.sum(yk[:, None] * bt, axis=0)
            y_ptrs += BLOCK_K * stride_yk
            b_ptrs += BLOCK_K * stride_bk
        o_ptrs = out_ptr + row * stride_om + offs_n * stride_on
        if ADD_INPUTS:
            acc += tl.load(o_ptrs, mask=n_mask, other=0.0).to(tl.float32)
        tl.store(o_ptrs, acc.to(out_ptr.dtype.element_ty), mask=n_mask)

    @triton.jit
    def _slot_shrink_kernel(
        x_ptr, a_ptr, out_ptr,
        sorted_ptr, count_ptr, start_ptr, lora_ptr,
        M, N, K,
        stride_xm, stride_xk,
        stride_as, stride_ak, stride_an,
        stride_om, stride_on,
        scale,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
    ):
        # vLLM 0.8.5 _lora_shrink_kernel: grid (SPLIT_K * cdiv(M, BM) * cdiv(N, BN), slots + 1)
        pid = tl.program_id(0)
        lora_idx = tl.program_id(1)
        cta_m_num = tl.cdiv(M, BLOCK_M)
        cta_n_num = tl.cdiv(N, BLOCK_N)
        pid_sk = pid % SPLIT_K
        pid_m = (pid // SPLIT_K) % cta_m_num
        pid_n = pid // (SPLIT_K * cta_m_num) % cta_n_num
        lora_id = tl.load(lora_ptr + lora_idx)
        if lora_id == -1:
            return
        m_size = tl.load(count_ptr + lora_idx)
        m_off = pid_m * BLOCK_M
        if m_off >= m_size:
            return
        start = tl.load(start_ptr + lora_idx)
        offs_r = tl.arange(0, BLOCK_M)
        m_mask = offs_r < m_size - m_off
        rows = tl.load(sorted_ptr + start + m_off + offs_r, mask=m_mask, other=0).to(tl.int64)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        n_mask = offs_n < N
        k0 = pid_sk * BLOCK_K
        x_ptrs = x_ptr + rows[:, None] * stride_xm + (k0 + offs_k)[None, :] * stride_xk
        a_ptrs = (a_ptr + lora_id.to(tl.int64) * stride_as + (k0 + offs_k)[:, None] * stride_ak
                  + offs_n[None, :] * stride_an)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, tl.cdiv(K, BLOCK_K * SPLIT_K)):
            k_rem = K - k * BLOCK_K * SPLIT_K - k0
            xt = tl.load(x_ptrs, mask=m_mask[:, None] & (offs_k[None, :] < k_rem), other=0.0)
            at = tl.load(a_ptrs, mask=(offs_k[:, None] < k_rem) & n_mask[None, :], other=0.0)
            acc += tl.dot(xt, at, input_precision="ieee")
            x_ptrs += BLOCK_K * SPLIT_K * stride_xk
            a_ptrs += BLOCK_K * SPLIT_K * stride_ak
        acc = acc * scale
        o_ptrs = out_ptr + rows[:, None] * stride_om + offs_n[None, :] * stride_on
        o_mask = m_mask[:, None] & n_mask[None, :]
        if SPLIT_K == 1:
            tl.store(o_ptrs, acc, mask=o_mask)
        else:
            tl.atomic_add(o_ptrs, acc, mask=o_mask)

    @triton.jit
    def _slot_expand_kernel(
        y_ptr, b_ptr, out_ptr,
        sorted_ptr, count_ptr, start_ptr, lora_ptr,
        M, N, K,
        stride_ym, stride_yk,
        stride_bs, stride_bk, stride_bn,
        stride_om, stride_on,
        ADD_INPUTS: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    ):
        # vLLM 0.8.5 _lora_expand_kernel: grid (cdiv(M, BM) * cdiv(N, BN), slots + 1)
        pid = tl.program_id(0)
        lora_idx = tl.program_id(1)
        cta_m_num = tl.cdiv(M, BLOCK_M)
        cta_n_num = tl.cdiv(N, BLOCK_N)
        pid_m = pid % cta_m_num
        pid_n = (pid // cta_m_num) % cta_n_num
        lora_id = tl.load(lora_ptr + lora_idx)
        if lora_id == -1:
            return
        m_size = tl.load(count_ptr + lora_idx)
        m_off = pid_m * BLOCK_M
        if m_off >= m_size:
            return
        start = tl.load(start_ptr + lora_idx)
        offs_r = tl.arange(0, BLOCK_M)
        m_mask = offs_r < m_size - m_off
        rows = tl.load(sorted_ptr + start + m_off + offs_r, mask=m_mask, other=0).to(tl.int64)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        n_mask = offs_n < N
        y_ptrs = y_ptr + rows[:, None] * stride_ym + offs_k[None, :] * stride_yk
        b_ptrs = (b_ptr + lora_id.to(tl.int64) * stride_bs + offs_k[:, None] * stride_bk
                  + offs_n[None, :] * stride_bn)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, tl.cdiv(K, BLOCK_K)):
            k_rem = K - k * BLOCK_K
            bt = tl.load(b_ptrs, mask=(offs_k[:, None] < k_rem) & n_mask[None, :], other=0.0)
            yt = tl.load(y_ptrs, mask=m_mask[:, None] & (offs_k[None, :] < k_rem), other=0.0).to(bt.dtype)
            acc += tl.dot(yt, bt, input_precision="ieee")
            y_ptrs += BLOCK_K * stride_yk
            b_ptrs += BLOCK_K * stride_bk
        o_ptrs = out_ptr + rows[:, None] * stride_om + offs_n[None, :] * stride_on
        o_mask = m_mask[:, None] & n_mask[None, :]
        if ADD_INPUTS:
            acc += tl.load(o_ptrs, mask=o_mask, other=0.0).to(tl.float32)
        tl.store(o_ptrs, acc.to(out_ptr.dtype.element_ty), mask=o_mask)


# --------------------------------------------------------------------------------------------
# Argument preparation
# --------------------------------------------------------------------------------------------
def _pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def _clamp_pow2(n: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, _pow2(n)))


def _as_index(v: IntSeq, device: torch.device) -> torch.Tensor:
    if isinstance(v, torch.Tensor):
        if v.device == device and v.dtype == torch.int32:
            return v.contiguous()
        return v.to(device=device, dtype=torch.int32).contiguous()
    return torch.tensor(list(v), dtype=torch.int32, device=device)


def _ranks_tensor(ranks: IntSeq | None, stack: torch.Tensor, rank_dim: int) -> torch.Tensor:
    if ranks is None:
        return torch.full((stack.shape[0],), stack.shape[rank_dim], dtype=torch.int32, device=stack.device)
    r = _as_index(ranks, stack.device)
    if r.numel() != stack.shape[0]:
        raise ValueError(f"ranks has {r.numel()} entries for {stack.shape[0]} adapter slots")
    return r


def _check_ranks_host(ranks: IntSeq | None, r_max: int) -> None:
    if ranks is None or (isinstance(ranks, torch.Tensor) and ranks.device.type == "cuda"):
        return  # avoid a device sync; the caller built them
    vals = ranks.tolist() if isinstance(ranks, torch.Tensor) else list(ranks)
    if any(r < 0 or r > r_max for r in vals):
        raise ValueError(f"ranks {vals} must lie in [0, {r_max}] (the stack's padded rank)")


def _max_len(seg_lens: IntSeq, max_seg_len: int | None) -> int:
    if max_seg_len is not None:
        return int(max_seg_len)
    if isinstance(seg_lens, torch.Tensor):
        return int(seg_lens.max().item()) if seg_lens.numel() else 0
    return max(seg_lens, default=0)


def _block_m(max_len: int) -> int:
    return _clamp_pow2(max_len, 16, 64)


def _require_triton(device: torch.device) -> None:
    ok, why = triton_usable(device)
    if not ok:
        raise RuntimeError(f"Triton kernels unavailable: {why}")


# --------------------------------------------------------------------------------------------
# Public Triton entry points
# --------------------------------------------------------------------------------------------
def sgmv_shrink(x: torch.Tensor, lora_a_stack: torch.Tensor, seg_starts: IntSeq, seg_lens: IntSeq,
                seg_adapter_idx: IntSeq, ranks: IntSeq | None = None, scale: float = 1.0,
                out: torch.Tensor | None = None, max_seg_len: int | None = None) -> torch.Tensor:
    """``out[rows of seg s, :r] = scale * x[rows] @ A[seg_adapter_idx[s]][:, :r]``; ``(T, R_max)``.

    ``out`` (if given) is zeroed first. ``max_seg_len`` spares a device sync when the segment
    lengths are a GPU tensor.
    """
    _require_triton(x.device)
    T, K = x.shape
    S, Ka, R = lora_a_stack.shape
    if Ka != K:
        raise ValueError(f"x has d_in {K} but lora_a_stack has {Ka}")
    if lora_a_stack.dtype != x.dtype:
        raise ValueError(f"dtype mismatch: x {x.dtype}, lora_a_stack {lora_a_stack.dtype}")
    _check_ranks_host(ranks, R)
    dev = x.device
    starts, lens, idx = _as_index(seg_starts, dev), _as_index(seg_lens, dev), _as_index(seg_adapter_idx, dev)
    rk = _ranks_tensor(ranks, lora_a_stack, 2)
    out = torch.zeros((T, R), dtype=x.dtype, device=dev) if out is None else out.zero_()
    n_seg = starts.numel()
    mlen = _max_len(seg_lens, max_seg_len)
    if n_seg == 0 or mlen == 0 or T == 0:
        return out
    BM, BN, BK = _block_m(mlen), _clamp_pow2(R, 16, 64), _clamp_pow2(K, 16, 64)
    grid = (n_seg, triton.cdiv(mlen, BM), triton.cdiv(R, BN))
    _sgmv_shrink_kernel[grid](
        x, lora_a_stack, out, starts, lens, idx, rk, K,
        x.stride(0), x.stride(1),
        lora_a_stack.stride(0), lora_a_stack.stride(1), lora_a_stack.stride(2),
        out.stride(0), out.stride(1), float(scale),
        BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK,
    )
    return out


def sgmv_expand(y: torch.Tensor, lora_b_stack: torch.Tensor, seg_starts: IntSeq, seg_lens: IntSeq,
                seg_adapter_idx: IntSeq, ranks: IntSeq | None = None, out: torch.Tensor | None = None,
                add_inputs: bool = True, max_seg_len: int | None = None) -> torch.Tensor:
    """``out[rows of seg s] (+)= y[rows, :r] @ B[seg_adapter_idx[s]][:r]``; ``(T, d_out)``.

    With ``out`` given and ``add_inputs`` (the default) the LoRA term is added to it in place
    (``y += x @ B``, Punica); rows outside every segment keep their value.
    """
    _require_triton(y.device)
    T, Ry = y.shape
    S, R, N = lora_b_stack.shape
    if Ry != R:
        raise ValueError(f"y has {Ry} rank columns but lora_b_stack is padded to {R}")
    if lora_b_stack.dtype != y.dtype:
        raise ValueError(f"dtype mismatch: y {y.dtype}, lora_b_stack {lora_b_stack.dtype}")
    _check_ranks_host(ranks, R)
    dev = y.device
    starts, lens, idx = _as_index(seg_starts, dev), _as_index(seg_lens, dev), _as_index(seg_adapter_idx, dev)
    rk = _ranks_tensor(ranks, lora_b_stack, 1)
    if out is None:
        out, add_inputs = torch.zeros((T, N), dtype=y.dtype, device=dev), False
    n_seg = starts.numel()
    mlen = _max_len(seg_lens, max_seg_len)
    if n_seg == 0 or mlen == 0 or T == 0:
        return out
    BM, BN, BK = _block_m(mlen), _clamp_pow2(N, 16, 64), _clamp_pow2(R, 16, 64)
    grid = (n_seg, triton.cdiv(mlen, BM), triton.cdiv(N, BN))
    _sgmv_expand_kernel[grid](
        y, lora_b_stack, out, starts, lens, idx, rk, N,
        y.stride(0), y.stride(1),
        lora_b_stack.stride(0), lora_b_stack.stride(1), lora_b_stack.stride(2),
        out.stride(0), out.stride(1),
        ADD_INPUTS=bool(add_inputs), BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK,
    )
    return out


def bgmv_shrink(x: torch.Tensor, lora_a_stack: torch.Tensor, token_adapter_idx: IntSeq,
                ranks: IntSeq | None = None, scale: float = 1.0, out: torch.Tensor | None = None) -> torch.Tensor:
    """``out[t, :r] = scale * x[t] @ A[token_adapter_idx[t]][:, :r]``; ``(T, R_max)`` (zeroed first)."""
    _require_triton(x.device)
    T, K = x.shape
    S, Ka, R = lora_a_stack.shape
    if Ka != K:
        raise ValueError(f"x has d_in {K} but lora_a_stack has {Ka}")
    if lora_a_stack.dtype != x.dtype:
        raise ValueError(f"dtype mismatch: x {x.dtype}, lora_a_stack {lora_a_stack.dtype}")
    _check_ranks_host(ranks, R)
    idx = _as_index(token_adapter_idx, x.device)
    if idx.numel() != T:
        raise ValueError(f"token_adapter_idx has {idx.numel()} entries for {T} tokens")
    rk = _ranks_tensor(ranks, lora_a_stack, 2)
    out = torch.zeros((T, R), dtype=x.dtype, device=x.device) if out is None else out.zero_()
    if T == 0:
        return out
    BN, BK = _clamp_pow2(R, 16, 128), _clamp_pow2(K, 16, 64)
    grid = (T, triton.cdiv(R, BN))
    _bgmv_shrink_kernel[grid](
        x, lora_a_stack, out, idx, rk, K,
        x.stride(0), x.stride(1),
        lora_a_stack.stride(0), lora_a_stack.stride(1), lora_a_stack.stride(2),
        out.stride(0), out.stride(1), float(scale),
        BLOCK_N=BN, BLOCK_K=BK,
    )
    return out


def bgmv_expand(y: torch.Tensor, lora_b_stack: torch.Tensor, token_adapter_idx: IntSeq,
                ranks: IntSeq | None = None, out: torch.Tensor | None = None,
                add_inputs: bool = True) -> torch.Tensor:
    """``out[t] (+)= y[t, :r] @ B[token_adapter_idx[t]][:r]``; ``(T, d_out)``."""
    _require_triton(y.device)
    T, Ry = y.shape
    S, R, N = lora_b_stack.shape
    if Ry != R:
        raise ValueError(f"y has {Ry} rank columns but lora_b_stack is padded to {R}")
    if lora_b_stack.dtype != y.dtype:
        raise ValueError(f"dtype mismatch: y {y.dtype}, lora_b_stack {lora_b_stack.dtype}")
    _check_ranks_host(ranks, R)
    idx = _as_index(token_adapter_idx, y.device)
    if idx.numel() != T:
        raise ValueError(f"token_adapter_idx has {idx.numel()} entries for {T} tokens")
    rk = _ranks_tensor(ranks, lora_b_stack, 1)
    if out is None:
        out, add_inputs = torch.zeros((T, N), dtype=y.dtype, device=y.device), False
    if T == 0:
        return out
    BN, BK = _clamp_pow2(N, 16, 128), _clamp_pow2(R, 16, 64)
    grid = (T, triton.cdiv(N, BN))
    _bgmv_expand_kernel[grid](
        y, lora_b_stack, out, idx, rk, N,
        y.stride(0), y.stride(1),
        lora_b_stack.stride(0), lora_b_stack.stride(1), lora_b_stack.stride(2),
        out.stride(0), out.stride(1),
        ADD_INPUTS=bool(add_inputs), BLOCK_N=BN, BLOCK_K=BK,
    )
    return out


# --------------------------------------------------------------------------------------------
# vLLM 0.8.5's slot-grid kernels (lora_shrink.py / lora_expand.py): metadata, block counts, calls
# --------------------------------------------------------------------------------------------
#: vLLM 0.8.5's fixed launch configurations (``lora_shrink.py``/``lora_expand.py``, "TODO tuning this config")
SLOT_SHRINK_BLOCKS = {"small": dict(BLOCK_M=32, BLOCK_N=16, BLOCK_K=256, SPLIT_K=64),
                      "large": dict(BLOCK_M=32, BLOCK_N=16, BLOCK_K=32, SPLIT_K=8)}
SLOT_EXPAND_BLOCKS = dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=16)
#: the shrink's configuration switches at this many tokens (``M < 128``: ``small``)
SLOT_SHRINK_SWITCH = 128
#: the shrink's split count in the correctness checks run by Triton's interpreter (:func:`slot_shrink`'s
#: ``split_k``): more than one split, so the atomic partial sums and the fully masked splits past ``d_in``
#: (``BLOCK_K`` 256 and ``d_in`` below 256 in every check) are both exercised, at a sixteenth of the
#: ``small`` configuration's 64 programs per tile
INTERPRETER_SPLIT_K = 4


def slot_meta(token_slot: IntSeq, slots: int, device: torch.device | str | None = None) -> tuple[torch.Tensor, ...]:
    """vLLM's ``LoRAKernelMeta.prepare_tensors``: ``token_slot[t]`` is token ``t``'s adapter slot
    (``-1``: none). Returns ``(sorted_token_idx, count, start, lora_id)``, the last three with ``slots + 1``
    entries: entry 0 is the no-adapter group (``lora_id`` -1), entry ``s + 1`` slot ``s`` (``lora_id`` ``s``
    when it holds a token of the batch, else -1)."""
    ts = _as_index(token_slot, torch.device(device) if device is not None else
                   (token_slot.device if isinstance(token_slot, torch.Tensor) else torch.device("cpu")))
    if ts.numel() and (int(ts.min()) < -1 or int(ts.max()) >= slots):
        raise ValueError(f"token slots must lie in [-1, {slots - 1}] for {slots} slots")
    groups = ts.long() + 1
    order = torch.argsort(groups, stable=True).to(torch.int32)
    count = torch.bincount(groups, minlength=slots + 1).to(torch.int32)
    start = (torch.cumsum(count, 0) - count).to(torch.int32)
    lora_id = torch.arange(-1, slots, dtype=torch.int32, device=ts.device)
    lora_id = torch.where(count > 0, lora_id, torch.full_like(lora_id, -1))
    return order, count, start, lora_id


def slot_grid_blocks(kind: str, tokens: int, slots: int, n_out: int, slot_tokens: Sequence[int]) -> tuple[int, int]:
    """``(launched, working)`` thread blocks of one ``slot_shrink`` (``n_out`` = the padded rank) or
    ``slot_expand`` (``n_out`` = the output features) call over ``tokens`` tokens, ``slots`` slots and the
    active slots' token counts ``slot_tokens``: the count :class:`twin.perf.forms.KernelGridLora` prices."""
    def cdiv(a: int, b: int) -> int:
        return -(-a // b)

    if kind == "shrink":
        c = SLOT_SHRINK_BLOCKS["small" if tokens < SLOT_SHRINK_SWITCH else "large"]
        per_tile = c["SPLIT_K"] * cdiv(n_out, c["BLOCK_N"])
    elif kind == "expand":
        c = SLOT_EXPAND_BLOCKS
        per_tile = cdiv(n_out, c["BLOCK_N"])
    else:
        raise ValueError(f"kind must be shrink or expand, got {kind!r}")
    launched = (slots + 1) * cdiv(tokens, c["BLOCK_M"]) * per_tile
    working = sum(cdiv(int(n), c["BLOCK_M"]) for n in slot_tokens if n > 0) * per_tile
    return launched, working


def slot_shrink(x: torch.Tensor, lora_a_stack: torch.Tensor, meta: tuple[torch.Tensor, ...], scale: float = 1.0,
                out: torch.Tensor | None = None, split_k: int | None = None) -> torch.Tensor:
    """vLLM 0.8.5's ``lora_shrink``: ``out[t] = scale * x[t] @ A[slot of t]`` over the padded rank, into a
    float32 ``(T, R_max)`` buffer (zeroed first; split-K partial sums are added atomically). ``meta`` is
    :func:`slot_meta` of the batch (its ``slots + 1`` groups are the grid's slot dimension).

    ``split_k`` replaces the configuration's ``SPLIT_K`` (None: vLLM's, :data:`SLOT_SHRINK_BLOCKS`). Only the
    correctness checks under Triton's interpreter pass it (:data:`INTERPRETER_SPLIT_K`): the kernel's code is
    the same for any split count, and a split past ``d_in`` is a fully masked program that adds zeros, which
    the interpreter runs in Python at ~25 ms each (64 splits made the shrink 90 % of the kernel checks' time)."""
    _require_triton(x.device)
    T, K = x.shape
    S, Ka, R = lora_a_stack.shape
    if Ka != K:
        raise ValueError(f"x has d_in {K} but lora_a_stack has {Ka}")
    if lora_a_stack.dtype != x.dtype:
        raise ValueError(f"dtype mismatch: x {x.dtype}, lora_a_stack {lora_a_stack.dtype}")
    order, count, start, lora_id = meta
    if count.numel() != S + 1:
        raise ValueError(f"meta is for {count.numel() - 1} slots, the stack has {S}")
    out = torch.zeros((T, R), dtype=torch.float32, device=x.device) if out is None else out.zero_()
    if T == 0:
        return out
    c = SLOT_SHRINK_BLOCKS["small" if T < SLOT_SHRINK_SWITCH else "large"]
    if split_k is not None:
        if not isinstance(split_k, int) or split_k < 1:
            raise ValueError(f"split_k must be a positive integer, got {split_k!r}")
        c = {**c, "SPLIT_K": split_k}
    grid = (c["SPLIT_K"] * triton.cdiv(T, c["BLOCK_M"]) * triton.cdiv(R, c["BLOCK_N"]), S + 1)
    _slot_shrink_kernel[grid](
        x, lora_a_stack, out, order, count, start, lora_id, T, R, K,
        x.stride(0), x.stride(1),
        lora_a_stack.stride(0), lora_a_stack.stride(1), lora_a_stack.stride(2),
        out.stride(0), out.stride(1), float(scale), **c,
    )
    return out


def slot_expand(y: torch.Tensor, lora_b_stack: torch.Tensor, meta: tuple[torch.Tensor, ...],
                out: torch.Tensor | None = None, add_inputs: bool = True) -> torch.Tensor:
    """vLLM 0.8.5's ``lora_expand``: ``out[t] (+)= y[t] @ B[slot of t]`` over the padded rank; ``y`` is the
    shrink's float32 buffer, cast to the weights' dtype as vLLM does."""
    _require_triton(y.device)
    T, Ry = y.shape
    S, R, N = lora_b_stack.shape
    if Ry != R:
        raise ValueError(f"y has {Ry} rank columns but lora_b_stack is padded to {R}")
    order, count, start, lora_id = meta
    if count.numel() != S + 1:
        raise ValueError(f"meta is for {count.numel() - 1} slots, the stack has {S}")
    if out is None:
        out, add_inputs = torch.zeros((T, N), dtype=lora_b_stack.dtype, device=y.device), False
    if T == 0:
        return out
    c = SLOT_EXPAND_BLOCKS
    grid = (triton.cdiv(T, c["BLOCK_M"]) * triton.cdiv(N, c["BLOCK_N"]), S + 1)
    _slot_expand_kernel[grid](
        y, lora_b_stack, out, order, count, start, lora_id, T, N, R,
        y.stride(0), y.stride(1),
        lora_b_stack.stride(0), lora_b_stack.stride(1), lora_b_stack.stride(2),
        out.stride(0), out.stride(1),
        ADD_INPUTS=bool(add_inputs), **c,
    )
    return out


def slot_shrink_ref(x, lora_a_stack, token_slot, scale=1.0, out=None):
    """Plain torch :func:`slot_shrink` (one matmul per slot in the batch), float32 ``(T, R_max)``."""
    T, R = x.shape[0], lora_a_stack.shape[2]
    ts = torch.as_tensor(_host_list(token_slot), device=x.device, dtype=torch.long)
    out = torch.zeros((T, R), dtype=torch.float32, device=x.device) if out is None else out.zero_()
    for a in sorted(set(ts.tolist())):
        if a < 0:
            continue
        rows = (ts == a).nonzero().squeeze(1)
        out[rows] = (x[rows].float() @ lora_a_stack[a].float()) * scale
    return out


def slot_expand_ref(y, lora_b_stack, token_slot, out=None, add_inputs=True):
    """Plain torch :func:`slot_expand`."""
    T, N = y.shape[0], lora_b_stack.shape[2]
    ts = torch.as_tensor(_host_list(token_slot), device=y.device, dtype=torch.long)
    if out is None:
        out, add_inputs = torch.zeros((T, N), dtype=lora_b_stack.dtype, device=y.device), False
    for a in sorted(set(ts.tolist())):
        if a < 0:
            continue
        rows = (ts == a).nonzero().squeeze(1)
        delta = (y[rows].to(lora_b_stack.dtype).float() @ lora_b_stack[a].float()).to(out.dtype)
        if add_inputs:
            out[rows] += delta
        else:
            out[rows] = delta
    return out


# --------------------------------------------------------------------------------------------
# Plain torch references (also what the CPU bench times)
# --------------------------------------------------------------------------------------------
def _host_list(v: IntSeq | None) -> list[int] | None:
    if v is None:
        return None
    return [int(t) for t in (v.tolist() if isinstance(v, torch.Tensor) else v)]


def sgmv_shrink_ref(x, lora_a_stack, seg_starts, seg_lens, seg_adapter_idx, ranks=None, scale=1.0, out=None,
                    max_seg_len=None):
    T, R = x.shape[0], lora_a_stack.shape[2]
    rk = _host_list(ranks) or [R] * lora_a_stack.shape[0]
    out = torch.zeros((T, R), dtype=x.dtype, device=x.device) if out is None else out.zero_()
    for s, n, a in zip(_host_list(seg_starts), _host_list(seg_lens), _host_list(seg_adapter_idx)):
        if n <= 0 or a < 0:
            continue
        r = rk[a]
        out[s:s + n, :r] = (x[s:s + n] @ lora_a_stack[a, :, :r]) * scale
    return out


def sgmv_expand_ref(y, lora_b_stack, seg_starts, seg_lens, seg_adapter_idx, ranks=None, out=None,
                    add_inputs=True, max_seg_len=None):
    T, R, N = y.shape[0], lora_b_stack.shape[1], lora_b_stack.shape[2]
    rk = _host_list(ranks) or [R] * lora_b_stack.shape[0]
    if out is None:
        out, add_inputs = torch.zeros((T, N), dtype=y.dtype, device=y.device), False
    for s, n, a in zip(_host_list(seg_starts), _host_list(seg_lens), _host_list(seg_adapter_idx)):
        if n <= 0 or a < 0:
            continue
        r = rk[a]
        delta = y[s:s + n, :r] @ lora_b_stack[a, :r, :]
        if add_inputs:
            out[s:s + n] += delta
        else:
            out[s:s + n] = delta
    return out


def bgmv_shrink_ref(x, lora_a_stack, token_adapter_idx, ranks=None, scale=1.0, out=None):
    T, R = x.shape[0], lora_a_stack.shape[2]
    rk = _host_list(ranks) or [R] * lora_a_stack.shape[0]
    idx = torch.as_tensor(_host_list(token_adapter_idx), device=x.device, dtype=torch.long)
    out = torch.zeros((T, R), dtype=x.dtype, device=x.device) if out is None else out.zero_()
    for a in sorted(set(idx.tolist())):
        if a < 0:
            continue
        rows = (idx == a).nonzero().squeeze(1)
        r = rk[a]
        out[rows, :r] = (x[rows] @ lora_a_stack[a, :, :r]) * scale
    return out


def bgmv_expand_ref(y, lora_b_stack, token_adapter_idx, ranks=None, out=None, add_inputs=True):
    T, R, N = y.shape[0], lora_b_stack.shape[1], lora_b_stack.shape[2]
    rk = _host_list(ranks) or [R] * lora_b_stack.shape[0]
    idx = torch.as_tensor(_host_list(token_adapter_idx), device=y.device, dtype=torch.long)
    if out is None:
        out, add_inputs = torch.zeros((T, N), dtype=y.dtype, device=y.device), False
    for a in sorted(set(idx.tolist())):
        if a < 0:
            continue
        rows = (idx == a).nonzero().squeeze(1)
        r = rk[a]
        delta = y[rows, :r] @ lora_b_stack[a, :r, :]
        if add_inputs:
            out[rows] += delta
        else:
            out[rows] = delta
    return out


KERNELS = {"sgmv_shrink": sgmv_shrink, "sgmv_expand": sgmv_expand,
           "bgmv_shrink": bgmv_shrink, "bgmv_expand": bgmv_expand}
REFERENCES = {"sgmv_shrink": sgmv_shrink_ref, "sgmv_expand": sgmv_expand_ref,
              "bgmv_shrink": bgmv_shrink_ref, "bgmv_expand": bgmv_expand_ref}


# --------------------------------------------------------------------------------------------
# Batch layouts
# --------------------------------------------------------------------------------------------
def even_segments(tokens: int, n_adapters: int) -> tuple[list[int], list[int], list[int]]:
    """Split ``tokens`` into ``n_adapters`` contiguous segments (sizes differ by at most 1).

    Returns ``(seg_starts, seg_lens, seg_adapter_idx)`` with adapter ``i`` on segment ``i``;
    when ``tokens < n_adapters`` the last segments are empty.
    """
    base, extra = divmod(tokens, n_adapters)
    lens = [base + (1 if i < extra else 0) for i in range(n_adapters)]
    starts = [sum(lens[:i]) for i in range(n_adapters)]
    return starts, lens, list(range(n_adapters))


def interleaved_tokens(tokens: int, n_adapters: int) -> list[int]:
    """Decode layout: token ``t`` uses adapter ``t % n_adapters``."""
    return [t % n_adapters for t in range(tokens)]


# --------------------------------------------------------------------------------------------
# Ahead-of-time compilation (checks the compiled path on a machine without a GPU)
# --------------------------------------------------------------------------------------------
_INDEX_PTRS = ("seg_start_ptr", "seg_len_ptr", "seg_adapter_ptr", "rank_ptr", "idx_ptr", "sorted_ptr", "count_ptr",
               "start_ptr", "lora_ptr")


def compile_for_target(arch: int = 90, dtype: str = "fp16", backend: str = "cuda") -> dict[str, list[str]]:
    """Compile the kernels for a GPU target with no GPU present (Triton ships ``ptxas``).

    Returns ``{kernel name: [stages produced]}`` (``ttir ... cubin``); raises on a compile error.
    Needs ``TRITON_INTERPRET`` unset when this module was imported (the kernels must be JIT functions).
    """
    import inspect

    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if not HAS_TRITON:
        raise RuntimeError(f"triton is not importable ({TRITON_IMPORT_ERROR})")
    if INTERPRETED:
        raise RuntimeError("the kernels were defined for the interpreter (TRITON_INTERPRET=1)")
    target = GPUTarget(backend, arch, 32 if backend == "cuda" else 64)
    # (name, kernel, constexprs, pointers held in float32: the slot kernels' shrink buffer)
    cases = [
        ("_sgmv_shrink_kernel", _sgmv_shrink_kernel, dict(BLOCK_M=64, BLOCK_N=16, BLOCK_K=64), ()),
        ("_sgmv_expand_kernel", _sgmv_expand_kernel, dict(ADD_INPUTS=True, BLOCK_M=16, BLOCK_N=64, BLOCK_K=16), ()),
        ("_bgmv_shrink_kernel", _bgmv_shrink_kernel, dict(BLOCK_N=16, BLOCK_K=64), ()),
        ("_bgmv_expand_kernel", _bgmv_expand_kernel, dict(ADD_INPUTS=False, BLOCK_N=128, BLOCK_K=64), ()),
        ("_slot_shrink_kernel", _slot_shrink_kernel, dict(SLOT_SHRINK_BLOCKS["small"]), ("out_ptr",)),
        ("_slot_shrink_kernel_large", _slot_shrink_kernel, dict(SLOT_SHRINK_BLOCKS["large"]), ("out_ptr",)),
        ("_slot_expand_kernel", _slot_expand_kernel, dict(ADD_INPUTS=True, **SLOT_EXPAND_BLOCKS), ("y_ptr",)),
    ]
    out = {}
    for name, fn, consts, f32 in cases:
        sig = {}
        for p in inspect.signature(fn.fn).parameters:
            if p in consts:
                sig[p] = "constexpr"
            elif p.endswith("_ptr"):
                sig[p] = "*i32" if p in _INDEX_PTRS else "*fp32" if p in f32 else f"*{dtype}"
            else:
                sig[p] = "fp32" if p == "scale" else "i32"
        compiled = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts), target=target)
        out[name] = list(compiled.asm.keys())
    return out
