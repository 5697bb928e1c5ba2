"""LoRA kernel sweep (``lora_kernels.csv``) and the numerical check (``kernel_check.csv``).

Sweep: for every distinct ``(d_in, d_out)`` of the target modules, rank, number of distinct
adapters ``n`` and batch size ``T`` (``n <= T``), the batch is laid out

* for SGMV as ``n`` contiguous segments of (almost) equal length, one adapter each (prefill);
* for BGMV as token ``t`` -> adapter ``t % n`` (decode);

all adapters have rank ``rank`` in slots padded to ``rank``. The rows are:

* on a GPU: ``kernel`` = the Triton kernel (``impl=triton``), and ``kernel=torch_ref`` rows
  (``impl=torch``, ``op`` = the operation) timing the plain torch reference for comparison;
* on the CPU: ``kernel`` = the operation timed with its torch reference (``impl=torch``,
  ``device=cpu``): Triton's interpreter is a correctness tool, its timings mean nothing.

``d_in``/``d_out`` are the dimensions of the adapted linear module (shrink maps ``d_in -> rank``,
expand ``rank -> d_out``); ``module`` names the modules sharing that shape.

Order of the ``(module shape, rank)`` sweeps (:func:`plan_pairs`): balanced, so that every prefix of it (what a
``--lora-time-limit`` keeps) covers the ranks and the shapes as evenly as it can: the first ``len(ranks)``
sweeps take each rank once, on shapes in turn. ``--skip-measured`` drops the pairs a previous table measured on
this device and counts them in the balance, so a second time-boxed run measures the pairs the first missed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch

from calibration.bench import kernels as K
from calibration.bench.config import BenchConfig
from calibration.bench.timing import TimeBudget, stats, time_op

#: untimed calls before a Triton kernel is timed, whatever ``--warmup`` says: its first call compiles it (and a
#: new specialisation of its integer arguments compiles again), seconds that must not land between CUDA events
TRITON_MIN_WARMUP = 1


def module_shapes(cfg: BenchConfig) -> list[tuple[str, int, int]]:
    """Distinct ``(modules, d_in, d_out)`` of the LoRA targets, e.g. ``("q_proj+o_proj", 4096, 4096)``."""
    by_shape: dict[tuple[int, int], list[str]] = {}
    for m in cfg.targets:
        by_shape.setdefault(cfg.spec.module_shape(m), []).append(m)
    return [("+".join(ms), d_in, d_out) for (d_in, d_out), ms in by_shape.items()]


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


Pair = tuple[str, int, int, int]  # (module, d_in, d_out, rank)


def balanced_order(n_ranks: int, n_shapes: int, seed: int = 0,
                   done: Sequence[tuple[int, int]] = ()) -> list[tuple[int, int]]:
    """Every ``(rank index, shape index)`` pair not in ``done``, ordered so that each prefix covers the ranks and
    the shapes evenly: each next pair takes the least-covered rank, then the least-covered shape of those it has
    left, then the next in a rotation (``seed`` shifts where it starts). ``done`` (pairs already measured) counts
    in the coverage. With the ranks and shapes coprime (5 ranks, 4 shapes) pair ``k`` is ``(k % 5, k % 4)``."""
    rank_n, shape_n = [0] * n_ranks, [0] * n_shapes
    used = set()
    for r, sh in done:
        if (r, sh) not in used:
            used.add((r, sh))
            rank_n[r] += 1
            shape_n[sh] += 1
    out: list[tuple[int, int]] = []
    left = [(r, sh) for r in range(n_ranks) for sh in range(n_shapes) if (r, sh) not in used]
    k = 0
    while left:
        best = min(left, key=lambda p: (rank_n[p[0]], shape_n[p[1]], (p[0] - k - seed) % n_ranks,
                                        (p[1] - k - seed) % n_shapes))
        left.remove(best)
        out.append(best)
        rank_n[best[0]] += 1
        shape_n[best[1]] += 1
        k += 1
    return out


def measured_pairs(path: Path | str, device: str) -> set[tuple[int, int, int]]:
    """The ``(d_in, d_out, rank)`` pairs a previous ``lora_kernels.csv`` holds rows of on ``device``."""
    import pandas as pd

    df = pd.read_csv(path, usecols=["d_in", "d_out", "rank", "device"])
    df = df[df["device"].astype(str) == device]
    return {(int(a), int(b), int(r)) for a, b, r in zip(df["d_in"], df["d_out"], df["rank"])}


def plan_pairs(cfg: BenchConfig, device: str | None = None) -> tuple[list[Pair], list[Pair]]:
    """The ``(module, d_in, d_out, rank)`` sweeps in the order they run (:func:`balanced_order`), and those
    skipped because ``cfg.skip_measured`` measured them on this device (the run's device by default)."""
    shapes = module_shapes(cfg)
    ranks = list(cfg.ranks)
    seen = measured_pairs(cfg.skip_measured, device or cfg.device) if cfg.skip_measured is not None else set()
    done = [(ri, si) for si, (_, d_in, d_out) in enumerate(shapes) for ri, r in enumerate(ranks)
            if (d_in, d_out, r) in seen]
    order = balanced_order(len(ranks), len(shapes), cfg.seed, done)

    def pair(ri: int, si: int) -> Pair:
        return (*shapes[si], ranks[ri])

    return [pair(ri, si) for ri, si in order], [pair(ri, si) for ri, si in done]


def _times_triton(device: torch.device, usable: bool) -> bool:
    """Whether the sweep times the Triton kernels: only compiled on a GPU (the interpreter is a correctness
    tool; its timings mean nothing)."""
    return usable and device.type == "cuda"


def run_lora_kernels(cfg: BenchConfig, device: torch.device, dtype: torch.dtype, log=print,
                     rows: list | None = None, info: dict | None = None) -> tuple[list[dict], str]:
    """Time the four operations over the sweep; returns (rows, note on what was timed). ``rows``: the list the
    rows are appended to as they are measured (the harness passes one that writes them to the table at once);
    ``info`` receives ``cut_by_time_limit``, ``units`` and ``units_done`` ((module, rank) sweeps)."""
    use_triton, why = K.triton_usable(device)
    time_triton = _times_triton(device, use_triton)
    # --no-ref drops the references only where the Triton kernels are timed (elsewhere they are the timing)
    time_refs = cfg.lora_refs or not time_triton
    triton_warmup = max(cfg.warmup, TRITON_MIN_WARMUP)
    if time_triton:
        note = (f"Triton kernels timed with CUDA events after >= {triton_warmup} warm-up call(s); "
                + ("torch_ref rows time the plain torch reference" if time_refs
                   else "torch references not timed (--no-ref)"))
    elif device.type == "cuda":
        note = f"Triton unavailable ({why}): only the torch references were timed (kernel = operation, impl=torch)"
    else:
        note = "CPU: the torch references were timed (kernel = operation, impl=torch); Triton is only checked"
    gen = torch.Generator(device=device).manual_seed(cfg.seed + 1)
    rows = [] if rows is None else rows
    failures: list[str] = []

    def rnd(*shape, std):  # generated on the device: fast for GPU-sized stacks
        return torch.empty(shape, device=device, dtype=dtype).normal_(0.0, std, generator=gen)

    def add_row(kernel, op, impl, module, T, n, rank, d_in, d_out, ms, slots=None, blocks=(None, None)):
        st = stats(ms)
        rows.append({"kernel": kernel, "batch_tokens": T, "n_adapters": n, "rank": rank, "d_in": d_in,
                     "d_out": d_out, "dtype": _dtype_name(dtype), "time_ms_mean": st["mean"],
                     "time_ms_std": st["std"], "repeats": len(ms), "device": device.type, "op": op,
                     "impl": impl, "module": module, "max_rank": rank, "time_ms_median": st["median"],
                     "time_ms_min": st["min"], "slots": n if slots is None else slots,
                     "blocks_launched": blocks[0], "blocks_working": blocks[1]})

    pairs, skipped = plan_pairs(cfg, device.type)
    budget = TimeBudget(cfg.lora_time_limit_s)
    for module, d_in, d_out, rank in pairs:
        if not budget.next_fits():
            break
        for n in cfg.adapters:
            a_stack = rnd(n, d_in, rank, std=d_in ** -0.5)
            b_stack = rnd(n, rank, d_out, std=rank ** -0.5)
            ranks_t = torch.full((n,), rank, dtype=torch.int32, device=device)
            for T in cfg.lora_tokens:
                if n > T:
                    continue
                x = rnd(T, d_in, std=1.0)
                y = torch.zeros((T, rank), dtype=dtype, device=device)
                out = torch.zeros((T, d_out), dtype=dtype, device=device)
                starts, lens, seg_idx = K.even_segments(T, n)
                tok_idx = K.interleaved_tokens(T, n)
                mlen = max(lens)
                dev_seg = [torch.tensor(v, dtype=torch.int32, device=device) for v in (starts, lens, seg_idx)]
                dev_tok = torch.tensor(tok_idx, dtype=torch.int32, device=device)
                # The Triton kernels take device tensors; the references take host lists
                # (what a torch user would loop over).
                def is_ref(f):
                    return f in K.REFERENCES.values()

                def segs(f):
                    return (starts, lens, seg_idx) if is_ref(f) else dev_seg

                def toks(f):
                    return tok_idx if is_ref(f) else dev_tok

                def rk(f):
                    return [rank] * n if is_ref(f) else ranks_t

                calls = {
                    "sgmv_shrink": lambda f: f(x, a_stack, *segs(f), ranks=rk(f), out=y, max_seg_len=mlen),
                    "sgmv_expand": lambda f: f(y, b_stack, *segs(f), ranks=rk(f), out=out, max_seg_len=mlen),
                    "bgmv_shrink": lambda f: f(x, a_stack, toks(f), ranks=rk(f), out=y),
                    "bgmv_expand": lambda f: f(y, b_stack, toks(f), ranks=rk(f), out=out),
                }
                for op, call in calls.items():
                    if time_triton:
                        fn = K.KERNELS[op]
                        try:
                            ms = time_op(lambda: call(fn), device, triton_warmup, cfg.repeats)
                            add_row(op, op, "triton", module, T, n, rank, d_in, d_out, ms)
                        except Exception as e:  # keep the torch figures if a kernel fails
                            failures.append(f"{op} T={T} n={n} rank={rank} {d_in}x{d_out}: "
                                            f"{type(e).__name__}: {e}")
                            log(f"  Triton {failures[-1]}")
                    if time_refs:
                        ref = K.REFERENCES[op]
                        ms = time_op(lambda: call(ref), device, cfg.warmup, cfg.repeats)
                        add_row("torch_ref" if time_triton else op, op, "torch", module, T, n, rank, d_in, d_out,
                                ms)
        log(f"  lora_kernels {module} ({d_in}x{d_out}) rank={rank}: {len(rows)} rows")
        _slot_grid_sweep(cfg, device, dtype, module, d_in, d_out, rank, rnd, time_triton, time_refs, triton_warmup,
                         add_row, failures, log)
        log(f"  lora_kernels slot grid {module} rank={rank}: {len(rows)} rows")
    if failures:
        note += f"; {len(failures)} Triton timings failed, first: {failures[0]}"
    if skipped:
        note += (f"; {len(skipped)} (module, rank) sweeps skipped, measured on {device.type} in "
                 f"{cfg.skip_measured} (--skip-measured)")
    done = budget.stopped_at if budget.stopped else len(pairs)
    if budget.stopped:
        note += (f"; stopped after {done} of {len(pairs)} (module, rank) sweeps: the next would have ended past "
                 f"the time limit of {cfg.lora_time_limit_s:g} s (--lora-time-limit)")
    if info is not None:
        info.update(cut_by_time_limit=budget.stopped, units=len(pairs), units_done=done,
                    pairs_run=[f"{m} rank {r}" for m, _, _, r in pairs[:done]], pairs_skipped=len(skipped))
    return rows, note


def _slot_grid_sweep(cfg: BenchConfig, device, dtype, module, d_in, d_out, rank, rnd, time_triton, time_refs,
                     triton_warmup, add_row, failures, log) -> None:
    """vLLM 0.8.5's slot-grid kernels (``slot_shrink``/``slot_expand``) over ``cfg.slots`` slots with ``n``
    adapters of the batch (``n <= slots``, ``n <= T``) on slots spread over the stack, token ``t`` on the
    ``t % n``-th of them; weights in vLLM's layouts (``A``: ``(S, R, d_in)``, ``B``: ``(S, d_out, R)``)
    padded to ``rank``. Rows carry the call's launched and working thread blocks
    (:func:`calibration.bench.kernels.slot_grid_blocks`)."""
    if not cfg.slots:
        return
    s_max = max(cfg.slots)
    a_all = rnd(s_max, rank, d_in, std=d_in ** -0.5).transpose(1, 2)  # (S, d_in, R) view of vLLM's layout
    b_all = rnd(s_max, d_out, rank, std=rank ** -0.5).transpose(1, 2)
    for S in cfg.slots:
        a_stack, b_stack = a_all[:S], b_all[:S]
        for n in cfg.adapters:
            if n > S:
                continue
            active = [(i * S) // n for i in range(n)]  # n distinct slots spread over the S
            for T in cfg.lora_tokens:
                if n > T:
                    continue
                token_slot = [active[t % n] for t in range(T)]
                x = rnd(T, d_in, std=1.0)
                meta = K.slot_meta(torch.tensor(token_slot, dtype=torch.int32), S, device)
                counts = meta[1][1:].tolist()
                y = torch.zeros((T, rank), dtype=torch.float32, device=device)
                out = torch.zeros((T, d_out), dtype=dtype, device=device)
                calls = {
                    "slot_shrink": ((lambda: K.slot_shrink(x, a_stack, meta, out=y)),
                                    (lambda: K.slot_shrink_ref(x, a_stack, token_slot, out=y)), rank),
                    "slot_expand": ((lambda: K.slot_expand(y, b_stack, meta, out=out)),
                                    (lambda: K.slot_expand_ref(y, b_stack, token_slot, out=out)), d_out),
                }
                for op, (kern, ref, n_out) in calls.items():
                    blocks = K.slot_grid_blocks(op.split("_")[1], T, S, n_out, counts)
                    if time_triton:
                        try:
                            ms = time_op(kern, device, triton_warmup, cfg.repeats)
                            add_row(op, op, "triton", module, T, n, rank, d_in, d_out, ms, S, blocks)
                        except Exception as e:  # keep the torch figures if a kernel fails
                            failures.append(f"{op} T={T} n={n} slots={S} rank={rank} {d_in}x{d_out}: "
                                            f"{type(e).__name__}: {e}")
                            log(f"  Triton {failures[-1]}")
                    if time_refs:
                        ms = time_op(ref, device, cfg.warmup, cfg.repeats)
                        add_row("torch_ref" if time_triton else op, op, "torch", module, T, n, rank, d_in, d_out, ms,
                                S, blocks)


# --------------------------------------------------------------------------------------------
# Numerical check of the Triton kernels against the torch references
# --------------------------------------------------------------------------------------------
#: Mixed-rank cases: (name, d_in, d_out, ranks per slot, T, segments (start, len, adapter),
#: per-token adapters for BGMV, on the first ``len(tokens)`` rows). They cover a zero-length segment, a repeated adapter, an
#: adapter index -1, rows outside every segment, ranks above one block, odd dimensions.
CHECK_CASES = [
    dict(name="mixed_ranks_empty_segment", d_in=48, d_out=40, ranks=[8, 32, 16, 4], T=28,
         segments=[(0, 5, 2), (5, 0, 1), (5, 17, 0), (22, 3, 2)],
         tokens=[2, 0, 1, 3, -1, 2, 2, 0, 3, 1, 0, 0, 1, 2, 3, -1, 1, 1, 0, 2, 3, 3, 0, 1, 2, 2, 0, 1]),
    dict(name="decode_like_single_tokens", d_in=64, d_out=96, ranks=[16, 8, 24, 32], T=6,
         segments=[(0, 1, 3), (1, 1, 3), (2, 1, 0), (3, 1, 1), (4, 1, 2), (5, 1, -1)],
         tokens=[3, 3, 0, 1, 2, -1]),
    dict(name="long_segment_multi_tile", d_in=33, d_out=130, ranks=[32, 20], T=70,
         segments=[(0, 70, 1)], tokens=[1] * 4 + [0] * 4 + [-1]),
    dict(name="rank_above_block", d_in=40, d_out=24, ranks=[80, 72, 8], T=20,
         segments=[(0, 9, 1), (9, 0, 2), (9, 11, 0)], tokens=[i % 3 for i in range(20)]),
]


def _tolerance(dtype: torch.dtype) -> tuple[float, float]:
    if dtype == torch.float32:
        return 1e-4, 1e-4
    if dtype == torch.bfloat16:
        return 3e-2, 3e-2
    return 1e-2, 1e-2


def check_case(case: dict, device: torch.device, dtype: torch.dtype = torch.float32,
               seed: int = 0) -> list[dict]:
    """Run the four Triton kernels and their references on one case; one row per kernel (and mode)."""
    gen = torch.Generator().manual_seed(seed)
    d_in, d_out, ranks, T = case["d_in"], case["d_out"], case["ranks"], case["T"]
    S, R = len(ranks), max(ranks)

    def rnd(*shape, std=1.0):
        return (torch.randn(*shape, generator=gen) * std).to(device=device, dtype=dtype)

    x = rnd(T, d_in)
    a = rnd(S, d_in, R, std=d_in ** -0.5)
    b = rnd(S, R, d_out, std=R ** -0.5)
    y = rnd(T, R)
    base = rnd(T, d_out)
    starts = [s for s, _, _ in case["segments"]]
    lens = [n for _, n, _ in case["segments"]]
    idx = [i for _, _, i in case["segments"]]
    toks = case["tokens"]
    nt = len(toks)
    xt, yt, baset = x[:nt], y[:nt], base[:nt]
    atol, rtol = _tolerance(dtype)
    f32 = lambda t: t.to(torch.float32)  # noqa: E731
    # References in float32 on copies of the same inputs.
    xr, ar, br, yr, baser = f32(x), f32(a), f32(b), f32(y), f32(base)
    results = {
        "sgmv_shrink": (K.sgmv_shrink(x, a, starts, lens, idx, ranks, scale=0.5),
                        K.sgmv_shrink_ref(xr, ar, starts, lens, idx, ranks, scale=0.5)),
        "sgmv_expand": (K.sgmv_expand(y, b, starts, lens, idx, ranks),
                        K.sgmv_expand_ref(yr, br, starts, lens, idx, ranks)),
        "sgmv_expand_add": (K.sgmv_expand(y, b, starts, lens, idx, ranks, out=base.clone()),
                            K.sgmv_expand_ref(yr, br, starts, lens, idx, ranks, out=baser.clone())),
        "bgmv_shrink": (K.bgmv_shrink(xt, a, toks, ranks, scale=0.5),
                        K.bgmv_shrink_ref(xr[:nt], ar, toks, ranks, scale=0.5)),
        "bgmv_expand": (K.bgmv_expand(yt, b, toks, ranks),
                        K.bgmv_expand_ref(yr[:nt], br, toks, ranks)),
        "bgmv_expand_add": (K.bgmv_expand(yt, b, toks, ranks, out=baset.clone()),
                            K.bgmv_expand_ref(yr[:nt], br, toks, ranks, out=baser[:nt].clone())),
    }
    # vLLM's slot-grid kernels over the BGMV case's tokens (padded rank R, float32 shrink buffer): with a
    # stack of one slot more than the case names, so an empty slot launches blocks that must exit (one is
    # enough: every empty slot's blocks take the same exit; the interpreter runs each block in Python)
    # (under the interpreter the small-batch shrink runs INTERPRETER_SPLIT_K splits instead of vLLM's 64:
    # the same kernel code, without 60 fully masked programs per tile that cost the checks a minute)
    interpreted = K.INTERPRETED  # (the kernels were defined for the interpreter: on any device, they ran in it)
    split_k = K.INTERPRETER_SPLIT_K if interpreted else None
    S2 = S + 1
    a2 = torch.cat([a, rnd(1, d_in, R, std=d_in ** -0.5)])
    b2 = torch.cat([b, rnd(1, R, d_out, std=R ** -0.5)])
    meta = K.slot_meta(torch.tensor(toks, dtype=torch.int32), S2, device)
    y32 = K.slot_shrink_ref(f32(xt), f32(a2), toks, scale=0.5)
    results["slot_shrink"] = (K.slot_shrink(xt, a2, meta, scale=0.5, split_k=split_k), y32)
    results["slot_expand_add"] = (K.slot_expand(y32.to(device), b2, meta, out=baset.clone()),
                                  K.slot_expand_ref(y32, f32(b2), toks, out=baser[:nt].clone()))
    if nt >= 2:  # the large-batch configuration (8 split-K partial sums) on a batch of 128+ tokens
        reps = -(-128 // nt)
        big = [t for _ in range(reps) for t in toks]
        xb = torch.cat([xt] * reps)
        mb = K.slot_meta(torch.tensor(big, dtype=torch.int32), S2, device)
        results["slot_shrink_large"] = (K.slot_shrink(xb, a2, mb), K.slot_shrink_ref(f32(xb), f32(a2), big))
    rows = []
    for kernel, (got, ref) in results.items():
        got = f32(got).cpu()
        ref = ref.cpu()
        err = float((got - ref).abs().max()) if got.numel() else 0.0
        ok = bool(got.shape == ref.shape and torch.allclose(got, ref, atol=atol, rtol=rtol))
        rows.append({"case": case["name"], "kernel": kernel, "dtype": _dtype_name(dtype), "device": device.type,
                     "interpreted": interpreted, "max_abs_err": err,
                     "atol": atol, "ok": ok})
    return rows


def check_kernels(device: torch.device, dtype: torch.dtype = torch.float32, seed: int = 0,
                  cases: Sequence[str] | None = None, rows: list | None = None) -> tuple[list[dict], str]:
    """The :data:`CHECK_CASES` named in ``cases`` (all by default); returns (rows, note). No rows when
    Triton cannot run here. Each case keeps its seed (``seed`` + its index) whichever others run. ``rows``: the
    list each case's rows are appended to as it is checked."""
    rows = [] if rows is None else rows
    usable, why = K.triton_usable(device)
    if not usable:
        return rows, f"kernel check skipped: {why}"
    errors = []
    for i, case in enumerate(CHECK_CASES):
        if cases is not None and case["name"] not in cases:
            continue
        try:
            rows.extend(check_case(case, device, dtype, seed + i))
        except Exception as e:  # a kernel that does not compile/run is a failed check, not a crash
            errors.append(f"{case['name']}: {type(e).__name__}: {e}")
            rows.append({"case": case["name"], "kernel": "error", "dtype": _dtype_name(dtype),
                         "device": device.type, "interpreted": K.INTERPRETED,
                         "max_abs_err": float("nan"), "atol": _tolerance(dtype)[0], "ok": False})
    n_bad = sum(not r["ok"] for r in rows)
    worst = max((r["max_abs_err"] for r in rows if r["max_abs_err"] == r["max_abs_err"]), default=float("nan"))
    note = (f"{len(rows) - n_bad}/{len(rows)} kernel checks agree with the torch reference "
            f"({_dtype_name(dtype)}, {why}; max abs err {worst:.2e})")
    if K.INTERPRETED and device.type != "cuda":
        note += f"; interpreted: the small-batch slot shrink ran {K.INTERPRETER_SPLIT_K} split-K programs, not 64"
    if errors:
        note += "; errors: " + " | ".join(errors)
    return rows, note
