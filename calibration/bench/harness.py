"""Runs the bench parts and writes the tables (see :mod:`calibration.bench.schema`) and bench_meta.json.

A lent GPU runs the bench under ``timeout``, which stops it with SIGTERM (then SIGKILL after ``-k``). So that
such a stop loses nothing already measured, every table is written as it is measured (:class:`TableSink`: one
flushed CSV line per row, a LoRA (module, rank) sweep or a step shape at a time), ``bench_meta.json`` is
rewritten (atomically) before the first part and after each one with every part's status (``pending``,
``running``, ``done``, ``cut_by_time_limit``, ``cut_by_signal``, ``failed``), and SIGTERM / SIGINT raise
:class:`BenchInterrupted` in the main thread: the run then closes the table of the part it was in, marks that
part ``cut_by_signal``, writes the meta with ``interrupted`` and returns; the command exits with ``128 + signal``.
"""

from __future__ import annotations

import csv
import datetime as _dt
import io
import json
import math
import os
import platform
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable

from calibration.bench import require, require_torch
from calibration.bench.config import PARTS, BenchConfig, check_triton_interpret
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


class BenchInterrupted(BaseException):
    """A signal (SIGTERM from ``timeout``, SIGINT) stopped the run; raised by the handler :func:`run_bench` installs.

    A :class:`BaseException`, like :class:`KeyboardInterrupt`, so the parts' ``except Exception`` (a Triton kernel
    that fails to compile is a failed timing, not a crash) and ``except RuntimeError`` do not swallow it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = int(signum)

    @property
    def name(self) -> str:
        try:
            return signal.Signals(self.signum).name
        except ValueError:
            return f"signal {self.signum}"


def _cell(v: Any) -> str:
    """A CSV cell as pandas' ``to_csv`` writes it: empty for None / NaN, ``True``/``False``, ``str`` of numbers."""
    if v is None:
        return ""
    if hasattr(v, "item") and not isinstance(v, (str, bytes)):
        v = v.item()  # numpy scalars
    if isinstance(v, float) and math.isnan(v):
        return ""
    return str(v)


class TableSink(list):
    """The rows of one table, each written to its CSV (one whole line, flushed) as it is appended.

    The parts append their rows to the list they are given as they measure them; this one also writes them, so a
    process killed mid-part leaves every row measured so far in a readable table (header first, whole lines
    only: a line is one ``write`` call, and a signal's exception is raised between bytecodes, never inside it).
    Columns as :func:`pandas.DataFrame.to_csv` writes them: missing keys empty, extra keys ignored."""

    def __init__(self, path: Path, columns: list[str]) -> None:
        super().__init__()
        self.path = Path(path)
        self.columns = list(columns)
        self._f = self.path.open("w", newline="")
        self._write_line(self.columns)

    def _write_line(self, cells: Iterable[Any]) -> None:
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerow(list(cells))
        self._f.write(buf.getvalue())
        self._f.flush()

    def append(self, row: dict) -> None:  # type: ignore[override]
        super().append(row)
        if not self._f.closed:
            self._write_line(_cell(row.get(c)) for c in self.columns)

    def extend(self, rows: Iterable[dict]) -> None:  # type: ignore[override]
        for row in rows:
            self.append(row)

    def close(self) -> None:
        if not self._f.closed:
            self._f.close()


def _write_json(path: Path, data: dict) -> None:
    """Write ``data`` to ``path`` atomically (a SIGKILL mid-write leaves the previous file, never half of one)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    os.replace(tmp, path)


class _SignalGuard:
    """SIGTERM and SIGINT raise :class:`BenchInterrupted` while the bench runs (main thread only: Python runs
    signal handlers there); a second signal during the clean-up is ignored, so the meta still gets written
    (``timeout -k`` ends the process with SIGKILL if it takes too long)."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self) -> None:
        self.received: int | None = None
        self._previous: dict[int, Any] = {}

    def _handler(self, signum: int, frame) -> None:
        if self.received is not None:
            return
        self.received = signum
        raise BenchInterrupted(signum)

    def __enter__(self) -> "_SignalGuard":
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handler)
        return self

    def __exit__(self, *exc) -> None:
        for sig, prev in self._previous.items():
            signal.signal(sig, prev)


def run_bench(cfg: BenchConfig) -> dict:
    """Run ``cfg.parts`` and write the tables to ``cfg.out``; returns a summary dict (``interrupted``: the
    signal and part, when one stopped the run)."""
    check_triton_interpret(cfg.device)
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
        with _SignalGuard() as guard:
            return _run(cfg, torch, device, dtype, log, kernels, linear_ops, lora, transfer, guard)
    finally:
        torch.set_num_threads(threads_before)


def _run(cfg: BenchConfig, torch, device, dtype, log, kernels, linear_ops, lora, transfer,
         guard: _SignalGuard | None = None) -> dict:
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
        #: every part's status, rows and seconds, rewritten as the run goes (module docstring)
        "parts": {p: {"status": "pending"} for p in PARTS if p in cfg.parts},
        "complete": False,
        "interrupted": None,
    }
    ok = True
    tables: list[str] = []
    current: list[str] = []  # the part running now (empty between parts)

    def write_meta() -> None:
        _write_json(cfg.out / META_FILE, meta)

    def run_part(part: str, name: str, columns: list[str], body: Callable[[TableSink, dict], None]) -> None:
        """Run ``body(sink, info)`` with the table's sink; the part's status, rows and seconds go to the meta."""
        t0 = time.perf_counter()
        status = meta["parts"][part]
        sink = TableSink(cfg.out / name, columns)
        tables.append(name)
        meta["tables"][name] = 0
        status.update(status="running", table=name)
        current[:] = [part]
        write_meta()
        info: dict = {}
        try:
            body(sink, info)
        finally:
            sink.close()
            meta["tables"][name] = len(sink)
            meta["part_seconds"][part] = round(time.perf_counter() - t0, 3)
            status.update(rows=len(sink), seconds=meta["part_seconds"][part],
                          **{k: v for k, v in info.items() if k != "cut_by_time_limit"})
        status["status"] = "cut_by_time_limit" if info.get("cut_by_time_limit") else "done"
        current.clear()
        write_meta()

    def check(sink: TableSink, info: dict) -> None:
        nonlocal ok
        check_dtype = torch.float32 if device.type == "cpu" else dtype
        rows, note = lora.check_kernels(device, check_dtype, cfg.seed, cfg.check_cases, rows=sink)
        meta["notes"].append(note)
        log(f"  {note}")
        meta["kernel_check_ok"] = all(r["ok"] for r in rows) if rows else None
        ok = ok and meta["kernel_check_ok"] is not False

    def linear(sink: TableSink, info: dict) -> None:
        linear_ops.run_linear_ops(cfg, device, dtype, log, rows=sink)

    def lora_part(sink: TableSink, info: dict) -> None:
        _, note = lora.run_lora_kernels(cfg, device, dtype, log, rows=sink, info=info)
        meta["notes"].append(note)

    def h2d(sink: TableSink, info: dict) -> None:
        if device.type == "cpu":
            meta["notes"].append("h2d_copy on CPU: copies between two CPU buffers; pinned memory needs CUDA, "
                                 "so only pageable rows; with_compute rows ran the compute job and the copies one "
                                 "after the other (overlap=sequential)")
        transfer.run_h2d_copies(cfg, device, log, rows=sink, dtype=dtype, info=info)
        meta["notes"].append(f"h2d_copy with_compute: a loop of {info.get('compute_job')} GEMMs "
                             f"({info.get('gemm_ms', float('nan')):.3f} ms each) sized to last "
                             f"{transfer.COMPUTE_COVER:g}x the copies alone, overlap={info.get('overlap')}")

    def load(sink: TableSink, info: dict) -> None:
        _, files = transfer.run_adapter_loads(cfg, device, log, rows=sink)
        meta["adapter_files"] = files
        if device.type == "cpu":
            meta["notes"].append("adapter_load cpu_to_gpu on CPU: copies into a preallocated slot buffer in CPU "
                                 "memory (column device=cpu)")

    def step_part(sink: TableSink, info: dict) -> None:
        from calibration.bench import step

        _, note = step.run_steps(cfg, device, dtype, log, rows=sink, info=info)
        meta["notes"].append(note)
        log(f"  {note}")

    bodies = {
        "check": ("kernel_check.csv", KERNEL_CHECK_COLUMNS, check),
        "linear": ("linear_ops.csv", LINEAR_OPS_COLUMNS + LINEAR_OPS_EXTRA, linear),
        "lora": ("lora_kernels.csv", LORA_KERNEL_COLUMNS + LORA_KERNEL_EXTRA, lora_part),
        "h2d": ("h2d_copy.csv", H2D_COPY_COLUMNS + H2D_COPY_EXTRA, h2d),
        "load": ("adapter_load.csv", ADAPTER_LOAD_COLUMNS + ADAPTER_LOAD_EXTRA, load),
        "step": ("step_bench.csv", STEP_BENCH_COLUMNS + STEP_BENCH_EXTRA, step_part),
    }
    write_meta()  # (a meta before the first part: a process killed in it still says what it was)
    try:
        for part in PARTS:
            if part in cfg.parts:
                run_part(part, *bodies[part])
    except BenchInterrupted as e:
        return _interrupted(meta, current, tables, e.signum, e.name, write_meta, log, cfg)
    except BaseException as e:
        if guard is not None and guard.received is not None:  # a signal whose exception a clean-up replaced
            return _interrupted(meta, current, tables, guard.received, BenchInterrupted(guard.received).name,
                                write_meta, log, cfg)
        if current:
            meta["parts"][current[0]]["status"] = "failed"
            meta["parts"][current[0]]["error"] = f"{type(e).__name__}: {e}"[:500]
        meta["ok"] = False
        write_meta()
        raise

    meta["ok"] = ok
    meta["complete"] = True
    write_meta()
    tables.append(META_FILE)
    log(f"bench: done in {sum(meta['part_seconds'].values()):.1f} s")
    return {"out": str(cfg.out), "tables": tables, "ok": ok, "meta": meta}


def _interrupted(meta: dict, current: list[str], tables: list[str], signum: int, name: str, write_meta, log,
                 cfg: BenchConfig) -> dict:
    """Record the signal that stopped the run (and the part it stopped) in the meta; the summary says so."""
    part = current[0] if current else None
    if part is not None:
        meta["parts"][part]["status"] = "cut_by_signal"
    meta["interrupted"] = {"signum": signum, "name": name, "part": part}
    meta["ok"] = False
    meta["notes"].append(f"stopped by {name} during part {part}: its table holds the rows measured until then"
                         if part else f"stopped by {name} between parts")
    write_meta()
    tables.append(META_FILE)
    log(f"bench: stopped by {name} in part {part}; the tables so far and {META_FILE} are written")
    return {"out": str(cfg.out), "tables": tables, "ok": False, "meta": meta, "interrupted": meta["interrupted"]}
