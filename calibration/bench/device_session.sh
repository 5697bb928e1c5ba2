#!/usr/bin/env bash
# One time-boxed GPU session of `twin calibrate bench`, prepared for a lent H100/H200 (the `device`
# tool's `run`, 15 minutes of device time in all): every part at Llama-3.1-8B's dimensions --
#   * the Triton SGMV/BGMV kernels at ranks 8-128 and 8-512 adapters per batch, and vLLM 0.8.5's
#     slot-grid kernels (blocks launched for every slot) at 8-512 slots,
#   * mixed prefill + decode steps of the model with random weights up to 300k context tokens
#     (part `step`, stopped after --step-time-limit seconds with the rows so far),
#   * host-to-GPU copies alone and concurrent, adapter loads, the base model's linear operators,
#   * the Triton kernels checked against their torch references in the run's dtype.
# The LoRA and step sweeps stop after 150 s each (seeded orders: a stopped sweep is an even sample).
# About 6 minutes on an H200 (an estimate: not yet run on one). Needs python3 with torch, triton,
# numpy, pandas and safetensors (the GPU machine's image has them); nothing is installed.
#
#   OUT=/some/dir bash calibration/bench/device_session.sh
#
# Writes $OUT/bench/: linear_ops.csv, lora_kernels.csv, h2d_copy.csv, adapter_load.csv,
# kernel_check.csv, step_bench.csv, bench_meta.json and log.txt (8 files). Back here:
#   twin calibrate bench-report <that folder> --markdown results/calibration/bench_<gpu>.md
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-runs/device}"
mkdir -p "$OUT/bench"
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  python3 -m calibration.bench --device cuda --model-dims llama-3.1-8b --out "$OUT/bench" \
      --ranks 8,16,32,64,128 --adapters 8,32,128,512 --slots 8,32,128,512 --lora-tokens 16,256,1024,4096 \
      --repeats 10 --warmup 3 --load-repeats 5 --lora-time-limit 150 --step-time-limit 150
} 2>&1 | tee "$OUT/bench/log.txt"
