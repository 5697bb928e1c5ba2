"""Testbed profiles from Vidur's operator timings: Llama-2-7B on an A40 (Chameleon's set-up) and
Llama-7B/13B/30B on A100s of 24, 48 and 80 GB (Chameleon's scaling study).

Measured (``vidur_linear_ops/<gpu>/<model>_mlp.csv``): the GPU time of every linear
operator of one layer (QKV and output projections, gated-MLP up/down, activation, norms,
rotary embedding, residual adds) and of the embedding, for 1-4096 tokens, tensor-parallel
degrees 1, 2, 4 and 8 (each rank's shard). The per-step time of the linear part of the model is
``lin(T) = layers x sum(layer ops at T) + embedding(T)``; the backbone is fitted to it at TP 1,
and at each TP degree for the profile's ``tensor_parallel`` tables
(:func:`twin.tensor_parallel.tp_profile` uses them instead of its analytical split).

A model Vidur did not profile on the GPU (Llama-13B and 30B on the A100) gets its ``lin(T)`` from
a *shape model* (:func:`fit_shape_model`) fitted with ``curve_fit`` on the GPU's tables of the
models it did profile, every TP degree: one roofline over all GEMM shapes and one line per
element-wise operator. Its held-out error (:func:`shape_model_heldout`) is measured on a model it
never saw. The 24 and 48 GB A100s are capped 80 GB A100s (same compute, less memory).

Estimated (not in the data), each with the numbers recorded in the profile's notes:

* **decode attention** (KV reads, memory bound): ``c_ctx = kv_bytes_per_token / BW``, with BW
  the A40's effective memory bandwidth measured by Vidur's memory-bound regime (weight bytes
  of the linear layers / ``lin(1)``);
* **prefill attention** FLOPs: left out (``< 3 %`` of the linear FLOPs for prompts up to 1024
  tokens, the figure is in the notes);
* **LM head** (not profiled): per decode sequence, the FLOPs of a ``hidden x vocab`` GEMM at
  the A40's measured per-FLOP cost (``c_seq``), its weight read added to ``c_mem``;
* **per-step overhead outside the linear ops** (norm/attention kernel launches, sampling,
  CPU): taken from the vLLM 0.8.5 H100 profile of Llama-3.1-8B, as its measured step at one
  sequence minus Vidur's H100 linear-op time scaled to that model (CPU-bound, assumed to
  carry over); ``c_eager`` and the scheduler likewise;
* **LoRA kernels**: the H100 vLLM 0.8.5 additive fit scaled to the A40 (per-adapter term by
  the memory-bound time ratio A40/H100 of Vidur's ops, per-token terms by the compute-bound
  ratio, by the adapter-size ratio of the two models); rank coefficient from the vLLM 0.5.0
  Llama-2-7B fit;
* **loads**: fixed costs from the H100 measurements (software), CPU->GPU bandwidth of the
  A40's PCIe 4.0 x16 link (25 GB/s effective);
* **KV capacity**: ``0.9 x 46068 MiB`` (A40; 24/48/80 GiB on the A100s) minus weights, minus the
  runtime reserve and LoRA slot buffers measured for Llama-2-7B with vLLM 0.5.0 on the H100;
* **tensor parallelism** (A100): two all-reduces per layer with an estimated latency and NVLink
  bus bandwidth (:data:`A100_ALLREDUCE`), added by :mod:`twin.tensor_parallel`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from calibration.fitting.core import FitError, ParamSpec, choose, fit_params, grouped_folds, quality
from calibration.fitting.profile_io import build_profile, provenance
from calibration.fitting.tables import Col, read_table
from twin.perf.forms import FORMS
from twin.model_spec import ALL_TARGETS, ModelSpec, get_model
from twin.tensor_parallel import kv_bytes_per_token_per_rank, valid_degrees
from twin.perf.profile import Profile, load_profile

#: GPU facts used for estimates: total memory as CUDA reports it (nvidia-smi), host link, streaming
#: multiprocessors, and ``ops``: the directory of Vidur's operator timings measured on that GPU. The 24 and
#: 48 GB A100s are *capped* 80 GB A100s (Chameleon's scaling study varies the memory size only): the same
#: compute, HBM bandwidth and PCIe link, with 24 / 48 GiB of memory for the server
GPUS = {
    "a40": {"name": "A40-48GB", "memory_bytes": 46068 * 2 ** 20, "host_link_gbps": 25.0,
            "link": "PCIe 4.0 x16 (~25 GB/s effective)", "sms": 84, "ops": "a40"},
    "a100-80gb": {"name": "A100-80GB", "memory_bytes": 81920 * 2 ** 20, "host_link_gbps": 25.0,
                  "link": "PCIe 4.0 x16 (~25 GB/s effective)", "sms": 108, "ops": "a100"},
    "a100-48gb": {"name": "A100-48GB", "memory_bytes": 48 * 2 ** 30, "host_link_gbps": 25.0,
                  "link": "PCIe 4.0 x16 (~25 GB/s effective)", "sms": 108, "ops": "a100",
                  "capped": "an A100-80GB whose server may use 48 GiB (Chameleon's memory-size study): compute, "
                            "bandwidth and link of the 80 GB A100 (Vidur's A100 timings), memory 48 x 2^30 B"},
    "a100-24gb": {"name": "A100-24GB", "memory_bytes": 24 * 2 ** 30, "host_link_gbps": 25.0,
                  "link": "PCIe 4.0 x16 (~25 GB/s effective)", "sms": 108, "ops": "a100",
                  "capped": "an A100-80GB whose server may use 24 GiB (Chameleon's memory-size study): compute, "
                            "bandwidth and link of the 80 GB A100 (Vidur's A100 timings), memory 24 x 2^30 B"},
    "h100": {"name": "H100-80GB", "memory_bytes": 81559 * 2 ** 20, "host_link_gbps": 50.0,
             "link": "PCIe 5.0 x16 (~50 GB/s effective)", "sms": 132, "ops": "h100"},
}
GPU_ALIASES = {"a100": "a100-80gb"}
VIDUR_NAMES = {"llama-2-7b": "llama-2-7b-hf", "llama-3.1-8b": "meta-llama-3-8b"}
LAYER_OPS = ("input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj", "post_attention_layernorm",
             "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")
GRAPH_MAX_TOKENS = 512
DEFAULT_REFERENCES = ("llama-3.1-8b_h100_vllm085", "llama-2-7b_h100_vllm050")


VIDUR_README = "the data README, section calibration/vidur_linear_ops"
#: the columns of Vidur's ``*_mlp.csv`` the fit reads: shapes, TP degree, tokens, median operator times (ms)
VIDUR_COLUMNS = tuple(
    [Col(c, w, "pos", missing_ok=False, whole=True) for c, w in (
        ("num_tensor_parallel_workers", "a TP degree"), ("num_tokens", "a number of tokens"),
        ("n_head", "a number of attention heads"), ("n_kv_head", "a number of KV heads"),
        ("n_embd", "a hidden size"), ("n_expanded_embd", "an MLP size"))]
    + [Col(f"time_stats.{o}.median", "an operator time (ms)", "pos", missing_ok=False)
       for o in dict.fromkeys(LAYER_OPS + ("emb",))])


def read_ops(directory: Path, gpu: str, spec: ModelSpec, tp: int = 1) -> pd.DataFrame:
    """``num_tokens`` and ``lin_ms`` (all layers + embedding) of one GPU, TP degree ``tp``."""
    fname = VIDUR_NAMES.get(spec.name)
    f = Path(directory) / gpu / f"{fname}_mlp.csv"
    if fname is None or not f.exists():
        avail = sorted(str(p.relative_to(directory)) for p in Path(directory).glob("*/*_mlp.csv"))
        raise FileNotFoundError(f"no Vidur timings of {spec.name} on {gpu} in {directory}; available: {avail}")
    d = read_table(f, VIDUR_COLUMNS, VIDUR_README)
    d = d[d["num_tensor_parallel_workers"] == tp]
    layer = sum(d[f"time_stats.{o}.median"] for o in LAYER_OPS) + d["time_stats.add.median"]  # two residual adds
    lin = layer * spec.layers + d["time_stats.emb.median"]
    out = pd.DataFrame({"num_tokens": d["num_tokens"].to_numpy(float), "lin_ms": lin.to_numpy(float)})
    return out.groupby("num_tokens", as_index=False)["lin_ms"].median()


def linear_weight_bytes(spec: ModelSpec) -> float:
    """Bytes of the per-layer linear weights (QKV, O, gate/up, down) over all layers."""
    kv = spec.kv_heads * spec.head_dim
    per_layer = spec.hidden * (spec.hidden + 2 * kv) + spec.hidden * spec.hidden + 3 * spec.hidden * spec.intermediate
    return float(per_layer * spec.layers * spec.dtype_bytes)


#: Vidur's GEMM operators of one layer and their (K, N) per TP rank (Megatron split: QKV and gate/up are
#: column-parallel, output and down projections row-parallel; KV heads replicated when tp exceeds them)
GEMM_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
#: Vidur's element-wise operators (per-token width per TP rank)
ELEMENTWISE_OPS = ("input_layernorm", "post_attention_layernorm", "attn_rope", "mlp_act", "add", "emb")
#: TP degrees Vidur profiled
VIDUR_TP = (1, 2, 4, 8)


def op_shapes(heads: int, kv_heads: int, hidden: int, intermediate: int, tp: int) -> dict[str, tuple[int, int]]:
    """``(K, N)`` of each GEMM operator and ``(width, 0)`` of each element-wise one, per TP rank."""
    hd = hidden // heads
    q = heads // tp * hd
    kv = max(1, kv_heads // tp) * hd
    inter = intermediate // tp
    return {"attn_pre_proj": (hidden, q + 2 * kv), "attn_post_proj": (q, hidden), "mlp_up_proj": (hidden, 2 * inter),
            "mlp_down_proj": (inter, hidden), "input_layernorm": (hidden, 0), "post_attention_layernorm": (hidden, 0),
            "attn_rope": (q + kv, 0), "mlp_act": (inter, 0), "add": (hidden, 0), "emb": (hidden, 0)}


def read_op_table(directory: Path, gpu_dir: str) -> pd.DataFrame:
    """Every operator timing of every model Vidur profiled on ``gpu_dir``, long format: ``table, op,
    num_tokens, tp, K, N, t_ms`` (median of Vidur's repetitions; ``N = 0`` for element-wise ops)."""
    files = sorted((Path(directory) / gpu_dir).glob("*_mlp.csv"))
    if not files:
        raise FileNotFoundError(f"no Vidur operator timings (*_mlp.csv) in {Path(directory) / gpu_dir}")
    parts = []
    for f in files:
        d = read_table(f, VIDUR_COLUMNS, VIDUR_README)
        for (h, kvh, hid, inter, tp), g in d.groupby(["n_head", "n_kv_head", "n_embd", "n_expanded_embd",
                                                      "num_tensor_parallel_workers"]):
            shapes = op_shapes(int(h), int(kvh), int(hid), int(inter), int(tp))
            for op in GEMM_OPS + ELEMENTWISE_OPS:
                k, n = shapes[op]
                parts.append(pd.DataFrame({"table": f.stem, "op": op, "num_tokens": g["num_tokens"].to_numpy(float),
                                           "tp": int(tp), "K": float(k), "N": float(n),
                                           "t_ms": g[f"time_stats.{op}.median"].to_numpy(float)}))
    return pd.concat(parts, ignore_index=True)


def _gemm_ms(M, K, N, t0, bw_gbps, tflops):
    """Roofline of one GEMM ``(M x K) @ (K x N)`` in fp16: ``t0 + max(bytes / bw, flops / F)`` (ms)."""
    nbytes = 2.0 * (K * N + M * K + M * N)
    return t0 + np.maximum(nbytes / (bw_gbps * 1e9), 2.0 * M * K * N / (tflops * 1e12)) * 1e3


def _elementwise_ms(M, W, e0, bw_gbps):
    """An element-wise operator over ``M x W`` fp16 values: ``e0 + bytes / bw`` (ms)."""
    return e0 + 2.0 * M * W / (bw_gbps * 1e9) * 1e3


def fit_shape_model(table: pd.DataFrame) -> dict[str, Any]:
    """Operator times as a function of the shapes, fitted with ``curve_fit`` (relative errors) on
    ``table`` (:func:`read_op_table`): one roofline for all GEMM operators (``t0`` ms, effective
    bandwidth GB/s, effective TFLOP/s), one ``e0 + bytes / bw`` line per element-wise operator."""
    g = table[table["op"].isin(GEMM_OPS)]
    M, K, N, y = (g[c].to_numpy(float) for c in ("num_tokens", "K", "N", "t_ms"))
    specs = [ParamSpec("t0", 0.01, 0.0, 1.0), ParamSpec("bw_gbps", 1500.0, 10.0, 1e4),
             ParamSpec("tflops", 200.0, 1.0, 1e4)]
    gf = fit_params(lambda *th: _gemm_ms(M, K, N, *th), specs, y, y, "vidur/shape gemm")
    out: dict[str, Any] = {"gemm": {"params": gf.values, "stderr": gf.stderr,
                                    "train": quality(y, _gemm_ms(M, K, N, *gf.values.values())),
                                    "units": {"t0": "ms", "bw_gbps": "GB/s", "tflops": "TFLOP/s"}},
                           "elementwise": {}}
    for op in ELEMENTWISE_OPS:
        e = table[table["op"] == op]
        Me, We, ye = (e[c].to_numpy(float) for c in ("num_tokens", "K", "t_ms"))
        ef = fit_params(lambda *th: _elementwise_ms(Me, We, *th),
                        [ParamSpec("e0", float(ye.min()), 0.0, 1.0), ParamSpec("bw_gbps", 1000.0, 1.0, 1e5)],
                        ye, ye, f"vidur/shape {op}")
        out["elementwise"][op] = {"params": ef.values, "train": quality(ye, _elementwise_ms(Me, We, *ef.values.values()))}
    return out


def shape_lin(shape: dict[str, Any], spec: ModelSpec, tp: int, tokens: np.ndarray) -> pd.DataFrame:
    """``num_tokens, lin_ms`` of ``spec`` at TP ``tp`` predicted by a shape model (:func:`fit_shape_model`),
    summed as :func:`read_ops` sums the measured operators (two residual adds per layer)."""
    T = np.asarray(tokens, float)
    shapes = op_shapes(spec.heads, spec.kv_heads, spec.hidden, spec.intermediate, tp)
    gp = shape["gemm"]["params"]
    layer = sum(_gemm_ms(T, *map(float, shapes[op]), *gp.values()) for op in GEMM_OPS)
    ew = {op: _elementwise_ms(T, float(shapes[op][0]), *shape["elementwise"][op]["params"].values())
          for op in ELEMENTWISE_OPS}
    layer = layer + sum(ew[op] for op in ELEMENTWISE_OPS if op != "emb") + ew["add"]
    return pd.DataFrame({"num_tokens": T, "lin_ms": layer * spec.layers + ew["emb"]})


def _table_model(stem: str) -> str | None:
    """The model name of the Vidur table ``<stem>.csv`` (None when the project does not know it)."""
    return next((m for m, f in VIDUR_NAMES.items() if f"{f}_mlp" == stem), None)


def shape_model_heldout(directory: Path, gpu_dir: str, k: int = 5) -> dict[str, Any]:
    """How well the shape model extrapolates to a model it never saw: for each model Vidur profiled on
    ``gpu_dir``, the shape model fitted on the *other* models predicts that model's ``lin(T)`` at every
    TP degree, scored against its measured ``lin(T)``."""
    table = read_op_table(directory, gpu_dir)
    out: dict[str, Any] = {}
    pooled_y, pooled_p = [], []
    by_tp: dict[str, tuple[list[np.ndarray], list[np.ndarray]]] = {}
    for stem in sorted(table["table"].unique()):
        name = _table_model(stem)
        others = table[table["table"] != stem]
        if name is None or others.empty:
            continue
        shape = fit_shape_model(others)
        spec = get_model(name)
        per_tp = {}
        ys, ps = [], []
        for tp in VIDUR_TP:
            meas = read_ops(directory, gpu_dir, spec, tp)
            if meas.empty:
                continue
            pred = shape_lin(shape, spec, tp, meas["num_tokens"].to_numpy())["lin_ms"].to_numpy()
            per_tp[str(tp)] = quality(meas["lin_ms"].to_numpy(), pred)
            by_tp.setdefault(str(tp), ([], []))[0].append(meas["lin_ms"].to_numpy())
            by_tp[str(tp)][1].append(pred)
            ys.append(meas["lin_ms"].to_numpy())
            ps.append(pred)
        out[spec.name] = {"all": quality(np.concatenate(ys), np.concatenate(ps)), "by_tp": per_tp,
                          "fitted_on": sorted(others["table"].unique().tolist())}
        pooled_y += ys
        pooled_p += ps
    if not out:
        raise FitError(f"the shape model needs Vidur tables of at least two known models in {directory}/{gpu_dir}")
    return {"models": out, "all": quality(np.concatenate(pooled_y), np.concatenate(pooled_p)),
            "by_tp": {tp: quality(np.concatenate(ys), np.concatenate(ps)) for tp, (ys, ps) in by_tp.items()}}


def linear_ops(directory: Path, gpu: str, spec: ModelSpec, tp: int = 1,
               shape: dict[str, Any] | None = None) -> tuple[pd.DataFrame, str]:
    """``lin(T)`` of ``spec`` on ``gpu`` at TP ``tp`` and where it comes from: Vidur's own table of the
    model when there is one (``"measured"``), else the shape model fitted on the GPU's tables
    (``"shape model"``, at the token counts Vidur profiled the other models at)."""
    gpu_dir = GPUS[gpu]["ops"]
    fname = VIDUR_NAMES.get(spec.name)
    if fname is not None and (Path(directory) / gpu_dir / f"{fname}_mlp.csv").exists():
        return read_ops(directory, gpu_dir, spec, tp), "measured"
    table = read_op_table(directory, gpu_dir)
    if shape is None:
        shape = fit_shape_model(table)
    tokens = np.unique(table["num_tokens"].to_numpy())
    tokens = tokens[tokens <= 4096]
    return shape_lin(shape, spec, tp, tokens), "shape model"


def fit_linear_ops(ops: pd.DataFrame, k: int = 5) -> dict[str, Any]:
    """Fit ``lin(T)`` with a roofline ``a + max(c_mem, c_tok*T)`` and a line ``a + c_tok*T``; held-out by k-fold over T."""
    T = ops["num_tokens"].to_numpy(float)
    y = ops["lin_ms"].to_numpy(float)
    forms = {
        "roofline": ([ParamSpec("a", 1.0, 0, 1e3), ParamSpec("c_mem", float(y.min()), 0, 1e4),
                      ParamSpec("c_tok", float((y.max() - y.min()) / T.max()), 0, 10)],
                     lambda t, a, cm, ct: a + np.maximum(cm, ct * t)),
        "linear": ([ParamSpec("a", float(y.min()), 0, 1e4), ParamSpec("c_tok", float((y.max() - y.min()) / T.max()), 0, 10)],
                   lambda t, a, ct: a + ct * t),
    }
    res = {}
    for name, (specs, f) in forms.items():
        full = fit_params(lambda *th: f(T, *th), specs, y, y, f"vidur/{name}")  # relative errors
        oof = np.full(len(T), np.nan)
        for tr, te in grouped_folds(np.arange(len(T)), k):
            ft = fit_params(lambda *th: f(T[tr], *th), specs, y[tr], y[tr], f"vidur/{name}")
            oof[te] = f(T[te], *ft.values.values())
        res[name] = {"params": full.values, "stderr": full.stderr, "train": quality(y, f(T, *full.values.values())),
                     "heldout": {"all": quality(y, oof)}}
    best = choose({n: {"heldout": v["heldout"]["all"], "params": v["params"]} for n, v in res.items()})
    return {"chosen": best, **res}


#: all-reduce constants of A100 (SXM4, NVLink 3) tensor parallelism: estimates, not measured here
A100_ALLREDUCE = {"tp_allreduce_alpha_s": 8e-6, "tp_link_gbps": 230.0}
A100_ALLREDUCE_NOTE = ("Tensor parallelism on the A100s: Vidur's operator tables time each rank's shard of the linear "
                       "ops without the two all-reduces per layer; twin/tensor_parallel.py adds them with "
                       "tp_allreduce_alpha_s = 8 us per collective (NCCL ring latency at small messages, an estimate) "
                       "and tp_link_gbps = 230 GB/s (NCCL all-reduce bus bandwidth of an 8x A100 SXM4 NVLink 3 "
                       "server as nccl-tests report it, an estimate; unit GB/s = 1e9 B/s).")


def _has_table(directory: Path, gpu_dir: str, spec: ModelSpec) -> bool:
    """Whether Vidur profiled ``spec`` itself on ``gpu_dir``."""
    fname = VIDUR_NAMES.get(spec.name)
    return fname is not None and (Path(directory) / gpu_dir / f"{fname}_mlp.csv").exists()


def _tp_backbones(directory: Path, gpu: str, spec: ModelSpec, shape: dict[str, Any] | None, k: int, overhead: float,
                  c_eager: float, c_seq_ref: float, bw: float, s_per_flop: float,
                  units: dict[str, str]) -> dict[str, Any]:
    """Backbone parameters per TP degree > 1 from Vidur's TP-specific timings (each rank's shard of
    every linear op, measured or from the shape model), with the estimated terms split as vLLM splits
    them: the LM head is column-parallel over the vocabulary (``1/tp`` of its read and GEMM per rank),
    the KV cache holds ``max(1, kv_heads/tp)`` heads per rank (decode attention reads that share), the
    per-step overhead, eager-launch and sampling costs stay. :func:`twin.tensor_parallel.tp_profile`
    uses them instead of its analytical split, and adds the all-reduces."""
    out: dict[str, Any] = {}
    lm_head_bytes = float(spec.hidden * spec.vocab * spec.dtype_bytes)
    c_seq_lm = 2.0 * spec.hidden * spec.vocab * s_per_flop
    for tp in VIDUR_TP[1:]:
        if tp not in valid_degrees(spec):
            continue
        ops, source = linear_ops(directory, gpu, spec, tp, shape)
        if ops.empty:
            continue
        f = fit_linear_ops(ops, k)
        p = f["roofline"]["params"] if f["chosen"] == "roofline" else {
            "a": f["linear"]["params"]["a"], "c_mem": 0.0, "c_tok": f["linear"]["params"]["c_tok"]}
        params = {"c0": p["a"] * 1e-3 + overhead, "c_eager": c_eager,
                  "c_mem": p["c_mem"] * 1e-3 + lm_head_bytes / tp / bw, "c_tok": p["c_tok"] * 1e-3,
                  "c_seq": c_seq_lm / tp + c_seq_ref, "c_ctx": kv_bytes_per_token_per_rank(spec, tp) / bw,
                  "graph_max_tokens": float(GRAPH_MAX_TOKENS)}
        out[str(tp)] = {"params": params, "units": dict(units),
                        "fit": {"train": f[f["chosen"]]["train"], "heldout": f[f["chosen"]]["heldout"],
                                "target": f"Vidur linear-op time per step of one rank at TP {tp} ({source})",
                                "linear_ops": {"form": f["chosen"], "params_ms": p}},
                        "method": f"linear ops: {f['chosen']} fitted to Vidur's {GPUS[gpu]['ops'].upper()} TP-{tp} "
                                  f"timings ({source}); LM head and KV reads per rank (1/{tp} of the vocabulary, "
                                  f"{max(1, spec.kv_heads // tp)} of {spec.kv_heads} KV heads); overhead, c_eager "
                                  f"and sampling as at TP 1"}
    return out


def _reference(refs: list[str]) -> dict[str, Profile]:
    out = {}
    for r in refs:
        p = load_profile(r)
        out[p.software] = p
    if "vllm-0.8.5" not in out:
        raise FitError("the A40 profile needs a vLLM 0.8.5 reference profile (e.g. llama-3.1-8b_h100_vllm085) for the "
                       "estimated parts; fit it first or pass --reference")
    return out


def fit_vidur(directory: str | Path, model: str | ModelSpec = "llama-2-7b", gpu: str = "a40", command: str = "",
              references: list[str] | None = None, k: int = 5, data_root: Path | None = None) -> dict[str, Any]:
    spec = model if isinstance(model, ModelSpec) else get_model(model)
    gpu = GPU_ALIASES.get(gpu.lower(), gpu.lower())
    if gpu not in GPUS:
        raise ValueError(f"unknown GPU {gpu!r} for Vidur timings; choose from {sorted(GPUS)}")
    d = Path(directory)
    gpu_dir = GPUS[gpu]["ops"]
    refs = _reference(list(references or DEFAULT_REFERENCES))
    r085 = refs["vllm-0.8.5"]
    r050 = refs.get("vllm-0.5.0")
    shape = None if _has_table(d, gpu_dir, spec) else fit_shape_model(read_op_table(d, gpu_dir))
    ops, ops_source = linear_ops(d, gpu, spec, 1, shape)
    ops7 = read_ops(d, gpu_dir, get_model("llama-2-7b"))
    ops_h100 = read_ops(d, "h100", get_model("llama-2-7b"))
    fit = fit_linear_ops(ops, k)
    notes: list[str] = []
    if shape is not None:
        ho = shape_model_heldout(d, gpu_dir, k)
        notes.append(f"Vidur did not profile {spec.name} on the {GPUS[gpu]['name']}: its lin(T) at every TP degree is "
                     f"predicted by a shape model fitted with curve_fit on the {gpu_dir.upper()} operator timings of "
                     f"{', '.join(sorted(read_op_table(d, gpu_dir)['table'].unique()))} (GEMMs: t0 + max(2(KN + MK + MN) "
                     f"B / {shape['gemm']['params']['bw_gbps']:.0f} GB/s, 2MKN / "
                     f"{shape['gemm']['params']['tflops']:.0f} TFLOP/s) with t0 = {shape['gemm']['params']['t0']:.4f} "
                     f"ms; element-wise ops e0 + bytes / bw each). Fitted without one model, it predicts that model's "
                     f"measured lin(T) with MAPE "
                     + ", ".join(f"{m} {q['all']['mape_pct']:.1f} % (bias {q['all']['bias_pct']:+.1f} %)"
                                 for m, q in ho["models"].items())
                     + f"; {spec.name}'s GEMMs are larger than the profiled ones (extrapolation in K and N).")
    if GPUS[gpu].get("capped"):
        notes.append(f"{GPUS[gpu]['name']}: {GPUS[gpu]['capped']}.")

    # ratios of this GPU to the H100 from Vidur's own timings of the same model (Llama-2-7B)
    lin1 = float(ops7.loc[ops7["num_tokens"] <= 16, "lin_ms"].median())
    lin1_h = float(ops_h100.loc[ops_h100["num_tokens"] <= 16, "lin_ms"].median())
    mem_ratio = lin1 / lin1_h
    big = ops7["num_tokens"] >= 1024
    tok7 = float(np.polyfit(ops7.loc[big, "num_tokens"], ops7.loc[big, "lin_ms"], 1)[0])
    bigh = ops_h100["num_tokens"] >= 1024
    tok_h = float(np.polyfit(ops_h100.loc[bigh, "num_tokens"], ops_h100.loc[bigh, "lin_ms"], 1)[0])
    flop_ratio = tok7 / tok_h
    big = ops["num_tokens"] >= 1024
    tok = float(np.polyfit(ops.loc[big, "num_tokens"], ops.loc[big, "lin_ms"], 1)[0])
    wbytes = linear_weight_bytes(spec)
    bw = wbytes / (float(ops["lin_ms"].iloc[0]) * 1e-3)  # effective memory-bound bandwidth (B/s)
    flops_per_token = 2.0 * wbytes / spec.dtype_bytes
    s_per_flop = tok * 1e-3 / flops_per_token
    notes.append(f"Vidur {gpu_dir.upper()} linear ops of {spec.name}{'' if shape is None else ' (shape model)'}: "
                 f"lin(1) = {float(ops['lin_ms'].iloc[0]):.2f} ms "
                 f"(effective bandwidth {bw / 1e9:.0f} GB/s over {wbytes / 1e9:.2f} GB of linear weights), "
                 f"{tok * 1e3:.1f} us per token above 1024 tokens ({flops_per_token / tok / 1e9:.0f} TFLOP/s); "
                 f"ratios to Vidur's H100: memory-bound {mem_ratio:.2f}x, compute-bound {flop_ratio:.2f}x.")

    # backbone ------------------------------------------------------------------------------
    p = fit["roofline"]["params"] if fit["chosen"] == "roofline" else {"a": fit["linear"]["params"]["a"], "c_mem": 0.0,
                                                                       "c_tok": fit["linear"]["params"]["c_tok"]}
    lm_head_bytes = float(spec.hidden * spec.vocab * spec.dtype_bytes)
    lm_head_read_s = lm_head_bytes / bw
    c_seq_lm = 2.0 * spec.hidden * spec.vocab * s_per_flop
    # overhead outside the linear ops, from the H100 vLLM 0.8.5 profile (Llama-3.1-8B) minus Vidur's H100 linear ops
    ref_model = r085.model
    ref_step_1 = float(r085.backbone_s(0, 1, 0))
    scale = linear_weight_bytes(ref_model) / linear_weight_bytes(get_model("llama-2-7b"))
    bw_h = linear_weight_bytes(get_model("llama-2-7b")) / (lin1_h * 1e-3)
    ref_lin_1 = lin1_h * 1e-3 * scale + ref_model.hidden * ref_model.vocab * ref_model.dtype_bytes / bw_h
    overhead = max(ref_step_1 - ref_lin_1, 0.0)
    ref_bb = r085.components["backbone"].params
    c_eager = float(ref_bb.get("c_eager", 0.0))
    c_seq_ref = float(ref_bb.get("c_seq", 0.0))
    c_ctx = spec.kv_bytes_per_token / bw
    notes.append(f"Per-step overhead outside the linear ops: {overhead * 1e3:.2f} ms = the {r085.name} step at one "
                 f"sequence ({ref_step_1 * 1e3:.2f} ms) minus Vidur's H100 linear-op time scaled to {ref_model.name} "
                 f"plus its LM-head read ({ref_lin_1 * 1e3:.2f} ms); assumed hardware-independent (CPU, launches). "
                 f"Vidur's H100 (80 GB) and the measured H100 (64 GB) may differ in bandwidth, so this is uncertain by "
                 f"a few ms. c_eager ({c_eager * 1e3:.2f} ms) is carried over likewise.")
    L = 1024
    attn_share = 4 * spec.layers * spec.hidden * (L / 2) / flops_per_token
    notes.append(f"Decode attention: c_ctx = {spec.kv_bytes_per_token} B/token / {bw / 1e9:.0f} GB/s = "
                 f"{c_ctx * 1e9:.1f} ns per context token. Prefill attention FLOPs are not modelled: "
                 f"{attn_share * 100:.1f} % of the linear FLOPs per token for a {L}-token prompt.")
    notes.append(f"LM head (not in Vidur's linear ops): {lm_head_read_s * 1e3:.2f} ms weight read per step added to "
                 f"c_mem; {c_seq_lm * 1e6:.2f} us per decode sequence of GEMM plus the reference's per-sequence "
                 f"cost ({c_seq_ref * 1e6:.2f} us, sampling) as c_seq.")
    params = {"c0": p["a"] * 1e-3 + overhead, "c_eager": c_eager, "c_mem": p["c_mem"] * 1e-3 + lm_head_read_s,
              "c_tok": p["c_tok"] * 1e-3, "c_seq": c_seq_lm + c_seq_ref, "c_ctx": c_ctx,
              "graph_max_tokens": float(GRAPH_MAX_TOKENS)}
    se = fit["roofline"]["stderr"] if fit["chosen"] == "roofline" else fit["linear"]["stderr"]
    backbone = FORMS[("backbone", "graph_roofline")](params=params).to_dict()
    backbone.update({
        "stderr": {"c_tok": se.get("c_tok", np.nan) * 1e-3, "c_mem": se.get("c_mem", np.nan) * 1e-3,
                   "c0": se.get("a", np.nan) * 1e-3},
        "fit": {"train": fit[fit["chosen"]]["train"], "heldout": fit[fit["chosen"]]["heldout"],
                "target": "Vidur linear-op time per step lin(T) (the measured part only)",
                "linear_ops_forms": {n: {"params": fit[n]["params"], "heldout": fit[n]["heldout"]}
                                     for n in ("roofline", "linear")}},
        "selection": {"chosen": f"graph_roofline (linear ops: {fit['chosen']} fitted to Vidur's {gpu.upper()} timings; "
                                "other terms estimated)",
                      "heldout": f"{k}-fold over the token counts of the operator table"},
        "method": f"lin(T) = {spec.layers} x (per-layer linear ops at T tokens) + embedding(T), median of Vidur's "
                  f"repetitions ({ops_source}), TP 1; fitted with relative errors; see notes for the estimated terms",
    })
    if shape is not None:  # the honest quality: predicting a model the shape model never saw
        backbone["fit"]["fit_to_shape_model"] = backbone["fit"].pop("heldout")
        backbone["fit"]["heldout"] = {"all": ho["all"], **{f"without {m}": q["all"] for m, q in ho["models"].items()}}
        backbone["fit"]["target"] = ("Vidur linear-op time per step lin(T) of models the shape model did not see "
                                     "(leave one model out, every TP degree)")
        backbone["selection"]["heldout"] = "leave one profiled model out of the shape model's fit"
    tp_tables = _tp_backbones(d, gpu, spec, shape, k, overhead, c_eager, c_seq_ref, bw, s_per_flop, backbone["units"])
    if shape is not None:
        for t, v in tp_tables.items():  # as at TP 1: the shape model's error on models it did not see
            v["fit"]["fit_to_shape_model"] = v["fit"].pop("heldout")
            v["fit"]["heldout"] = {"all": ho["by_tp"][t]}
        backbone["fit"]["heldout"].update({f"TP {t}": ho["by_tp"][t] for t in tp_tables})
    if tp_tables:
        backbone["tensor_parallel"] = tp_tables
        if shape is None:
            backbone["fit"]["heldout"].update({f"TP {t}": v["fit"]["heldout"]["all"] for t, v in tp_tables.items()})
        if gpu_dir == "a100":
            backbone["params"].update(A100_ALLREDUCE)
            backbone["units"].update({"tp_allreduce_alpha_s": "s per all-reduce", "tp_link_gbps": "GB/s"})
            notes.append(A100_ALLREDUCE_NOTE)

    # LoRA (estimated) ------------------------------------------------------------------------
    lref = r085.components["lora"]
    size_ratio = spec.adapter_bytes(8) / ref_model.adapter_bytes(8)
    if lref.form == "additive":
        lp = dict(lref.params)
        lora_params = {"l0": lp["l0"], "l_adapter": lp["l_adapter"] * mem_ratio * size_ratio,
                       "l_token": lp["l_token"] * flop_ratio * size_ratio,
                       "l_adapter_token": lp.get("l_adapter_token", 0.0) * flop_ratio * size_ratio}
        if r050 is not None and r050.components["lora"].form == "additive":
            lora_params["rank_coef"] = float(r050.components["lora"].params.get("rank_coef", 0.0))
        lora = FORMS[("lora", "additive")](params=lora_params).to_dict()
        lora_method = (f"estimated from {r085.name}'s LoRA fit: l0 kept (launch overhead), per-adapter terms x "
                       f"{mem_ratio:.2f} (memory-bound ratio) and per-token terms x {flop_ratio:.2f} (compute-bound "
                       f"ratio), both x {size_ratio:.3f} (adapter size {spec.name} / {ref_model.name})"
                       + ("; rank_coef from the vLLM 0.5.0 Llama-2-7B fit" if r050 is not None else ""))
    elif lref.form == "kernel_grid":
        # the same vLLM kernels on this model's dimensions; thread blocks are dispatched over the
        # GPU's SMs, so the cost per block scales with the reference GPU's SM count over this one's
        sm_ratio = GPUS["h100"]["sms"] / GPUS[gpu]["sms"]
        lp = dict(lref.params)
        lora_params = {**lp, "layers": float(spec.layers), "hidden": float(spec.hidden),
                       "intermediate": float(spec.intermediate), "q_dim": float(spec.heads * spec.head_dim),
                       "kv_dim": float(spec.kv_heads * spec.head_dim), "vocab": float(spec.vocab),
                       "l_cta": lp["l_cta"] * sm_ratio, "l_active": lp["l_active"] * sm_ratio,
                       "l_adapter": lp["l_adapter"] * mem_ratio * size_ratio,
                       "l_token": lp["l_token"] * flop_ratio * size_ratio}
        lora = FORMS[("lora", "kernel_grid")](params=lora_params).to_dict()
        lora_method = (f"estimated from {r085.name}'s LoRA fit (vLLM 0.8.5 kernel grids): the thread-block counts "
                       f"from {spec.name}'s dimensions, the cost per launched and per working block x {sm_ratio:.2f} "
                       f"(H100 SMs / {GPUS[gpu]['name']} SMs), per-adapter terms x {mem_ratio:.2f} x {size_ratio:.3f}, "
                       f"per-token terms x {flop_ratio:.2f} x {size_ratio:.3f}"
                       + (f"; the 64-split block price (split64_cost {lp['split64_cost']:.4g}) carried over"
                          if "split64_cost" in lp else ""))
    else:
        lora = lref.to_dict()
        lora_method = f"carried over from {r085.name}"
    lora.update({"fit": {"heldout": {"all": {"note": "estimated, not fitted"}}}, "method": lora_method})

    # scheduler (carried over) ------------------------------------------------------------------
    sched = r085.components["scheduler"].to_dict()
    sched.update({"fit": {"heldout": {"all": {"note": f"carried over from {r085.name}"}}},
                  "method": f"host CPU time: carried over unchanged from {r085.name} (not measurable from GPU "
                            f"operator timings)"})
    for key in ("candidates", "selection", "data", "stderr"):
        sched.pop(key, None)

    # loads -------------------------------------------------------------------------------------
    lpar = dict(r085.components["load"].params)
    load_params = {"disk_fixed_s": lpar["disk_fixed_s"], "disk_gbps": lpar["disk_gbps"],
                   "cpu_fixed_s": lpar["cpu_fixed_s"], "cpu_gbps": GPUS[gpu]["host_link_gbps"]}
    load = FORMS[("load", "link")](params=load_params).to_dict()
    load.update({"fit": {"heldout": {"all": {"note": "estimated"}}},
                 "method": f"fixed costs and disk bandwidth from {r085.name} (software and host); CPU->GPU bandwidth "
                           f"of the {GPUS[gpu]['name']}'s {GPUS[gpu]['link']}; no per-rank table"})

    # KV ----------------------------------------------------------------------------------------
    kref = (r050 or r085).components["kv"]
    kp = dict(kref.params)
    ref_free = kp["free_bytes"]
    kref_model = (r050 or r085).model
    reserve = 0.9 * 64 * 2 ** 30 - kref_model.weight_bytes - ref_free
    free = 0.9 * GPUS[gpu]["memory_bytes"] - spec.weight_bytes - reserve
    slot_scale = spec.adapter_bytes(8) / kref_model.adapter_bytes(8)
    kv_params = {"free_bytes": free, "lora_fixed_bytes": kp.get("lora_fixed_bytes", 0.0),
                 "slot_fixed_bytes": kp.get("slot_fixed_bytes", 0.0) * slot_scale,
                 "slot_bytes_per_rank": kp["slot_bytes_per_rank"] * slot_scale,
                 "kv_bytes_per_token": float(spec.kv_bytes_per_token)}
    kv = FORMS[("kv", "memory_budget_affine")](params=kv_params).to_dict()
    kvm = FORMS[("kv", "memory_budget_affine")](params=kv_params)
    kv.update({"fit": {"heldout": {"all": {"note": "estimated"}}},
               "method": f"0.9 x {GPUS[gpu]['memory_bytes'] / 2 ** 30:.2f} GiB - weights ({spec.weight_bytes / 1e9:.2f} GB) "
                         f"- runtime reserve {reserve / 1e9:.2f} GB (measured for {kref_model.name} on the 64 GiB H100 "
                         f"by {(r050 or r085).name}) - LoRA slot buffers per slot and rank from that fit; capacity "
                         f"with LoRA disabled {kvm.predict(0, 0)} tokens, 8 slots of rank 16: {kvm.predict(8, 16)}"
                         + ("" if spec.name == kref_model.name else
                            f"; the reserve is {kref_model.name}'s, carried over to {spec.name} (an estimate: a larger "
                            f"model's activation peak is larger, so this capacity is an upper estimate)")
                         + ("; a negative free_bytes means the weights do not fit on one GPU: tensor parallelism "
                            "(twin run --tp) splits them" if free <= 0 else "")})

    tables = ([str(Path(gpu_dir) / f"{VIDUR_NAMES[spec.name]}_mlp.csv")] if shape is None
              else sorted(str(Path(gpu_dir) / f"{t}.csv") for t in read_op_table(d, gpu_dir)["table"].unique()))
    tables += [str(Path(gpu_dir) / f"{VIDUR_NAMES['llama-2-7b']}_mlp.csv"),
               str(Path("h100") / f"{VIDUR_NAMES['llama-2-7b']}_mlp.csv")]
    prov = provenance(d, sorted(set(tables)), command,
                      "see the module docstring of calibration.fitting.vidur and each component's method",
                      data_root=data_root,
                      extra={"source": "Vidur profiling data (microsoft/vidur, data/profiling/compute, MIT License)",
                             "reference_profiles": {v.name: v.raw.get("provenance", {}).get("command", "")
                                                    for v in refs.values()},
                             "validation_data_used": False, "format": "vidur", "vidur_gpu": gpu,
                             "linear_ops": ops_source})
    name = f"{spec.name}_{gpu}_vidur"
    setup = "Chameleon's set-up" if gpu == "a40" else "Chameleon's scaling study"
    out = build_profile(name, spec.name, GPUS[gpu]["name"], "vidur-ops+estimates (vLLM 0.8.5-like engine)",
                        f"{spec.name} on one {GPUS[gpu]['name']} ({setup}): linear layers from Vidur's "
                        + ("measured operator timings" if shape is None else "operator timings of other models through "
                           "a fitted shape model") + ", the rest estimated (see notes)",
                        {"backbone": backbone, "lora": lora, "scheduler": sched, "load": load, "kv": kv}, prov,
                        ALL_TARGETS, None, notes)
    out["gpu_memory_bytes"] = int(GPUS[gpu]["memory_bytes"])
    return out
