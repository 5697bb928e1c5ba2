"""Adapter movement: disk -> CPU loads, CPU -> GPU slot activation, and raw host-to-device copies.

* ``adapter_load.csv``, ``disk_to_cpu``: the harness writes one adapter per rank as a PEFT-style
  ``adapter_model.safetensors`` (``lora_A`` ``(r, d_in)``, ``lora_B`` ``(d_out, r)`` for every
  layer and target module; total size exactly :meth:`ModelSpec.adapter_bytes`) and times reading
  it into tensors the process owns (:func:`load_adapter_file`: every byte read, not a memory map).
  Before each load the previous load's tensors are released and the file is dropped from the page
  cache (``posix_fadvise(DONTNEED)`` after an ``fsync``; column ``page_cache=dropped``) unless
  ``--warm-cache``; the OS may still keep it, so treat the figures as a lower bound for a cold disk.
* ``adapter_load.csv``, ``cpu_to_gpu``: vLLM's activation of a loaded adapter into a GPU slot:
  zero the slot and copy every ``lora_A``/``lora_B`` into preallocated slot buffers padded to
  ``max_lora_rank`` (``(slots, R_max, d_in)`` / ``(slots, d_out, R_max)``), from pinned host
  memory on a GPU as vLLM does; wall time including the final synchronize. On the CPU the
  "slot" is a buffer in CPU memory (column ``device=cpu``, ``memory=pageable``).
* ``h2d_copy.csv``: one flat buffer of the adapter's bytes per copy, from pinned or pageable
  memory, ``concurrent`` copies at once (link contention). Pinned copies on a GPU: each copy
  on its own CUDA stream, timed with CUDA events from a common start to the last copy's end.
  Pageable copies (and everything on the CPU): one host thread per copy (pageable copies
  block their thread), wall time from the start to the last join; ``concurrent=1`` copies in the
  calling thread. ``gbps`` = ``concurrent * bytes / time``.
* ``h2d_copy.csv``, ``with_compute=True``: the same pinned copies while a compute job (a loop of GEMMs of a
  2,048-token step's MLP up-projection, sized to last :data:`COMPUTE_COVER` times as long as the copies alone)
  runs on another CUDA stream, as vLLM loads an adapter while the model steps. One row per (rank, concurrent):
  the copies' makespan (``time_ms_*``, ``gbps``) and the compute's time with them, each beside its time alone
  in the same repeats (``copy_ms_alone``, ``copy_slowdown``, ``compute_ms_alone``, ``compute_slowdown``);
  ``overlap=cuda_streams``. On the CPU there is no second engine: the job and the pageable copies run one after
  the other (``overlap=sequential``; the slowdowns test the harness, not a device).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from calibration.bench import require
from calibration.bench.config import BenchConfig
from calibration.bench.timing import stats, sync, time_op, time_wall
from twin.model_spec import QKVO

_TORCH_DTYPES = {"float16": torch.float16, "float32": torch.float32, "bfloat16": torch.bfloat16, "int8": torch.int8}


# --------------------------------------------------------------------------------------------
# Adapter files
# --------------------------------------------------------------------------------------------
def _random(shape, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    if dtype.is_floating_point:
        return torch.empty(shape, dtype=dtype).uniform_(-0.01, 0.01, generator=gen)
    return torch.randint(-8, 8, shape, dtype=dtype, generator=gen)


def adapter_tensors(cfg: BenchConfig, rank: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """PEFT-named LoRA weights of one adapter of ``rank`` for the measured model (CPU)."""
    spec, dtype = cfg.spec, _TORCH_DTYPES[cfg.adapter_dtype]
    gen = torch.Generator().manual_seed(seed + rank)
    out = {}
    for layer in range(spec.layers):
        for m in cfg.targets:
            d_in, d_out = spec.module_shape(m)
            parent = "self_attn" if m in QKVO else "mlp"
            prefix = f"base_model.model.model.layers.{layer}.{parent}.{m}"
            out[f"{prefix}.lora_A.weight"] = _random((rank, d_in), dtype, gen)
            out[f"{prefix}.lora_B.weight"] = _random((d_out, rank), dtype, gen)
    return out


def tensors_bytes(tensors: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


def write_adapter(cfg: BenchConfig, rank: int, directory: Path) -> tuple[Path, int]:
    """Write the rank's adapter (safetensors + adapter_config.json), fsync'd; returns (path, bytes)."""
    st = require("safetensors.torch", "safetensors")
    directory.mkdir(parents=True, exist_ok=True)
    tensors = adapter_tensors(cfg, rank, cfg.seed)
    nbytes = tensors_bytes(tensors)
    expected = cfg.adapter_bytes(rank)
    if nbytes != expected:  # the file must hold exactly ModelSpec.adapter_bytes
        raise AssertionError(f"adapter tensors hold {nbytes} B, ModelSpec.adapter_bytes says {expected} B")
    path = directory / "adapter_model.safetensors"
    st.save_file(tensors, str(path), metadata={"format": "pt"})
    (directory / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "lora_dropout": 0.0, "bias": "none",
        "target_modules": list(cfg.targets), "base_model_name_or_path": cfg.spec.name,
        "task_type": "CAUSAL_LM", "note": "random weights written by calibration.bench"}, indent=1))
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return path, nbytes


def drop_page_cache(path: Path) -> bool:
    """Ask the kernel to evict ``path`` from the page cache; False where unsupported."""
    if not hasattr(os, "posix_fadvise"):
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


# --------------------------------------------------------------------------------------------
# adapter_load.csv
# --------------------------------------------------------------------------------------------
def _slot_buffers(cfg: BenchConfig, tensors: dict[str, torch.Tensor], device: torch.device,
                  slots: int = 1) -> dict[str, torch.Tensor]:
    """vLLM-like slot buffers padded to max_lora_rank, one per LoRA tensor name."""
    r_max = cfg.max_lora_rank
    bufs = {}
    for name, t in tensors.items():
        if ".lora_A." in name:  # (r, d_in) -> (slots, R_max, d_in)
            bufs[name] = torch.zeros((slots, r_max, t.shape[1]), dtype=t.dtype, device=device)
        else:  # (d_out, r) -> (slots, d_out, R_max)
            bufs[name] = torch.zeros((slots, t.shape[0], r_max), dtype=t.dtype, device=device)
    return bufs


def _activate(tensors: dict[str, torch.Tensor], bufs: dict[str, torch.Tensor], slot: int = 0) -> None:
    non_blocking = next(iter(bufs.values())).device.type == "cuda"
    for name, t in tensors.items():
        buf = bufs[name]
        buf[slot].zero_()
        if ".lora_A." in name:
            buf[slot, : t.shape[0], :].copy_(t, non_blocking=non_blocking)
        else:
            buf[slot, :, : t.shape[1]].copy_(t, non_blocking=non_blocking)


def load_adapter_file(path: Path | str) -> dict[str, torch.Tensor]:
    """An adapter file's tensors, every byte read into memory the process owns.

    ``safetensors.torch.load_file`` memory-maps the file (``safe_open``) and returns tensors backed by the
    mapping: the call reads no data, the page faults of a later ``pin_memory()`` or copy do. Timing it timed the
    map and the header parse (10-14 ms for 40-640 MiB on the H200, memory speed). ``safetensors.torch.load`` on
    the file's bytes reads the whole file (``read(2)``) and copies each tensor out of the buffer, as a loader that
    must own the weights (vLLM pins them for the GPU copy) pays.
    """
    st = require("safetensors.torch", "safetensors")
    return st.load(Path(path).read_bytes())


def run_adapter_loads(cfg: BenchConfig, device: torch.device, log=print,
                      rows: list | None = None) -> tuple[list[dict], dict]:
    """disk_to_cpu and cpu_to_gpu rows for every rank, appended to ``rows`` (the harness passes a list that writes
    them to the table at once) rank by rank; returns (rows, info)."""
    adir = cfg.out / "adapters"
    rows = [] if rows is None else rows
    info = {"adapter_dir": str(adir), "page_cache": None, "files": {}}
    cpu = torch.device("cpu")
    pinned = device.type == "cuda"
    common = dict(model=cfg.spec.name, max_lora_rank=cfg.max_lora_rank, adapter_slots=1,
                  max_cpu_loras=len(cfg.ranks), phase="serving", raw_path=f"bench:{device.type}",
                  device=device.type, dtype=cfg.adapter_dtype)
    try:
        paths = {}
        for rank in cfg.ranks:
            paths[rank] = write_adapter(cfg, rank, adir / f"rank_{rank}")
            info["files"][rank] = {"path": str(paths[rank][0]), "bytes": paths[rank][1]}
        for rank in cfg.ranks:
            path, nbytes = paths[rank]
            dropped = [False]
            loaded: dict[str, torch.Tensor] = {}

            def before():
                # release the previous load first: its memory back, and no tensor of it left to keep a page of
                # the file resident (a page still mapped by a process is not evicted by POSIX_FADV_DONTNEED)
                loaded.clear()
                if cfg.cold_cache:
                    dropped[0] = drop_page_cache(path)

            def load():
                loaded.update(load_adapter_file(path))

            ms = time_wall(load, cpu, cfg.warmup and 1, cfg.load_repeats, before=before)
            page_cache = "dropped" if dropped[0] else "warm"
            info["page_cache"] = page_cache
            for i, v in enumerate(ms, 1):
                rows.append(dict(common, adapter_rank=rank, load_kind="disk_to_cpu", load_index=i, load_ms=float(v),
                                 bytes=nbytes, memory="disk", page_cache=page_cache))
            src = {k: (t.pin_memory() if pinned else t) for k, t in loaded.items()}
            bufs = _slot_buffers(cfg, src, device)
            ms = time_wall(lambda: _activate(src, bufs), device, cfg.warmup, cfg.load_repeats)
            for i, v in enumerate(ms, 1):
                rows.append(dict(common, adapter_rank=rank, load_kind="cpu_to_gpu", load_index=i, load_ms=float(v),
                                 bytes=nbytes, memory="pinned" if pinned else "pageable", page_cache=""))
            log(f"  adapter_load rank={rank} ({nbytes / 2**20:.2f} MiB): disk->cpu "
                f"{np.mean([r['load_ms'] for r in rows if r['adapter_rank'] == rank and r['load_kind'] == 'disk_to_cpu']):.3f} ms, "
                f"cpu->{device.type} {float(np.mean(ms)):.3f} ms")
    finally:
        if not cfg.keep_adapters:
            shutil.rmtree(adir, ignore_errors=True)
    return rows, info


# --------------------------------------------------------------------------------------------
# h2d_copy.csv
# --------------------------------------------------------------------------------------------
#: the ``with_compute`` rows' compute job lasts this many times the copies alone: the copies run inside it
#: even when contention slows them (up to this factor; ``copy_slowdown`` says by how much)
COMPUTE_COVER = 2.0
#: tokens of the compute job's GEMM ``(T, hidden) @ (hidden, intermediate)``: a 2,048-token step on a GPU
COMPUTE_TOKENS = {"cuda": 2048, "cpu": 64}
#: at most this many GEMMs in the job (a bound for a very slow device)
MAX_GEMMS = 4000
#: the spin that holds the main stream while the host enqueues both streams' work (``torch.cuda._sleep``):
#: ~1 ms at 2 GHz, plus ~20 us per launch
GATE_CYCLES = 2_000_000
GATE_CYCLES_PER_LAUNCH = 40_000


class ComputeJob:
    """The ``with_compute`` rows' compute: ``n`` GEMMs ``x @ w`` of the model's MLP up-projection over
    :data:`COMPUTE_TOKENS` tokens, in the run's dtype, into one preallocated output (no allocation while timed)."""

    def __init__(self, cfg: BenchConfig, device: torch.device, dtype: torch.dtype) -> None:
        tokens = COMPUTE_TOKENS["cuda" if device.type == "cuda" else "cpu"]
        h, inter = cfg.spec.hidden, cfg.spec.intermediate
        gen = torch.Generator(device=device).manual_seed(cfg.seed + 3)
        self.x = torch.empty((tokens, h), device=device, dtype=dtype).normal_(0.0, 1.0, generator=gen)
        self.w = torch.empty((h, inter), device=device, dtype=dtype).normal_(0.0, h ** -0.5, generator=gen)
        self.out = torch.empty((tokens, inter), device=device, dtype=dtype)
        self.n = 1
        self.label = f"{tokens}x{h} @ {h}x{inter} {str(dtype).replace('torch.', '')}"

    def one(self) -> None:
        torch.matmul(self.x, self.w, out=self.out)

    def __call__(self) -> None:
        for _ in range(self.n):
            self.one()

    def size_for(self, target_ms: float, gemm_ms: float) -> int:
        """Set ``n`` so the job lasts about ``target_ms`` at ``gemm_ms`` per GEMM; returns it."""
        self.n = int(min(MAX_GEMMS, max(1, math.ceil(target_ms / max(gemm_ms, 1e-6)))))
        return self.n


def _enqueue_copies(dsts, srcs, streams, start) -> list:
    """Each copy ``src -> dst`` on its own stream, after the ``start`` event: the copies' completion events."""
    done = []
    for d, s, stream in zip(dsts, srcs, streams):
        stream.wait_event(start)
        with torch.cuda.stream(stream):
            d.copy_(s, non_blocking=True)
        ev = torch.cuda.Event()
        ev.record(stream)
        done.append(ev)
    return done


def _time_streams(dsts, srcs, streams, warmup: int, repeats: int) -> np.ndarray:
    """Concurrent async copies on separate CUDA streams, timed with CUDA events (ms)."""
    main = torch.cuda.current_stream()

    def once():
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record(main)
        done = _enqueue_copies(dsts, srcs, streams, start)
        for ev in done:
            main.wait_event(ev)
        end.record(main)
        return start, end

    for _ in range(warmup):
        once()
    torch.cuda.synchronize()
    pairs = []
    for _ in range(repeats):
        pairs.append(once())
        torch.cuda.synchronize()
    return np.array([s.elapsed_time(e) for s, e in pairs], dtype=float)


def _time_copies_with_compute_cuda(dsts, srcs, copy_streams, job: ComputeJob, compute_stream,
                                   warmup: int, repeats: int) -> dict[str, np.ndarray]:
    """Per repeat, on a GPU: the copies alone, the compute job alone, then both at once (the copies on their
    streams, the job on ``compute_stream``), each from a common start event; returns ms arrays ``copy_alone``,
    ``compute_alone``, ``copy_with``, ``compute_with``.

    Every event is recorded on the current (main) stream: after the start event the other streams wait on it;
    then the main stream waits on the copies' completion events and records the copies' end, then waits on the
    job's and records its end (a stream runs its work in order, so the first end fires when the copies are done
    whatever the job is doing). Before the start event a spin kernel (``torch.cuda._sleep``) holds the main
    stream while the host enqueues both streams' work, so both start at the start event rather than when the
    host reaches them; the copies are enqueued first in case that private helper is absent."""
    main = torch.cuda.current_stream()
    gate = getattr(torch.cuda, "_sleep", None)

    def once(copies: bool, compute: bool) -> tuple[float, float]:
        if gate is not None:
            gate(int(GATE_CYCLES + GATE_CYCLES_PER_LAUNCH * ((len(dsts) if copies else 0) + (job.n if compute else 0))))
        start = torch.cuda.Event(enable_timing=True)
        start.record(main)
        copy_done = _enqueue_copies(dsts, srcs, copy_streams, start) if copies else []
        compute_done = None
        if compute:
            compute_stream.wait_event(start)
            with torch.cuda.stream(compute_stream):
                job()
            compute_done = torch.cuda.Event()
            compute_done.record(compute_stream)
        copy_end = compute_end = None
        if copies:
            for ev in copy_done:
                main.wait_event(ev)
            copy_end = torch.cuda.Event(enable_timing=True)
            copy_end.record(main)
        if compute:
            main.wait_event(compute_done)
            compute_end = torch.cuda.Event(enable_timing=True)
            compute_end.record(main)
        torch.cuda.synchronize()
        return (start.elapsed_time(copy_end) if copy_end is not None else float("nan"),
                start.elapsed_time(compute_end) if compute_end is not None else float("nan"))

    return _alone_then_both(once, warmup, repeats)


def _alone_then_both(once: Callable[[bool, bool], tuple[float, float]], warmup: int,
                     repeats: int) -> dict[str, np.ndarray]:
    """``once(copies, compute) -> (copy ms, compute ms)`` per repeat: copies alone, compute alone, both."""
    out = {k: np.empty(repeats, dtype=float) for k in ("copy_alone", "compute_alone", "copy_with", "compute_with")}
    for i in range(-max(warmup, 1), repeats):  # (at least one untimed round: first-call set-up, cuBLAS handles)
        ca = once(True, False)[0]
        pa = once(False, True)[1]
        cw, pw = once(True, True)
        if i >= 0:
            out["copy_alone"][i], out["compute_alone"][i], out["copy_with"][i], out["compute_with"][i] = ca, pa, cw, pw
    return out


def _time_copies_with_compute_sequential(copy_fn: Callable[[], object], job: ComputeJob, device: torch.device,
                                         warmup: int, repeats: int) -> dict[str, np.ndarray]:
    """The CPU's stand-in for :func:`_time_copies_with_compute_cuda`: no second engine, so "both" runs the job
    and then the copies, each timed with ``time.perf_counter`` (``overlap=sequential``)."""
    def timed(fn: Callable[[], object]) -> float:
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        return (time.perf_counter() - t0) * 1e3

    def once(copies: bool, compute: bool) -> tuple[float, float]:
        pw = timed(job) if compute else float("nan")
        cw = timed(copy_fn) if copies else float("nan")
        return cw, pw

    return _alone_then_both(once, warmup, repeats)


def _copy_runner(dsts, srcs, device: torch.device, pool: ThreadPoolExecutor | None) -> Callable[[], None]:
    """Concurrent copies, one host thread each (one copy: the calling thread), each synchronized on a GPU."""
    cuda = device.type == "cuda"
    streams = [torch.cuda.Stream() for _ in dsts] if cuda else [None] * len(dsts)

    def one(i):
        if cuda:
            with torch.cuda.stream(streams[i]):
                dsts[i].copy_(srcs[i], non_blocking=True)
            streams[i].synchronize()
        else:
            dsts[i].copy_(srcs[i])

    def run():
        if len(dsts) == 1 or pool is None:
            for i in range(len(dsts)):
                one(i)
        else:
            for f in [pool.submit(one, i) for i in range(len(dsts))]:
                f.result()

    return run


def _time_threads(dsts, srcs, device: torch.device, pool: ThreadPoolExecutor | None,
                  warmup: int, repeats: int) -> np.ndarray:
    """Concurrent copies, one host thread each (one copy: the calling thread); wall time (ms)."""
    return time_wall(_copy_runner(dsts, srcs, device, pool), device, warmup, repeats)


def _copy_row(cfg: BenchConfig, device: torch.device, rank: int, nbytes: int, memory: str, c: int, ms: np.ndarray,
              timer: str, dtype: torch.dtype) -> dict:
    stt = stats(ms)
    return {"adapter_rank": rank, "bytes": nbytes, "memory": memory, "concurrent": c,
            "time_ms_mean": stt["mean"], "time_ms_std": stt["std"],
            "gbps": c * nbytes / (stt["mean"] / 1e3) / 1e9 if stt["mean"] > 0 else float("nan"),
            "device": device.type, "model": cfg.spec.name, "repeats": len(ms),
            "time_ms_min": stt["min"], "timer": timer, "dtype": str(dtype).replace("torch.", ""),
            "with_compute": False, "overlap": ""}


def _with_compute_row(base: dict, t: dict[str, np.ndarray], job: ComputeJob, overlap: str) -> dict:
    """A ``with_compute`` row: the copies' makespan with the job running, and both beside their times alone."""
    row = dict(base)
    copy_alone, compute_alone = float(np.mean(t["copy_alone"])), float(np.mean(t["compute_alone"]))
    compute_with = float(np.mean(t["compute_with"]))
    row.update(with_compute=True, overlap=overlap, copy_ms_alone=copy_alone,
               copy_slowdown=row["time_ms_mean"] / copy_alone if copy_alone > 0 else float("nan"),
               compute_ms=compute_with, compute_ms_alone=compute_alone,
               compute_slowdown=compute_with / compute_alone if compute_alone > 0 else float("nan"),
               compute_gemms=job.n)
    return row


def run_h2d_copies(cfg: BenchConfig, device: torch.device, log=print, rows: list | None = None,
                   dtype: torch.dtype | None = None, info: dict | None = None) -> list[dict]:
    """Flat adapter-sized copies for every rank x memory kind x concurrency, then (pinned on a GPU, pageable on
    the CPU) the same copies alongside the compute job (``with_compute``); appended to ``rows`` (the harness
    passes a list that writes them to the table at once) as they are measured. ``dtype``: the compute job's
    (default: the run's ``cfg.dtype``); ``info`` receives the job's shape and how it overlapped."""
    cuda = device.type == "cuda"
    dtype = dtype or getattr(torch, cfg.dtype)
    sizes = {r: cfg.adapter_bytes(r) for r in cfg.ranks}
    max_bytes, max_c = max(sizes.values()), max(cfg.concurrency)
    memories = ("pinned", "pageable") if cuda else ("pageable",)
    with_memory = "pinned" if cuda else "pageable"  # vLLM keeps its CPU adapters pinned where it can
    overlap = "cuda_streams" if cuda else "sequential"
    dsts = [torch.empty(max_bytes, dtype=torch.uint8, device=device) for _ in range(max_c)]
    rows = [] if rows is None else rows
    pool = ThreadPoolExecutor(max_workers=max_c) if max_c > 1 else None
    job = ComputeJob(cfg, device, dtype)
    gemm_ms = float(np.median(time_op(job.one, device, 2, 5, flush=False)))
    compute_stream = torch.cuda.Stream() if cuda else None
    if info is not None:
        info.update(compute_job=job.label, gemm_ms=gemm_ms, overlap=overlap, compute_cover=COMPUTE_COVER)
    try:
        for memory in memories:
            srcs = [torch.empty(max_bytes, dtype=torch.uint8, pin_memory=(memory == "pinned")) for _ in range(max_c)]
            for s in srcs:
                s.fill_(1)  # touch the pages
            streams = [torch.cuda.Stream() for _ in range(max_c)] if cuda else []
            for rank, nbytes in sizes.items():
                for c in cfg.concurrency:
                    d = [t[:nbytes] for t in dsts[:c]]
                    s = [t[:nbytes] for t in srcs[:c]]
                    if cuda and memory == "pinned":
                        ms, timer = _time_streams(d, s, streams[:c], cfg.warmup, cfg.repeats), "cuda_event"
                    else:
                        ms, timer = _time_threads(d, s, device, pool, cfg.warmup, cfg.repeats), "perf_counter"
                    base = _copy_row(cfg, device, rank, nbytes, memory, c, ms, timer, dtype)
                    rows.append(base)
                    if memory != with_memory:
                        continue
                    job.size_for(COMPUTE_COVER * base["time_ms_mean"], gemm_ms)
                    if cuda:
                        t = _time_copies_with_compute_cuda(d, s, streams[:c], job, compute_stream, cfg.warmup,
                                                           cfg.repeats)
                    else:
                        t = _time_copies_with_compute_sequential(_copy_runner(d, s, device, pool), job, device,
                                                                 cfg.warmup, cfg.repeats)
                    with_row = _copy_row(cfg, device, rank, nbytes, memory, c, t["copy_with"], timer, dtype)
                    rows.append(_with_compute_row(with_row, t, job, overlap))
                log(f"  h2d_copy {memory} rank={rank} ({nbytes / 2**20:.2f} MiB): "
                    + ", ".join(f"x{r['concurrent']}{' +compute' if r['with_compute'] else ''} {r['gbps']:.1f} GB/s"
                                + (f" (compute x{r['compute_slowdown']:.2f})" if r["with_compute"] else "")
                                for r in rows if r["adapter_rank"] == rank and r["memory"] == memory))
            del srcs
            sync(device)
    finally:
        if pool is not None:
            pool.shutdown(wait=True)
    return rows
