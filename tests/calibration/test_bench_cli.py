"""calibration.bench without torch: CLI wiring, config resolution, the optional-extra rule."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import pytest

from calibration.bench.cli import build_parser, register_bench
from calibration.bench.config import SMALL_HIDDEN, resolve_config, resolve_spec, small_spec
from calibration.bench.schema import LINEAR_OPS_COLUMNS, TABLES
from twin.model_spec import ALL_TARGETS, get_model

ROOT = Path(__file__).resolve().parents[2]


def _run_py(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_importing_the_cli_does_not_import_torch():
    r = _run_py("import sys, calibration, calibration.bench, calibration.bench.cli, calibration.bench.config, "
                "calibration.bench.schema\n"
                "bad = [m for m in ('torch', 'triton', 'safetensors') if m in sys.modules]\n"
                "assert not bad, bad\nprint('ok')")
    assert r.returncode == 0, r.stderr
    assert "ok" in r.stdout


def test_missing_torch_gives_the_install_hint(tmp_path):
    code = ("import sys\nsys.modules['torch'] = None\n"
            "from calibration.bench.cli import main\n"
            f"sys.exit(main(['--device', 'cpu', '--small', '--out', {str(tmp_path / 'o')!r}]))")
    r = _run_py(code)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "install the calibration extra: pip install -e '.[calibration]'" in r.stderr


def test_nothing_outside_bench_imports_torch_or_triton():
    pat = re.compile(r"^\s*(import|from)\s+(torch|triton)\b", re.M)
    offenders = []
    for top in ("twin", "calibration", "policies", "traces"):
        for path in (ROOT / top).rglob("*.py"):
            if "bench" in path.relative_to(ROOT).parts[:2]:
                continue
            if pat.search(path.read_text(errors="replace")):
                offenders.append(str(path.relative_to(ROOT)))
    assert not offenders, f"torch/triton are an optional extra, imported only by calibration/bench: {offenders}"


def test_bench_package_init_imports_no_torch_at_top():
    src = (ROOT / "calibration" / "bench" / "__init__.py").read_text()
    assert not re.search(r"^(import|from)\s+(torch|triton)", src, re.M)


def test_register_bench_adds_subcommand_with_func():
    top = argparse.ArgumentParser(prog="twin calibrate")
    sub = top.add_subparsers(dest="calibrate_cmd")
    assert register_bench(sub) is None
    args = top.parse_args(["bench", "--device", "cpu", "--out", "X", "--ranks", "8,16", "--small"])
    assert callable(args.func)
    assert args.device == "cpu" and args.ranks == "8,16" and args.small is True


def _args(*argv):
    return build_parser().parse_args(["--out", "o", *argv])


def test_cpu_defaults_to_small_dims():
    cfg = resolve_config(_args("--device", "cpu"), cuda_available=False)
    assert cfg.small and cfg.spec.hidden == SMALL_HIDDEN and cfg.spec.layers == 2
    assert cfg.spec.head_dim == 64 and cfg.dtype == "float32"
    assert cfg.base_model == "llama-2-7b"
    full = resolve_config(_args("--device", "cpu", "--full", "--model-dims", "llama-3.1-8b"), cuda_available=False)
    assert not full.small and full.spec == get_model("llama-3.1-8b")


def test_auto_device_and_gpu_defaults():
    cfg = resolve_config(_args("--model-dims", "llama-3.1-8b"), cuda_available=True)
    assert cfg.device == "cuda" and not cfg.small and cfg.dtype == "float16"
    assert cfg.ranks == (8, 16, 32, 64, 128) and cfg.spec.hidden == 4096
    assert resolve_config(_args(), cuda_available=False).device == "cpu"


def test_sweep_overrides_and_validation():
    cfg = resolve_config(_args("--device", "cpu", "--ranks", "4,8", "--tokens", "1,2", "--repeats", "3",
                               "--parts", "linear,load", "--targets", "q_proj,v_proj"), cuda_available=False)
    assert cfg.ranks == (4, 8) and cfg.tokens == (1, 2) and cfg.repeats == 3
    assert cfg.parts == ("linear", "load") and cfg.targets == ("q_proj", "v_proj")
    with pytest.raises(ValueError):
        resolve_config(_args("--device", "cpu", "--ranks", "8,x"), cuda_available=False)
    with pytest.raises(ValueError):
        resolve_config(_args("--device", "cpu", "--parts", "linear,nope"), cuda_available=False)
    with pytest.raises(ValueError):
        resolve_config(_args("--device", "cpu", "--targets", "q_proj,lm_head"), cuda_available=False)


@pytest.mark.parametrize("flag, value, message", [("--threads", "0", r"--threads 0: torch's CPU threads must be >= 1"),
                                                  ("--threads", "-3", r"--threads -3: torch's CPU threads must be >= 1"),
                                                  ("--seed", "-1", r"--seed -1: a seed must be >= 0")])
def test_threads_and_seed_out_of_range_are_refused_before_any_work(flag, value, message):
    """(``--threads -3`` reached torch's ``set_num_threads``: a traceback; ``--threads 0`` ran one thread and recorded
    0; ``--seed -1`` was recorded as given.)"""
    with pytest.raises(ValueError, match=message):
        resolve_config(_args("--device", "cpu", flag, value), cuda_available=False)


def test_explicit_dims():
    spec = resolve_spec(None, hidden=512, layers=3, heads=8, kv_heads=2, intermediate=1024, vocab=1000, name="tiny")
    assert (spec.name, spec.hidden, spec.kv_heads, spec.head_dim) == ("tiny", 512, 2, 64)
    with pytest.raises(ValueError, match="--layers"):
        resolve_spec(None, hidden=512)
    over = resolve_spec("llama-2-7b", layers=4)
    assert over.layers == 4 and over.hidden == 4096
    with pytest.raises(KeyError):
        resolve_spec("no-such-model")


def test_adapter_bytes_follow_model_spec():
    cfg = resolve_config(_args("--device", "cpu", "--model-dims", "llama-3.1-8b"), cuda_available=False)
    for r in cfg.ranks:
        assert cfg.adapter_bytes(r) == cfg.spec.adapter_bytes(r, ALL_TARGETS)
    s = small_spec(get_model("llama-3.1-8b"))
    assert s.heads // s.kv_heads == 4 and s.intermediate % 32 == 0


def test_schema_linear_columns_match_vidur():
    assert LINEAR_OPS_COLUMNS[:5] == [f"time_stats.emb.{s}" for s in ("min", "max", "mean", "median", "std")]
    assert LINEAR_OPS_COLUMNS[-2:] == ["num_tokens", "num_tensor_parallel_workers"]
    assert set(TABLES) == {"linear_ops.csv", "adapter_load.csv", "lora_kernels.csv", "h2d_copy.csv",
                           "kernel_check.csv", "step_bench.csv"}


@pytest.mark.data
def test_schema_matches_shared_data_headers(real_data):
    import pandas as pd

    from calibration.bench.schema import ADAPTER_LOAD_COLUMNS

    vidur = pd.read_csv(real_data / "calibration/vidur_linear_ops/a40/llama-2-7b-hf_mlp.csv", nrows=1)
    assert list(vidur.columns) == LINEAR_OPS_COLUMNS
    load = pd.read_csv(real_data / "calibration/vllm085_h100/adapter_load.csv", nrows=1)
    assert list(load.columns) == ADAPTER_LOAD_COLUMNS


@pytest.mark.parametrize("dims", [{"heads": 0}, {"kv_heads": 0}, {"hidden": -1}])
def test_zero_or_negative_model_dimensions_are_refused(dims):
    """A dimension below 1 is an input error naming the flag (a zero head count divided by zero)."""
    from calibration.bench.config import resolve_spec

    flag = "--" + next(iter(dims)).replace("_", "-")
    with pytest.raises(ValueError, match=f"{flag} .*must be >= 1"):
        resolve_spec("llama-3.1-8b", **dims)
