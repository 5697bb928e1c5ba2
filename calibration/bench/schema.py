"""Column lists of the tables ``twin calibrate bench`` writes (torch-free).

The fitting code reads these tables; the first columns of each list are the contract, the
``*_EXTRA`` columns follow them and carry labels (device, dtype, ...) that a reader may ignore.
"""

from __future__ import annotations

#: Vidur's per-operator order (``vidur/profiling/mlp``): one transformer layer, no attention.
LINEAR_OPS = (
    "emb",
    "input_layernorm",
    "attn_pre_proj",
    "attn_rope",
    "attn_post_proj",
    "post_attention_layernorm",
    "mlp_up_proj",
    "mlp_act",
    "mlp_down_proj",
    "add",
)
STATS = ("min", "max", "mean", "median", "std")

#: Exactly the columns (and order) of Vidur's ``*_mlp.csv`` profiling files; times in ms.
LINEAR_OPS_COLUMNS = [f"time_stats.{op}.{s}" for op in LINEAR_OPS for s in STATS] + [
    "n_head",
    "n_kv_head",
    "n_embd",
    "n_expanded_embd",
    "vocab_size",
    "use_gated_mlp",
    "num_tokens",
    "num_tensor_parallel_workers",
]
LINEAR_OPS_EXTRA = ["model", "device", "dtype", "repeats"]

#: Columns of ``shared/data/calibration/vllm085_h100/adapter_load.csv``.
ADAPTER_LOAD_COLUMNS = [
    "model",
    "adapter_rank",
    "max_lora_rank",
    "adapter_slots",
    "max_cpu_loras",
    "load_kind",
    "phase",
    "load_index",
    "load_ms",
    "raw_path",
]
#: ``dtype``: the adapter weights' (the model's serving dtype; bfloat16 when the run's ``--dtype`` is)
ADAPTER_LOAD_EXTRA = ["device", "bytes", "memory", "page_cache", "dtype"]
LOAD_KINDS = ("disk_to_cpu", "cpu_to_gpu")

LORA_KERNELS = ("sgmv_shrink", "sgmv_expand", "bgmv_shrink", "bgmv_expand", "slot_shrink", "slot_expand")
#: ``kernel`` is one of LORA_KERNELS, or ``torch_ref`` for the plain-torch reference of the
#: operation named in ``op`` (GPU runs time both; see :mod:`calibration.bench.lora`).
LORA_KERNEL_COLUMNS = [
    "kernel",
    "batch_tokens",
    "n_adapters",
    "rank",
    "d_in",
    "d_out",
    "dtype",
    "time_ms_mean",
    "time_ms_std",
    "repeats",
    "device",
]
#: ``slots``: the adapter slots of the weight stacks (the slot-grid kernels launch blocks for every one);
#: ``blocks_launched`` / ``blocks_working``: a slot-grid call's thread blocks, all and those that work
LORA_KERNEL_EXTRA = ["op", "impl", "module", "max_rank", "time_ms_median", "time_ms_min", "slots", "blocks_launched",
                     "blocks_working"]

H2D_COPY_COLUMNS = [
    "adapter_rank",
    "bytes",
    "memory",
    "concurrent",
    "time_ms_mean",
    "time_ms_std",
    "gbps",
    "device",
]
#: ``dtype``: the run's compute dtype (the ``with_compute`` job's GEMMs; the copies move bytes). ``with_compute``:
#: the copies ran while a compute job ran on another CUDA stream (``overlap=cuda_streams``; on the CPU the two ran
#: one after the other, ``overlap=sequential``); such a row's ``time_ms_*``/``gbps`` are the copies' makespan
#: with the job running, ``copy_ms_alone``/``compute_ms_alone`` each alone in the same repeats, ``compute_ms`` the
#: job with the copies, ``*_slowdown`` the ratios, ``compute_gemms`` the job's GEMMs. Older tables lack these
#: columns (every row is then a copy alone; :func:`calibration.bench.transfer_report.read_h2d_table`).
H2D_COPY_EXTRA = ["model", "repeats", "time_ms_min", "timer", "dtype", "with_compute", "overlap", "copy_ms_alone",
                  "copy_slowdown", "compute_ms", "compute_ms_alone", "compute_slowdown", "compute_gemms"]

#: ``step_bench.csv`` (calibration/bench/step.py): one forward pass of a mixed prefill + decode step;
#: ``context_tokens`` is the twin's ``C`` (decode contexts plus each chunk's prior context)
STEP_BENCH_COLUMNS = [
    "batch_tokens",
    "prefill_tokens",
    "prefill_seqs",
    "prefill_ctx_before",
    "decodes",
    "decode_ctx_per_seq",
    "context_tokens",
    "time_ms_mean",
    "time_ms_std",
    "repeats",
    "device",
]
STEP_BENCH_EXTRA = ["model", "layers", "dtype", "attention", "time_ms_median", "time_ms_min", "time_ms_max",
                    "lm_head_rows", "timer"]

KERNEL_CHECK_COLUMNS = ["case", "kernel", "dtype", "device", "interpreted", "max_abs_err", "atol", "ok"]

TABLES = {
    "linear_ops.csv": LINEAR_OPS_COLUMNS + LINEAR_OPS_EXTRA,
    "adapter_load.csv": ADAPTER_LOAD_COLUMNS + ADAPTER_LOAD_EXTRA,
    "lora_kernels.csv": LORA_KERNEL_COLUMNS + LORA_KERNEL_EXTRA,
    "h2d_copy.csv": H2D_COPY_COLUMNS + H2D_COPY_EXTRA,
    "kernel_check.csv": KERNEL_CHECK_COLUMNS,
    "step_bench.csv": STEP_BENCH_COLUMNS + STEP_BENCH_EXTRA,
}
META_FILE = "bench_meta.json"
