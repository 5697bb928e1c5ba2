"""Runs the bench parts and writes the tables (see :mod:`calibration.bench.schema`) and bench_meta.json."""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import sys
import time
from pathlib import Path

from calibration.bench import require, require_torch
from calibration.bench.config import BenchConfig
from calibration.bench.schema import (
    ADAPTER_LOAD_COLUMNS, ADAPTER_LOAD_EXTRA, H2D_COPY_COLUMNS, H2D_COPY_EXTRA, KERNEL_CHECK_COLUMNS,
    LINEAR_OPS_COLUMNS, LINEAR_OPS_EXTRA, LORA_KERNEL_COLUMNS, LORA_KERNEL_EXTRA, META_FILE, STEP_BENCH_COLUMNS,
    STEP_BENCH_EXTRA,
)


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _write_table(rows: list[dict], columns: list[str], path: Path) -> None:
    import pandas as pd

    df = pd.DataFrame(rows, columns=columns)
    df.to_csv(path, index=False)


def run_bench(cfg: BenchConfig) -> dict:
    """Run ``cfg.parts`` and write the tables to ``cfg.out``; returns a summary dict."""
    torch = require_torch()
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda, but torch sees no GPU (torch.cuda.is_available() is False); "
                         "use --device cpu")
    if cfg.device == "cpu" and "calibration.bench.kernels" not in sys.modules and not torch.cuda.is_available():
        # Without a GPU the Triton kernels run (for the numerical check) in Triton's interpreter.
        # Triton decides at kernel definition, for the whole process: where a GPU is visible we
        # leave them compiled (the check then runs with --device cuda).
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from calibration.bench import kernels, linear_ops, lora, transfer

    if "load" in cfg.parts:
        require("safetensors.torch", "safetensors")
    log = (lambda *a, **k: None) if cfg.quiet else (lambda msg: print(msg, file=sys.stderr, flush=True))
    device = torch.device(cfg.device)
    dtype = getattr(torch, cfg.dtype)
    torch.manual_seed(cfg.seed)
    threads_before = torch.get_num_threads()
    # One thread by default on the CPU: small eager ops with several OpenMP threads are dominated
    # by thread synchronisation and become wildly noisy (x100) on a shared machine.
    threads = cfg.threads or (1 if device.type == "cpu" else None)
    if threads:
        torch.set_num_threads(threads)
    try:
        return _run(cfg, torch, device, dtype, log, kernels, linear_ops, lora, transfer)
    finally:
        torch.set_num_threads(threads_before)


def _run(cfg: BenchConfig, torch, device, dtype, log, kernels, linear_ops, lora, transfer) -> dict:
    cfg.out.mkdir(parents=True, exist_ok=True)
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else _cpu_name()
    label = "GPU" if device.type == "cuda" else "CPU (torch on the CPU; not GPU figures)"
    log(f"bench: {cfg.spec.name} on {device.type} ({device_name}), {label}; out={cfg.out}")

    meta: dict = {
        "schema": "lora-twin-bench/1",
        "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command_line": cfg.command_line or list(sys.argv),
        "device": device.type,
        "device_name": device_name,
        "figures": label,
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "triton_version": kernels.triton_version(),
        "triton_interpret": kernels.INTERPRETED,
        "safetensors_version": getattr(sys.modules.get("safetensors"), "__version__", None),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_threads": torch.get_num_threads(),
        "load_average_at_start": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "model": cfg.spec.name,
        "base_model": cfg.base_model,
        "small": cfg.small,
        "model_dims": cfg.spec.to_dict(),
        "lora_targets": list(cfg.targets),
        "adapter_bytes": {str(r): cfg.adapter_bytes(r) for r in cfg.ranks},
        "dtype": cfg.dtype,
        "adapter_dtype": cfg.adapter_dtype,
        "repeats": cfg.repeats,
        "warmup": cfg.warmup,
        "load_repeats": cfg.load_repeats,
        "config": cfg.to_dict(),
        "tables": {},
        "notes": [],
        "part_seconds": {},
    }
    ok = True
    tables: list[str] = []

    def finish(part: str, name: str, rows: list[dict], columns: list[str], t0: float) -> None:
        _write_table(rows, columns, cfg.out / name)
        tables.append(name)
        meta["tables"][name] = len(rows)
        meta["part_seconds"][part] = round(time.perf_counter() - t0, 3)

    if "check" in cfg.parts:
        t0 = time.perf_counter()
        check_dtype = torch.float32 if device.type == "cpu" else dtype
        rows, note = lora.check_kernels(device, check_dtype, cfg.seed, cfg.check_cases)
        meta["notes"].append(note)
        log(f"  {note}")
        meta["kernel_check_ok"] = all(r["ok"] for r in rows) if rows else None
        ok = ok and meta["kernel_check_ok"] is not False
        finish("check", "kernel_check.csv", rows, KERNEL_CHECK_COLUMNS, t0)
    if "linear" in cfg.parts:
        t0 = time.perf_counter()
        rows = linear_ops.run_linear_ops(cfg, device, dtype, log)
        finish("linear", "linear_ops.csv", rows, LINEAR_OPS_COLUMNS + LINEAR_OPS_EXTRA, t0)
    if "lora" in cfg.parts:
        t0 = time.perf_counter()
        rows, note = lora.run_lora_kernels(cfg, device, dtype, log)
        meta["notes"].append(note)
        finish("lora", "lora_kernels.csv", rows, LORA_KERNEL_COLUMNS + LORA_KERNEL_EXTRA, t0)
    if "h2d" in cfg.parts:
        t0 = time.perf_counter()
        rows = transfer.run_h2d_copies(cfg, device, log)
        if device.type == "cpu":
            meta["notes"].append("h2d_copy on CPU: copies between two CPU buffers; pinned memory needs CUDA, "
                                 "so only pageable rows")
        finish("h2d", "h2d_copy.csv", rows, H2D_COPY_COLUMNS + H2D_COPY_EXTRA, t0)
    if "load" in cfg.parts:
        t0 = time.perf_counter()
        rows, info = transfer.run_adapter_loads(cfg, device, log)
        meta["adapter_files"] = info
        if device.type == "cpu":
            meta["notes"].append("adapter_load cpu_to_gpu on CPU: copies into a preallocated slot buffer in CPU "
                                 "memory (column device=cpu)")
        finish("load", "adapter_load.csv", rows, ADAPTER_LOAD_COLUMNS + ADAPTER_LOAD_EXTRA, t0)

    if "step" in cfg.parts:
        from calibration.bench import step

        t0 = time.perf_counter()
        rows, note = step.run_steps(cfg, device, dtype, log)
        meta["notes"].append(note)
        log(f"  {note}")
        finish("step", "step_bench.csv", rows, STEP_BENCH_COLUMNS + STEP_BENCH_EXTRA, t0)

    meta["ok"] = ok
    (cfg.out / META_FILE).write_text(json.dumps(meta, indent=1, default=str))
    tables.append(META_FILE)
    log(f"bench: done in {sum(meta['part_seconds'].values()):.1f} s")
    return {"out": str(cfg.out), "tables": tables, "ok": ok, "meta": meta}
