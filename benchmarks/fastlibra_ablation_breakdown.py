"""Why the FastLibra ablations equal the full policy: TTFT breakdown and swapper state per variant.

One point per workload of ``twin reproduce fastlibra-ablation``'s set-up (64 GB, Llama-2-7B A100
profile, 50 LoRAs, 60 s of arrivals) at a rate inside FastLibra's peak, for ``fastlibra`` and its
ablations: mean TTFT and queueing, LoRA and KV cold starts (count and seconds waited), swap-outs,
HBM usage and busy ticks, and the invalid-KV share (README "Why the FastLibra ablations equal the
full policy"). About 10 CPU-seconds. Run:

    PYTHONPATH=. python benchmarks/fastlibra_ablation_breakdown.py
"""
from twin.reproduce import fastlibra as F
from twin.reproduce.base import Runner

POINTS = (("fastlibra-chatbot", 5.0), ("fastlibra-agent", 16.0), ("fastlibra-translation", 48.0))
runner = Runner(cache=False)
print(f"{'workload':22} {'rps':>5} {'variant':14} {'TTFT ms':>8} {'queue ms':>8} {'LoRA cold':>12} {'KV cold':>12} "
      f"{'swap-outs':>9} {'HBM use':>7} {'busy':>5} {'invalid KV':>10}")
for trace, rps in POINTS:
    run = F.scenario(trace, F.FULL, {})
    for preset in (F.FASTLIBRA, *F.ABLATIONS.values()):
        s = runner.point(run, preset, rps)
        inv = s.get("fastlibra_invalid_kv_share")
        print(f"{trace:22} {rps:5g} {preset:14} {s['ttft_ms_mean']:8.1f} {s['queue_ms_mean']:8.1f} "
              f"{s['lora_cold_starts']:4d} {s['lora_cold_start_s']:6.1f} s {s['kv_cold_starts']:4d} "
              f"{s['kv_cold_start_s']:6.1f} s {s['fastlibra_swaps_out']:9d} {s['fastlibra_hbm_usage_mean']:7.1%} "
              f"{s['fastlibra_busy_tick_share']:5.0%} {'-' if inv is None else f'{inv:.2%}':>10}")
