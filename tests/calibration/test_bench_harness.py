"""The whole bench harness end to end on CPU with tiny sizes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch", reason="torch is the optional calibration extra: pip install -e '.[calibration]'")
pytest.importorskip("safetensors", reason="safetensors is the optional calibration extra")
pd = pytest.importorskip("pandas")

from calibration.bench.cli import main  # noqa: E402
from calibration.bench.config import small_spec  # noqa: E402
from calibration.bench.schema import (  # noqa: E402
    ADAPTER_LOAD_COLUMNS, LINEAR_OPS, LINEAR_OPS_COLUMNS, LORA_KERNEL_COLUMNS, LORA_KERNELS,
    META_FILE, TABLES,
)
from twin.model_spec import get_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--device", "cpu", "--small", "--model-dims", "llama-3.1-8b", "--ranks", "8,16", "--tokens", "1,8",
        "--lora-tokens", "1,8", "--adapters", "1,2", "--repeats", "2", "--warmup", "1", "--load-repeats", "2",
        "--concurrency", "1,2", "--step-decodes", "0,4", "--step-context", "16,32,64", "--step-repeats", "1",
        "--step-warmup", "0", "--check-cases", "long_segment_multi_tile", "--quiet"]


@pytest.fixture(scope="module")
def bench_out(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bench")
    rc = main(TINY + ["--out", str(out)])
    assert rc == 0
    return out


def _positive(s) -> bool:
    s = pd.to_numeric(s)
    return bool(np.isfinite(s).all() and (s > 0).all())


def test_every_table_written_with_contract_columns(bench_out):
    import torch

    for name, cols in TABLES.items():
        df = pd.read_csv(bench_out / name)
        assert list(df.columns) == cols, name
        if name == "kernel_check.csv" and torch.cuda.is_available():
            continue  # with a GPU visible, the CPU run leaves the Triton check to --device cuda
        assert len(df) > 0, name
    assert not (bench_out / "adapters").exists(), "adapter files are removed unless --keep-adapters"
    if not torch.cuda.is_available():  # --check-cases: only the case named (each is checked in test_bench_kernels)
        assert set(pd.read_csv(bench_out / "kernel_check.csv")["case"]) == {"long_segment_multi_tile"}


def test_linear_ops(bench_out):
    df = pd.read_csv(bench_out / "linear_ops.csv")
    assert list(df.columns[: len(LINEAR_OPS_COLUMNS)]) == LINEAR_OPS_COLUMNS
    assert sorted(df.num_tokens) == [1, 8]
    spec = small_spec(get_model("llama-3.1-8b"))
    assert (df.n_embd == spec.hidden).all() and (df.n_head == spec.heads).all()
    assert (df.n_kv_head == spec.kv_heads).all() and (df.n_expanded_embd == spec.intermediate).all()
    assert (df.num_tensor_parallel_workers == 1).all() and df.use_gated_mlp.all()
    for op in LINEAR_OPS:
        assert _positive(df[f"time_stats.{op}.mean"]), op
        assert (df[f"time_stats.{op}.min"] <= df[f"time_stats.{op}.max"]).all()
        assert (df[f"time_stats.{op}.std"] >= 0).all()
    assert (df.device == "cpu").all()


def test_lora_kernels(bench_out):
    df = pd.read_csv(bench_out / "lora_kernels.csv")
    assert list(df.columns[: len(LORA_KERNEL_COLUMNS)]) == LORA_KERNEL_COLUMNS
    assert set(df.kernel) == set(LORA_KERNELS)  # CPU: the operations timed with torch
    assert (df.impl == "torch").all() and (df.device == "cpu").all()
    assert set(df["rank"]) == {8, 16} and set(df.batch_tokens) == {1, 8}
    assert not ((df.n_adapters == 2) & (df.batch_tokens == 1)).any()  # n_adapters <= tokens
    spec = small_spec(get_model("llama-3.1-8b"))
    shapes = {(spec.module_shape(m)) for m in ("q_proj", "k_proj", "gate_proj", "down_proj")}
    assert set(zip(df.d_in, df.d_out)) == shapes
    assert _positive(df.time_ms_mean) and (df.time_ms_std >= 0).all() and (df.repeats == 2).all()


def test_h2d_copy(bench_out):
    df = pd.read_csv(bench_out / "h2d_copy.csv")
    spec = small_spec(get_model("llama-3.1-8b"))
    assert set(df.memory) == {"pageable"} and set(df.concurrent) == {1, 2}
    for _, row in df.iterrows():
        assert row.bytes == spec.adapter_bytes(int(row.adapter_rank))
    assert _positive(df.time_ms_mean) and _positive(df.gbps)
    assert np.allclose(df.gbps, df.concurrent * df.bytes / (df.time_ms_mean / 1e3) / 1e9)


def test_adapter_load(bench_out):
    df = pd.read_csv(bench_out / "adapter_load.csv")
    assert list(df.columns[: len(ADAPTER_LOAD_COLUMNS)]) == ADAPTER_LOAD_COLUMNS
    assert set(df.load_kind) == {"disk_to_cpu", "cpu_to_gpu"}
    assert (df.phase == "serving").all() and (df.raw_path == "bench:cpu").all() and (df.device == "cpu").all()
    assert (df.max_lora_rank == 16).all() and (df.adapter_slots == 1).all()
    counts = df.groupby(["adapter_rank", "load_kind"]).load_index.apply(sorted)
    assert all(v == [1, 2] for v in counts)
    spec = small_spec(get_model("llama-3.1-8b"))
    for r in (8, 16):
        assert (df[df.adapter_rank == r].bytes == spec.adapter_bytes(r)).all()
    assert _positive(df.load_ms)


def test_kernel_check_and_meta(bench_out):
    chk = pd.read_csv(bench_out / "kernel_check.csv")
    import importlib.util

    if importlib.util.find_spec("triton") is not None:
        assert chk.ok.all() and (chk.max_abs_err < 1e-4).all() and chk.interpreted.all()
    meta = json.loads((bench_out / META_FILE).read_text())
    for key in ("device_name", "torch_version", "triton_version", "model_dims", "repeats", "warmup",
                "timestamp", "command_line"):
        assert key in meta, key
    assert meta["device"] == "cpu" and meta["small"] is True and meta["repeats"] == 2 and meta["warmup"] == 1
    assert meta["model_dims"]["hidden"] == 256
    assert "--small" in meta["command_line"]
    assert meta["tables"]["linear_ops.csv"] == 2


def test_module_entry_point_and_errors(tmp_path, capsys):
    out = tmp_path / "m"
    r = subprocess.run([sys.executable, "-m", "calibration.bench", "--device", "cpu", "--small", "--parts", "linear",
                        "--tokens", "1", "--repeats", "1", "--warmup", "0", "--out", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert (out / "linear_ops.csv").exists() and (out / META_FILE).exists()
    import torch

    if not torch.cuda.is_available():
        assert main(["--device", "cuda", "--out", str(tmp_path / "x"), "--quiet"]) == 2
    capsys.readouterr()
    assert main(["--device", "cpu", "--ranks", "0", "--out", str(tmp_path / "y"), "--quiet"]) == 2
    assert capsys.readouterr().err.startswith("python -m calibration.bench: error: --ranks")  # (was "error: ")
    assert main(["--device", "cpu", "--check-cases", "nope", "--out", str(tmp_path / "z"), "--quiet"]) == 2
    assert main(["--device", "cpu", "--parts", "linear", "--check-cases", "rank_above_block",
                 "--out", str(tmp_path / "z"), "--quiet"]) == 2
    assert not (tmp_path / "z").exists()
