"""The bench harness under a time-boxed, lent GPU: copies beside compute, incremental tables and SIGTERM, real disk
loads, the LoRA sweep's order and skips, the GPU defaults' time limits, and the TRITON_INTERPRET refusal."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch", reason="torch is the optional calibration extra: pip install -e '.[calibration]'")
pd = pytest.importorskip("pandas")

import torch  # noqa: E402

from calibration.bench.cli import build_parser, main  # noqa: E402
from calibration.bench.config import GPU_DEFAULTS, check_triton_interpret, resolve_config  # noqa: E402
from calibration.bench.schema import H2D_COPY_COLUMNS, H2D_COPY_EXTRA, META_FILE  # noqa: E402
from calibration.bench.timing import TimeBudget  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
H200 = ROOT / "results" / "calibration" / "bench_h200"
CPU = torch.device("cpu")


def _cfg(tmp_path, *extra: str, device: str = "cpu"):
    args = build_parser().parse_args(["--device", device, "--out", str(tmp_path / "b"), "--quiet", *extra])
    return resolve_config(args, cuda_available=device == "cuda")


# ---------------------------------------------------------------- 1. copies beside a compute job
def test_h2d_with_compute_rows_on_cpu_run_sequentially_and_say_so(tmp_path):
    from calibration.bench.transfer import run_h2d_copies

    cfg = _cfg(tmp_path, "--model-dims", "llama-3.1-8b", "--ranks", "8,16", "--concurrency", "1,2", "--repeats", "2",
               "--warmup", "0")
    info: dict = {}
    rows = run_h2d_copies(cfg, CPU, log=lambda m: None, info=info)
    df = pd.DataFrame(rows, columns=H2D_COPY_COLUMNS + H2D_COPY_EXTRA)
    alone, both = df[~df.with_compute.astype(bool)], df[df.with_compute.astype(bool)]
    # one copies-alone row and one with-compute row per (rank, concurrent)
    assert sorted(zip(alone.adapter_rank, alone.concurrent)) == sorted(zip(both.adapter_rank, both.concurrent)) \
        == [(8, 1), (8, 2), (16, 1), (16, 2)]
    assert (both.overlap == "sequential").all() and (alone.overlap == "").all() and info["overlap"] == "sequential"
    for col in ("copy_ms_alone", "compute_ms", "compute_ms_alone", "compute_slowdown", "copy_slowdown"):
        assert (both[col] > 0).all() and np.isfinite(both[col]).all(), col
        assert alone[col].isna().all(), col
    assert np.allclose(both.compute_slowdown, both.compute_ms / both.compute_ms_alone)
    assert np.allclose(both.copy_slowdown, both.time_ms_mean / both.copy_ms_alone)
    assert (both.compute_gemms >= 1).all() and (df.dtype == "float32").all()
    assert np.allclose(df.gbps, df.concurrent * df.bytes / (df.time_ms_mean / 1e3) / 1e9)


def test_h2d_with_compute_on_a_gpu_overlaps_the_streams_and_times_on_the_main_one(tmp_path, monkeypatch):
    """The CUDA path without a GPU: torch.cuda's streams and events replaced by recorders (the work itself runs on
    CPU tensors). The main stream is held (the spin) before the start event; the copies and the GEMMs are enqueued
    on their own streams, each waiting on the start; every timing event is recorded on the main stream, the copies'
    end after waiting on the copies only, the job's after waiting on it; each repeat times copies alone, the job
    alone and both."""
    from calibration.bench import transfer as T

    log: list[tuple] = []

    class Stream:
        def __init__(self, name):
            self.name = name

        def wait_event(self, ev):
            log.append(("wait", self.name, ev.name))

    main_stream = Stream("main")
    current = [main_stream]
    names = iter(range(10**6))

    class Event:
        def __init__(self, enable_timing=False):
            self.timing, self.t, self.name = enable_timing, None, next(names)

        def record(self, stream=None):
            stream = stream or current[0]
            log.append(("record", stream.name, self.name, self.timing))
            self.t = time.perf_counter()

        def elapsed_time(self, other):
            assert self.timing and other.timing
            return (other.t - self.t) * 1e3

    @contextmanager
    def stream(s):
        prev, current[0] = current[0], s
        try:
            yield
        finally:
            current[0] = prev

    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: current[0])
    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "stream", stream)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: log.append(("sync",)))
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: log.append(("spin", current[0].name, cycles)))

    cfg = _cfg(tmp_path)
    job = T.ComputeJob(cfg, CPU, torch.float32)
    one = job.one
    monkeypatch.setattr(job, "one", lambda: (log.append(("gemm", current[0].name)), one()))
    job.size_for(3.0, 1.0)
    dsts = [torch.zeros(1000, dtype=torch.uint8) for _ in range(2)]
    srcs = [torch.ones(1000, dtype=torch.uint8) for _ in range(2)]
    t = T._time_copies_with_compute_cuda(dsts, srcs, [Stream("copy0"), Stream("copy1")], job, Stream("compute"),
                                         warmup=1, repeats=2)
    assert all(d.eq(1).all() for d in dsts)
    assert set(t) == {"copy_alone", "compute_alone", "copy_with", "compute_with"}
    assert all(len(v) == 2 and np.isfinite(v).all() and (v >= 0).all() for v in t.values())
    assert {e[1] for e in log if e[0] == "gemm"} == {"compute"}  # the job runs on its own stream only
    assert all(e[1] == "main" for e in log if e[0] == "record" and e[3])  # every timing event on the main stream
    rounds = [i for i, e in enumerate(log) if e[0] == "spin"]
    assert len(rounds) == 3 * 3  # (1 warm-up + 2 repeats) x (copies alone, job alone, both)
    both = log[rounds[2]:rounds[3]]  # the first "both" round
    start = both[1][2]
    assert both[1][:2] == ("record", "main") and both[0][2] > T.GATE_CYCLES  # spin, then the start event
    waits = [e[1] for e in both if e[0] == "wait" and e[2] == start]
    assert waits == ["copy0", "copy1", "compute"]  # copies enqueued first, each stream waits on the start
    main_ops = [e for e in both if e[0] in ("wait", "record") and e[1] == "main"][1:]
    copy_done = [e[2] for e in both if e[0] == "record" and e[1] in ("copy0", "copy1")]
    job_done = next(e[2] for e in both if e[0] == "record" and e[1] == "compute")
    assert [e[2] for e in main_ops[:2]] == copy_done and main_ops[2][0] == "record"  # the copies' end
    assert main_ops[3][:3] == ("wait", "main", job_done) and main_ops[4][0] == "record"  # then the job's end


def test_transfer_report_reads_the_old_h200_table_and_the_new_rows(tmp_path, capsys):
    from calibration.bench.transfer import run_h2d_copies
    from calibration.bench.transfer_report import h2d_markdown, h2d_summary, main as report_main, read_h2d_table

    old = read_h2d_table(H200 / "linear_h2d_load")  # written before with_compute: every row a copy alone
    assert not old.with_compute.any() and len(old) == 30
    s = h2d_summary(old).set_index(["memory", "concurrent"])
    # the figures results/calibration/bench_h200/README.md states (section 3)
    assert f"{s.loc[('pinned', 2), 'makespan_over_one_min']:.2f}-{s.loc[('pinned', 2), 'makespan_over_one_max']:.2f}" \
        == "1.95-1.99"
    assert f"{s.loc[('pinned', 4), 'makespan_over_one_min']:.2f}" == "3.76"
    cfg = _cfg(tmp_path, "--ranks", "8", "--concurrency", "1", "--repeats", "1", "--warmup", "0")
    d = tmp_path / "new"
    d.mkdir()
    pd.DataFrame(run_h2d_copies(cfg, CPU, log=lambda m: None),
                 columns=H2D_COPY_COLUMNS + H2D_COPY_EXTRA).to_csv(d / "h2d_copy.csv", index=False)
    new = read_h2d_table(d)
    assert new.with_compute.tolist() == [False, True]
    assert "| pageable | 1 | yes |" in h2d_markdown(new) and "sequential" in h2d_markdown(new)
    assert report_main([str(d)]) == 0 and "+compute" in capsys.readouterr().out
    assert report_main([str(tmp_path)]) == 2 and "no h2d_copy.csv" in capsys.readouterr().err


# ---------------------------------------------------------------- 2. incremental tables, limits, SIGTERM
def test_time_budget_stops_before_a_unit_that_would_end_past_the_limit():
    now = [0.0]
    b = TimeBudget(10.0, clock=lambda: now[0])
    assert b.next_fits()  # the first unit always runs
    now[0] = 4.0
    assert b.next_fits()  # 4 s spent + 4 s for the next = 8 <= 10
    now[0] = 8.0
    assert not b.next_fits() and b.stopped_at == 2  # 8 + 4 > 10: stopped before, not after, overrunning
    free = TimeBudget(None, clock=lambda: now[0])
    assert all(free.next_fits() for _ in range(5)) and not free.stopped


def test_table_sink_writes_each_row_at_once_as_pandas_would(tmp_path):
    from calibration.bench.harness import TableSink

    cols = ["a", "b", "c", "d"]
    rows = [{"a": 1, "b": 0.1, "c": None, "d": True}, {"a": np.int64(2), "b": float("nan"), "c": "x,y", "d": False,
                                                        "extra": 5}]
    sink = TableSink(tmp_path / "t.csv", cols)
    sink.append(rows[0])
    assert pd.read_csv(tmp_path / "t.csv").shape == (1, 4)  # on disk before the part ends
    sink.extend(rows[1:])
    sink.close()
    pd.DataFrame(rows, columns=cols).to_csv(tmp_path / "p.csv", index=False)
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "t.csv"), pd.read_csv(tmp_path / "p.csv"))
    assert len(sink) == 2


def test_parts_cut_by_their_time_limit_say_so_in_the_meta(tmp_path):
    out = tmp_path / "b"
    assert main(["--device", "cpu", "--parts", "linear,step", "--tokens", "1", "--step-decodes", "0,4",
                 "--step-context", "16,32", "--step-repeats", "1", "--step-warmup", "0", "--step-time-limit", "1e-9",
                 "--out", str(out), "--quiet"]) == 0
    meta = json.loads((out / META_FILE).read_text())
    assert meta["complete"] and meta["interrupted"] is None
    assert meta["parts"]["linear"]["status"] == "done" and meta["parts"]["linear"]["rows"] == 1
    step = meta["parts"]["step"]
    assert step["status"] == "cut_by_time_limit" and step["units_done"] == 1 < step["units"] and step["rows"] == 1


def test_sigterm_mid_part_keeps_the_rows_so_far_and_a_meta_bench_report_reads(tmp_path):
    """A bench stopped by `timeout` (SIGTERM) in the middle of its step part: the step rows measured so far are in
    step_bench.csv, the finished part's table is whole, bench_meta.json says which part the signal cut, the exit
    status is 128 + SIGTERM, and `twin calibrate bench-report` reads the partial table."""
    from twin.cli import main as twin_main

    out = tmp_path / "b"
    env = {k: v for k, v in os.environ.items()}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.Popen([sys.executable, "-m", "calibration.bench", "--device", "cpu", "--small", "--parts",
                             "linear,step", "--tokens", "1,8", "--step-decodes", "0,4,16", "--step-context",
                             "64,256,512", "--step-repeats", "150", "--step-warmup", "0", "--out", str(out)],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    table = out / "step_bench.csv"
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if table.is_file() and len(table.read_text().splitlines()) > 10:  # header + 10 shapes
                break
            time.sleep(0.05)
        assert proc.poll() is None, f"the bench ended before the signal: {proc.communicate()[1][-2000:]}"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert "stopped by SIGTERM in part step" in err
    meta = json.loads((out / META_FILE).read_text())
    assert meta["interrupted"] == {"signum": int(signal.SIGTERM), "name": "SIGTERM", "part": "step"}
    assert meta["parts"]["linear"]["status"] == "done" and meta["parts"]["step"]["status"] == "cut_by_signal"
    assert not meta["complete"] and not meta["ok"]
    df = pd.read_csv(table)
    assert 10 <= len(df) == meta["tables"]["step_bench.csv"] == meta["parts"]["step"]["rows"]
    assert len(pd.read_csv(out / "linear_ops.csv")) == 2
    assert twin_main(["calibrate", "bench-report", str(out)]) == 0


# ---------------------------------------------------------------- 3. disk loads read the bytes
def _mapped(path: Path) -> list[tuple[int, int]]:
    spans = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        if line.rstrip().endswith(str(path)):
            lo, hi = line.split()[0].split("-")
            spans.append((int(lo, 16), int(hi, 16)))
    return spans


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads the process's mappings from /proc")
def test_disk_load_reads_every_byte_and_releases_the_previous_load_before_the_drop(tmp_path, monkeypatch):
    st = pytest.importorskip("safetensors.torch", reason="safetensors is the optional calibration extra")
    from calibration.bench import transfer as T

    cfg = _cfg(tmp_path, "--ranks", "8,16", "--load-repeats", "3", "--warmup", "1")
    path, _ = T.write_adapter(cfg, 8, tmp_path / "a")
    lazy = st.load_file(str(path))  # what the timed call was: tensors backed by the file's mapping
    assert _mapped(path) and all(any(lo <= t.untyped_storage().data_ptr() < hi for lo, hi in _mapped(path))
                                 for t in lazy.values())
    del lazy
    owned = T.load_adapter_file(path)
    spans = _mapped(path)
    assert not any(lo <= t.untyped_storage().data_ptr() < hi for t in owned.values() for lo, hi in spans)
    assert set(owned) == set(st.load_file(str(path)))
    del owned

    mapped_at_drop = []

    def drop(p):
        mapped_at_drop.append(bool(_mapped(p)))  # a page still mapped would not be evicted
        return True

    monkeypatch.setattr(T, "drop_page_cache", drop)
    rows, _ = T.run_adapter_loads(cfg, CPU, log=lambda m: None)
    assert len(mapped_at_drop) == 2 * (1 + 3) and not any(mapped_at_drop)
    assert {r["page_cache"] for r in rows if r["load_kind"] == "disk_to_cpu"} == {"dropped"}


# ---------------------------------------------------------------- 4. the LoRA sweep's order, skips, references
def test_lora_pairs_run_in_an_order_whose_every_prefix_covers_ranks_and_shapes_evenly(tmp_path):
    from calibration.bench.lora import module_shapes, plan_pairs

    cfg = _cfg(tmp_path, "--model-dims", "llama-3.1-8b", "--parts", "lora", device="cuda")
    pairs, skipped = plan_pairs(cfg)
    shapes = [(a, b) for _, a, b in module_shapes(cfg)]
    assert not skipped and len(pairs) == len(set(pairs)) == len(shapes) * len(cfg.ranks) == 20
    assert [p[3] for p in pairs[:5]] == [8, 16, 32, 64, 128]  # each rank once first
    assert {(p[1], p[2]) for p in pairs[:4]} == set(shapes)  # and every shape (k/v included) among them
    for k in range(1, len(pairs) + 1):
        ranks = pd.Series([p[3] for p in pairs[:k]]).value_counts().reindex(cfg.ranks, fill_value=0)
        sh = pd.Series([(p[1], p[2]) for p in pairs[:k]]).value_counts().reindex(shapes, fill_value=0)
        assert ranks.max() - ranks.min() <= 1 and sh.max() - sh.min() <= 1, k


def test_skip_measured_drops_the_committed_pairs_and_starts_with_the_least_covered(tmp_path, monkeypatch):
    from calibration.bench.lora import measured_pairs, plan_pairs

    table = H200 / "lora" / "lora_kernels.csv"
    cfg = _cfg(tmp_path, "--model-dims", "llama-3.1-8b", "--parts", "lora", "--skip-measured", str(table),
               device="cuda")
    pairs, skipped = plan_pairs(cfg)
    done = measured_pairs(table, "cuda")
    assert len(done) == 10 and {(a, b, r) for _, a, b, r in skipped} == done
    assert len(pairs) == 10 and not {(a, b, r) for _, a, b, r in pairs} & done
    # 2026-11-29 measured ranks 32 and 64 once each and the q/o shape once: the second run starts there
    assert pairs[0][3] in (32, 64) and pairs[0][0] == "q_proj+o_proj" and pairs[1][3] in (32, 64)
    assert plan_pairs(cfg, device="cpu")[1] == []  # rows of another device are not this device's measurements
    for bad, msg in ((tmp_path / "none.csv", "no such file"), (H200 / "linear_h2d_load" / "h2d_copy.csv",
                                                               "not a lora_kernels.csv")):
        with pytest.raises(ValueError, match=f"--skip-measured .*{msg}"):
            _cfg(tmp_path, "--parts", "lora", "--skip-measured", str(bad), device="cuda")


def test_no_ref_drops_the_references_and_triton_timings_always_warm_up(tmp_path, monkeypatch):
    """The Triton path without a GPU (the kernels are not run: ``time_op`` records its calls): with ``--warmup 0``
    every Triton timing still has a warm-up call (its first call compiles); ``--no-ref`` leaves the torch_ref rows
    out. On the CPU --no-ref is refused (the references are the only timing there)."""
    from calibration.bench import lora as L

    calls = []

    def time_op(fn, device, warmup, repeats, flush=True):
        calls.append(warmup)
        return np.ones(repeats)

    monkeypatch.setattr(L, "time_op", time_op)
    monkeypatch.setattr(L, "_times_triton", lambda device, usable: True)
    monkeypatch.setattr(L.K, "triton_usable", lambda device: (True, "compiled"))
    cfg = _cfg(tmp_path, "--ranks", "8", "--lora-tokens", "1,8", "--adapters", "1", "--slots", "4", "--repeats", "1",
               "--warmup", "0", "--targets", "q_proj")
    rows, note = L.run_lora_kernels(cfg, CPU, torch.float32, log=lambda m: None)
    impl = [r["impl"] for r in rows]
    assert "torch" in impl and all(w >= 1 for w, i in zip(calls, impl) if i == "triton")
    assert all(w == 0 for w, i in zip(calls, impl) if i == "torch")
    calls.clear()
    cfg.lora_refs = False
    rows, note = L.run_lora_kernels(cfg, CPU, torch.float32, log=lambda m: None)
    assert rows and {r["impl"] for r in rows} == {"triton"} and "--no-ref" in note and min(calls) >= 1
    with pytest.raises(ValueError, match="--no-ref drops the torch reference timings"):
        _cfg(tmp_path, "--no-ref")
    assert _cfg(tmp_path, "--no-ref", "--parts", "lora", device="cuda").lora_refs is False


# ---------------------------------------------------------------- 5. the GPU defaults are time-boxed
def test_the_default_gpu_run_is_time_boxed(tmp_path):
    cfg = _cfg(tmp_path, "--model-dims", "llama-3.1-8b", device="cuda")
    assert cfg.lora_time_limit_s == GPU_DEFAULTS["lora_time_limit"] == 150
    assert cfg.step_time_limit_s == GPU_DEFAULTS["step_time_limit"] == 120
    # the bounded parts' limits plus the others as the 2026-11-29 H200 run timed them (check 13.5 s, linear 1.6 s,
    # h2d 25 s plus the with-compute rows, load 10 s; ~7 s start-up) stay under 8 minutes
    assert cfg.lora_time_limit_s + cfg.step_time_limit_s + 13.5 + 1.6 + 2 * 25 + 3 * 10 + 7 < 8 * 60
    over = _cfg(tmp_path, "--lora-time-limit", "900", "--step-time-limit", "600", device="cuda")
    assert (over.lora_time_limit_s, over.step_time_limit_s) == (900, 600)
    cpu = _cfg(tmp_path)
    assert cpu.lora_time_limit_s is None and cpu.step_time_limit_s is None
    text = (ROOT / "calibration" / "bench" / "README.md").read_text()
    assert "a few minutes" not in text and "about 7 minutes" in text


# ---------------------------------------------------------------- 6. TRITON_INTERPRET on a GPU run
def test_a_gpu_run_with_triton_interpret_set_is_refused_before_any_work(tmp_path, monkeypatch, capsys):
    from calibration.bench import kernels as K
    from calibration.bench.harness import run_bench

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    out = tmp_path / "x"
    assert main(["--device", "cuda", "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "TRITON_INTERPRET=1 is set" in err
    assert "unset TRITON_INTERPRET" in err and not out.exists()
    cfg = _cfg(tmp_path, "--parts", "lora", device="cuda")
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1 is set"):
        run_bench(cfg)
    check_triton_interpret("cpu")  # the CPU check needs it
    check_triton_interpret("cuda", environ={"TRITON_INTERPRET": "0"})
    check_triton_interpret("cuda", environ={})
    monkeypatch.setattr(K, "INTERPRETED", True)  # kernels defined for the interpreter are never "compiled"
    usable, why = K.triton_usable("cuda")
    assert not usable and "TRITON_INTERPRET" in why
