"""Adapter movement: disk -> CPU loads, CPU -> GPU slot activation, and raw host-to-device copies.

* ``adapter_load.csv``, ``disk_to_cpu``: the harness writes one adapter per rank as a PEFT-style
  ``adapter_model.safetensors`` (``lora_A`` ``(r, d_in)``, ``lora_B`` ``(d_out, r)`` for every
  layer and target module; total size exactly :meth:`ModelSpec.adapter_bytes`) and times
  ``safetensors.torch.load_file`` to CPU. Before each load the file is dropped from the page
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
"""

from __future__ import annotations

import json
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from calibration.bench import require
from calibration.bench.config import BenchConfig
from calibration.bench.timing import stats, sync, time_wall
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


def run_adapter_loads(cfg: BenchConfig, device: torch.device, log=print) -> tuple[list[dict], dict]:
    """disk_to_cpu and cpu_to_gpu rows for every rank; returns (rows, info)."""
    st = require("safetensors.torch", "safetensors")
    adir = cfg.out / "adapters"
    rows: list[dict] = []
    info = {"adapter_dir": str(adir), "page_cache": None, "files": {}}
    cpu = torch.device("cpu")
    pinned = device.type == "cuda"
    common = dict(model=cfg.spec.name, max_lora_rank=cfg.max_lora_rank, adapter_slots=1,
                  max_cpu_loras=len(cfg.ranks), phase="serving", raw_path=f"bench:{device.type}",
                  device=device.type)
    try:
        paths = {}
        for rank in cfg.ranks:
            paths[rank] = write_adapter(cfg, rank, adir / f"rank_{rank}")
            info["files"][rank] = {"path": str(paths[rank][0]), "bytes": paths[rank][1]}
        for rank in cfg.ranks:
            path, nbytes = paths[rank]
            dropped = [False]

            def before():
                if cfg.cold_cache:
                    dropped[0] = drop_page_cache(path)

            loaded: dict[str, torch.Tensor] = {}

            def load():
                loaded.clear()
                loaded.update(st.load_file(str(path), device="cpu"))

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
def _time_streams(dsts, srcs, streams, warmup: int, repeats: int) -> np.ndarray:
    """Concurrent async copies on separate CUDA streams, timed with CUDA events (ms)."""
    main = torch.cuda.current_stream()

    def once():
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        done = []
        start.record(main)
        for d, s, stream in zip(dsts, srcs, streams):
            stream.wait_event(start)
            with torch.cuda.stream(stream):
                d.copy_(s, non_blocking=True)
            ev = torch.cuda.Event()
            ev.record(stream)
            done.append(ev)
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


def _time_threads(dsts, srcs, device: torch.device, pool: ThreadPoolExecutor | None,
                  warmup: int, repeats: int) -> np.ndarray:
    """Concurrent copies, one host thread each (one copy: the calling thread); wall time (ms)."""
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

    return time_wall(run, device, warmup, repeats)


def run_h2d_copies(cfg: BenchConfig, device: torch.device, log=print) -> list[dict]:
    """Flat adapter-sized copies for every rank x memory kind x concurrency."""
    cuda = device.type == "cuda"
    sizes = {r: cfg.adapter_bytes(r) for r in cfg.ranks}
    max_bytes, max_c = max(sizes.values()), max(cfg.concurrency)
    memories = ("pinned", "pageable") if cuda else ("pageable",)
    dsts = [torch.empty(max_bytes, dtype=torch.uint8, device=device) for _ in range(max_c)]
    rows: list[dict] = []
    pool = ThreadPoolExecutor(max_workers=max_c) if max_c > 1 else None
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
                    stt = stats(ms)
                    rows.append({"adapter_rank": rank, "bytes": nbytes, "memory": memory, "concurrent": c,
                                 "time_ms_mean": stt["mean"], "time_ms_std": stt["std"],
                                 "gbps": c * nbytes / (stt["mean"] / 1e3) / 1e9 if stt["mean"] > 0 else float("nan"),
                                 "device": device.type, "model": cfg.spec.name, "repeats": len(ms),
                                 "time_ms_min": stt["min"], "timer": timer})
                log(f"  h2d_copy {memory} rank={rank} ({nbytes / 2**20:.2f} MiB): "
                    + ", ".join(f"x{r['concurrent']} {r['gbps']:.1f} GB/s" for r in rows
                                if r["adapter_rank"] == rank and r["memory"] == memory))
            del srcs
            sync(device)
    finally:
        if pool is not None:
            pool.shutdown(wait=True)
    return rows
