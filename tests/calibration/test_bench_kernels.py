"""Triton SGMV/BGMV kernels vs. the plain torch reference (TRITON_INTERPRET=1 on CPU)."""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch", reason="torch is the optional calibration extra: pip install -e '.[calibration]'")
if not torch.cuda.is_available():  # must be set before the kernels are defined
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton", reason="triton is the optional calibration extra: pip install -e '.[calibration]'")

from calibration.bench import kernels as K  # noqa: E402
from calibration.bench.lora import CHECK_CASES, check_case  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")

if not K.triton_usable(DEVICE)[0]:
    pytest.skip(f"Triton kernels cannot run here: {K.triton_usable(DEVICE)[1]}", allow_module_level=True)


@pytest.mark.parametrize("case", CHECK_CASES, ids=[c["name"] for c in CHECK_CASES])
def test_kernels_agree_with_reference_fp32(case):
    rows = check_case(case, DEVICE, torch.float32)
    bad = [(r["kernel"], r["max_abs_err"]) for r in rows if not r["ok"]]
    assert not bad, f"{case['name']}: {bad}"
    assert all(r["max_abs_err"] < 1e-4 for r in rows)
    assert {r["kernel"] for r in rows} >= {"sgmv_shrink", "sgmv_expand", "bgmv_shrink", "bgmv_expand", "slot_shrink",
                                           "slot_expand_add"}


def test_the_torch_free_config_names_every_case():
    from calibration.bench.config import CHECK_CASE_NAMES

    assert tuple(c["name"] for c in CHECK_CASES) == CHECK_CASE_NAMES


def test_cases_cover_the_edge_cases():
    segs = [s for c in CHECK_CASES for s in c["segments"]]
    assert any(n == 0 for _, n, _ in segs), "a segment of length 0"
    assert any(len([i for _, _, i in c["segments"] if i >= 0]) > len({i for _, _, i in c["segments"] if i >= 0})
               for c in CHECK_CASES), "an adapter index repeated"
    assert any(len(set(c["ranks"])) > 1 for c in CHECK_CASES), "mixed ranks"
    assert any(-1 in c["tokens"] for c in CHECK_CASES), "a token without adapter"


def test_shrink_zeroes_beyond_rank_and_expand_keeps_uncovered_rows():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(10, 20, generator=g).to(DEVICE)
    a = torch.randn(2, 20, 16, generator=g).to(DEVICE)
    b = torch.randn(2, 16, 24, generator=g).to(DEVICE)
    y = K.sgmv_shrink(x, a, [0, 4], [4, 3], [1, 1], ranks=[16, 5])
    assert torch.all(y[:, 5:] == 0) and torch.all(y[7:] == 0)
    base = torch.randn(10, 24, generator=g).to(DEVICE)
    out = K.sgmv_expand(y, b, [0, 4], [4, 3], [1, 1], ranks=[16, 5], out=base.clone())
    assert torch.equal(out[7:], base[7:])
    ref = K.sgmv_expand_ref(y, b, [0, 4], [4, 3], [1, 1], ranks=[16, 5], out=base.clone())
    assert torch.allclose(out, ref, atol=1e-4)


def test_argument_validation():
    x = torch.randn(4, 8, device=DEVICE)
    a = torch.randn(2, 8, 16, device=DEVICE)
    with pytest.raises(ValueError):
        K.bgmv_shrink(x, a.half(), [0, 1, 0, 1])
    with pytest.raises(ValueError):
        K.bgmv_shrink(x, a, [0, 1, 0, 1], ranks=[8, 32])
    with pytest.raises(ValueError):
        K.bgmv_shrink(x, a, [0, 1])


def test_layout_helpers():
    assert K.even_segments(10, 3) == ([0, 4, 7], [4, 3, 3], [0, 1, 2])
    assert K.even_segments(2, 3)[1] == [1, 1, 0]
    assert K.interleaved_tokens(5, 2) == [0, 1, 0, 1, 0]


@pytest.mark.skipif(DEVICE.type != "cuda", reason="half-precision check needs a GPU")
def test_kernels_agree_fp16_on_gpu():
    for case in CHECK_CASES:
        rows = check_case(case, DEVICE, torch.float16)
        assert all(r["ok"] for r in rows), rows


def test_kernels_compile_for_gpu_targets_without_a_gpu():
    """The compiled (non-interpreted) path: Triton compiles the kernels to cubin for sm_80/sm_90
    here, with no GPU, using the ptxas it ships (bf16 too: the device session runs in bfloat16, and the interpreter
    cannot check bf16 ``tl.dot``: it multiplies the raw bits). Runs in a subprocess without TRITON_INTERPRET."""
    import subprocess
    import sys
    from pathlib import Path

    code = ("import sys\n"
            "try:\n"
            "    import triton.knobs\n"
            "    ptxas = triton.knobs.nvidia.ptxas.path\n"
            "except Exception as e:\n"
            "    print(f'SKIP: no CUDA backend/ptxas in this Triton build ({e})'); sys.exit(0)\n"
            "from calibration.bench import kernels as K\n"
            "for arch, dt in ((90, 'fp16'), (90, 'bf16'), (80, 'fp16'), (90, 'fp32')):\n"
            "    r = K.compile_for_target(arch, dt)\n"
            "    assert all('cubin' in v for v in r.values()), r\n"
            "print('compiled', len(r))\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    r = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[2], env=env,
                       capture_output=True, text=True, timeout=300)
    if r.returncode == 0 and r.stdout.startswith("SKIP:"):
        pytest.skip(r.stdout.strip())
    assert r.returncode == 0, r.stderr[-3000:]
    assert "compiled 7" in r.stdout


def test_slot_meta_sorts_tokens_by_slot_and_marks_empty_slots():
    order, count, start, lora_id = K.slot_meta([2, -1, 0, 2, 0, 2], 4)
    assert count.tolist() == [1, 2, 0, 3, 0]  # the no-adapter group, then slots 0..3
    assert start.tolist() == [0, 1, 3, 3, 6]
    assert lora_id.tolist() == [-1, 0, -1, 2, -1]
    assert order.tolist() == [1, 2, 4, 0, 3, 5]  # stable within a slot
    with pytest.raises(ValueError, match=r"\[-1, 3\]"):
        K.slot_meta([4], 4)


def test_slot_grid_blocks_follow_vllm_085_launch_configs():
    # shrink below 128 tokens: SPLIT_K 64, BLOCK_M 32, BLOCK_N 16; (slots + 1) groups launch
    assert K.slot_grid_blocks("shrink", 100, 8, 16, [60, 40]) == (9 * 4 * 64, (2 + 2) * 64)
    # from 128 tokens: SPLIT_K 8; rank 64 = 4 column tiles
    assert K.slot_grid_blocks("shrink", 128, 3, 64, [128]) == (4 * 4 * 8 * 4, 4 * 8 * 4)
    # expand: BLOCK_M 64, BLOCK_N 128
    assert K.slot_grid_blocks("expand", 65, 2, 300, [1, 64, 0]) == (3 * 2 * 3, (1 + 1) * 3)
    with pytest.raises(ValueError):
        K.slot_grid_blocks("gather", 1, 1, 1, [1])


@pytest.mark.parametrize("T", [5, 40, 150])
def test_slot_kernels_agree_with_reference_in_vllm_layouts(T):
    """Weights in vLLM's layouts (A (S, R, d_in), B (S, d_out, R)) seen through strides, tokens of a few
    slots out of many (the other slots' blocks exit), a no-adapter token, both shrink configurations."""
    g = torch.Generator().manual_seed(T)
    S, d_in, R, N = 7, 72, 32, 140
    x = torch.randn(T, d_in, generator=g).to(DEVICE)
    a = torch.randn(S, R, d_in, generator=g).to(DEVICE).transpose(1, 2)
    b = torch.randn(S, N, R, generator=g).to(DEVICE).transpose(1, 2)
    slots = [1, 4, 6, -1]
    ts = [slots[(t * 7) % 4] for t in range(T)]
    meta = K.slot_meta(ts, S, DEVICE)
    # (the small-batch shrink's 64 splits cost the interpreter ~25 ms each; 4 exercise the same code)
    interpreted_small = K.INTERPRETED and DEVICE.type != "cuda" and T < K.SLOT_SHRINK_SWITCH
    y = K.slot_shrink(x, a, meta, scale=0.25, split_k=K.INTERPRETER_SPLIT_K if interpreted_small else None)
    assert y.dtype == torch.float32
    assert torch.allclose(y, K.slot_shrink_ref(x, a, ts, scale=0.25), atol=1e-4, rtol=1e-4)
    assert torch.all(y[[i for i, s in enumerate(ts) if s < 0]] == 0)
    base = torch.randn(T, N, generator=g).to(DEVICE)
    out = K.slot_expand(y, b, meta, out=base.clone())
    ref = K.slot_expand_ref(y, b, ts, out=base.clone())
    assert torch.allclose(out, ref, atol=1e-3, rtol=1e-4)
    untouched = [i for i, s in enumerate(ts) if s < 0]
    assert torch.equal(out[untouched], base[untouched])
    with pytest.raises(ValueError, match="meta is for"):
        K.slot_shrink(x, a[:5], meta)


def test_slot_shrink_split_count_does_not_change_the_result():
    """vLLM's 64 splits of the small-batch shrink on a batch small enough for the interpreter (one token of one
    slot, one rank tile), against the reduced count the other checks run there, 1 split and the reference;
    and a split count that is not a positive integer is refused."""
    g = torch.Generator().manual_seed(3)
    d_in, R = 40, 16
    x = torch.randn(2, d_in, generator=g).to(DEVICE)
    a = torch.randn(1, d_in, R, generator=g).to(DEVICE)
    ts = [0, -1]
    meta = K.slot_meta(ts, 1, DEVICE)
    ref = K.slot_shrink_ref(x, a, ts, scale=0.5)
    full = K.slot_shrink(x, a, meta, scale=0.5)
    assert K.SLOT_SHRINK_BLOCKS["small"]["SPLIT_K"] == 64
    assert torch.allclose(full, ref, atol=1e-4, rtol=1e-4)
    for sk in (K.INTERPRETER_SPLIT_K, 1):
        assert torch.allclose(K.slot_shrink(x, a, meta, scale=0.5, split_k=sk), full, atol=1e-5, rtol=1e-5)
    for bad in (0, -2, 2.5):
        with pytest.raises(ValueError, match="split_k must be a positive integer"):
            K.slot_shrink(x, a, meta, split_k=bad)
