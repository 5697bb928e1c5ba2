#!/usr/bin/env bash
# One time-boxed GPU session of `twin calibrate bench`, prepared for a lent H100/H200 (the `device` tool's
# `run`: at most 10 minutes a command, 15 minutes of device time in all, the machine's start included), in four
# processes so that one part's failure or time-out keeps the others, all in bfloat16 (Llama-3.1 and Qwen-2.5
# serve in bf16; every table has a dtype column):
#   1. `step` (Llama-3.1-8B) and 2. `step` (Qwen-2.5-7B): mixed prefill + decode steps of the model with
#      random weights up to 300k context tokens, each captured in a CUDA graph and replayed
#      (`--step-graphs`: the GPU's time, as vLLM replays its steps; eager steps of a 32-layer model time
#      the host's launches below ~1,000 tokens); a sweep stops before a shape that would end past 90 / 60 s,
#      with the rows so far (a seeded order, so a stopped sweep is an even sample; 154 shapes took 84 / 67 s),
#   3. `check,lora`: the Triton kernels checked against their torch references in the run's dtype, then
#      the Triton SGMV/BGMV kernels at ranks 8-128 and 8-512 adapters per batch and vLLM 0.8.5's
#      slot-grid kernels (blocks launched for every slot) at 8-512 slots, without the torch references
#      (`--no-ref`: their per-adapter loops were most of the 2026-11-29 sweep's time), skipping the (module,
#      rank) pairs that run measured (`--skip-measured`), in an order whose every prefix covers the ranks and
#      shapes evenly, stopped before a pair that would end past 100 s,
#   4. `linear,h2d,load`: the base model's linear operators, host-to-GPU copies alone, concurrent and alongside
#      a GEMM loop on another CUDA stream (`with_compute` rows), adapter loads from disk and from CPU memory.
# Each process has a hard `timeout` as well (150 + 120 + 160 + 110 s = 9 minutes at most; about 6 minutes
# expected on an H200). A process stopped by its timeout (SIGTERM) keeps the rows it measured (tables are
# written row by row) and writes bench_meta.json with the part it cut; after each process the results so far are
# packed into $OUT/bench.tgz, so a kill of this whole command keeps what finished. TRITON_INTERPRET is unset
# (the bench refuses a GPU run with it set). Needs python3 with torch, triton, numpy, pandas and safetensors
# (the GPU machine's image has them); nothing is installed. Kernels compiled for sm_90 in fp16 with Triton 3.6 (the
# H200 image's, 2026-11-29) and, without a GPU, in fp16 and bf16 with Triton 3.9 (test_bench_kernels.py; the
# interpreter cannot check bf16 `tl.dot`). First run on an H200 on 2026-11-29: results/calibration/bench_h200/.
#
#   OUT=/some/dir bash calibration/bench/device_session.sh          # DEVICE=cpu SMALL=1: a dry run here
#
# Writes $OUT/log.txt, $OUT/env.txt and $OUT/bench.tgz (folders step/, step_qwen/, lora/, rest/, each with
# its tables and bench_meta.json). Back here:
#   mkdir -p runs/gpu && tar -xzf bench.tgz -C runs/gpu
#   twin calibrate bench-report runs/gpu/step --markdown runs/gpu/step/report.md --plot runs/gpu/step/steps.png
#   python -m calibration.bench.transfer_report runs/gpu/rest
set -uo pipefail
cd "$(dirname "$0")/../.."
unset TRITON_INTERPRET
OUT="${OUT:-runs/device}"
DEVICE="${DEVICE:-cuda}"
SIZE=(--model-dims llama-3.1-8b)
QWEN=(--model-dims qwen-2.5-7b)
GRAPHS=(--step-graphs)
NOREF=(--no-ref)
[ -n "${SMALL:-}" ] && SIZE=(--small) && QWEN=(--small --model-dims qwen-2.5-7b)
[ "$DEVICE" = cpu ] && GRAPHS=() && NOREF=()
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
# the working folders live outside $OUT: the device tool brings back a limited number of files, so $OUT holds
# only the log, the environment and one tarball
W="$(mktemp -d "${TMPDIR:-/tmp}/bench_work.XXXXXX")"
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,power.limit --format=csv || true
  python3 -c "import torch, triton, numpy, pandas; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'numpy', numpy.__version__, 'pandas', pandas.__version__)"
  nproc; free -g | head -2
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

pack() {  # the results so far into $OUT/bench.tgz (written aside, then renamed: never half a tarball)
  tar -czf "$OUT/bench.tgz.part" -C "$W" --exclude=adapters . && mv -f "$OUT/bench.tgz.part" "$OUT/bench.tgz"
}

bench() {  # bench <name> <seconds> <args...>
  local name=$1 limit=$2 rc
  shift 2
  echo "=== $name: $(date -u +%T), timeout ${limit}s"
  timeout -k 5 "$limit" python3 -m calibration.bench --device "$DEVICE" "${SIZE[@]}" --dtype bfloat16 \
      --out "$W/$name" "$@"
  rc=$?
  echo "=== $name: exit $rc at $(date -u +%T)"
  pack
}
{
  bench step 150 --parts step "${GRAPHS[@]}" --step-time-limit 90
  bench step_qwen 120 --parts step "${GRAPHS[@]}" --step-time-limit 60 "${QWEN[@]}"
  bench lora 160 --parts check,lora --ranks 8,16,32,64,128 --adapters 8,32,128,512 --slots 8,32,128,512 \
      --lora-tokens 16,256,1024,4096 --repeats 10 --warmup 3 --lora-time-limit 100 "${NOREF[@]}" \
      --skip-measured results/calibration/bench_h200/lora/lora_kernels.csv
  bench rest 110 --parts linear,h2d,load --ranks 8,16,32,64,128 --repeats 10 --warmup 3 --load-repeats 5
} 2>&1 | tee "$OUT/log.txt"
pack
rm -rf "$W"
ls -la "$OUT"
