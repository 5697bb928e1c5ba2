#!/usr/bin/env bash
# One time-boxed GPU session of `twin calibrate bench`, prepared for a lent H100/H200 (the `device`
# tool's `run`, 15 minutes of device time in all, the machine's start included), in four processes so
# that one part's failure or time-out keeps the others:
#   1. `step` (Llama-3.1-8B) and 2. `step` (Qwen-2.5-7B): mixed prefill + decode steps of the model with
#      random weights up to 300k context tokens, each captured in a CUDA graph and replayed
#      (`--step-graphs`: the GPU's time, as vLLM replays its steps; eager steps of a 32-layer model time
#      the host's launches below ~1,000 tokens); stopped after 100 / 70 s with the rows so far (a seeded
#      order, so a stopped sweep is an even sample),
#   3. `check,lora`: the Triton kernels checked against their torch references in the run's dtype, then
#      the Triton SGMV/BGMV kernels at ranks 8-128 and 8-512 adapters per batch and vLLM 0.8.5's
#      slot-grid kernels (blocks launched for every slot) at 8-512 slots (stopped after 90 s),
#   4. `linear,h2d,load`: the base model's linear operators, host-to-GPU copies alone and concurrent,
#      adapter loads from disk and from CPU memory.
# Each process has a hard `timeout` as well (160 + 130 + 150 + 90 s at most; about 5.5 minutes in all on
# an H200). Needs python3 with torch, triton, numpy, pandas and safetensors (the GPU machine's image has
# them); nothing is installed. Kernels checked beforehand to compile for sm_90 with Triton 3.6 (the H200
# image's) as well as 3.9. First run on an H200 on 2026-11-29: results/calibration/bench_h200/.
#
#   OUT=/some/dir bash calibration/bench/device_session.sh          # DEVICE=cpu SMALL=1: a dry run here
#
# Writes $OUT/log.txt, $OUT/env.txt and $OUT/bench.tgz (folders step/, step_qwen/, lora/, rest/, each with
# its tables and bench_meta.json). Back here:
#   mkdir -p runs/gpu && tar -xzf bench.tgz -C runs/gpu
#   twin calibrate bench-report runs/gpu/step --markdown runs/gpu/step/report.md --plot runs/gpu/step/steps.png
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-runs/device}"
DEVICE="${DEVICE:-cuda}"
SIZE=(--model-dims llama-3.1-8b)
QWEN=(--model-dims qwen-2.5-7b)
GRAPHS=(--step-graphs)
[ -n "${SMALL:-}" ] && SIZE=(--small) && QWEN=(--small --model-dims qwen-2.5-7b)
[ "$DEVICE" = cpu ] && GRAPHS=()
W="$OUT/work"
mkdir -p "$W"
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,power.limit --format=csv || true
  python3 -c "import torch, triton, numpy, pandas; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'numpy', numpy.__version__, 'pandas', pandas.__version__)"
  nproc; free -g | head -2
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

bench() {  # bench <name> <seconds> <args...>
  local name=$1 limit=$2
  shift 2
  echo "=== $name: $(date -u +%T), timeout ${limit}s"
  timeout -k 5 "$limit" python3 -m calibration.bench --device "$DEVICE" "${SIZE[@]}" --out "$W/$name" "$@"
  echo "=== $name: exit $? at $(date -u +%T)"
}
{
  bench step 160 --parts step "${GRAPHS[@]}" --step-time-limit 100
  bench step_qwen 130 --parts step "${GRAPHS[@]}" --step-time-limit 70 "${QWEN[@]}"
  bench lora 150 --parts check,lora --ranks 8,16,32,64,128 --adapters 8,32,128,512 --slots 8,32,128,512 \
      --lora-tokens 16,256,1024,4096 --repeats 10 --warmup 3 --lora-time-limit 90
  bench rest 90 --parts linear,h2d,load --ranks 8,16,32,64,128 --repeats 10 --warmup 3 --load-repeats 5
} 2>&1 | tee "$OUT/log.txt"
tar -czf "$OUT/bench.tgz" -C "$W" . && rm -rf "$W"
ls -la "$OUT"
