"""Why the FastLibra ablations stay close to the full policy: TTFT breakdown and swapper decisions per variant.

One point per workload of ``twin reproduce fastlibra-ablation``'s set-up (64 GB, Llama-2-7B A100
profile, 50 LoRAs, ``WARMUP_S`` of warm-up then 60 s measured) at a rate inside FastLibra's peak, for
``fastlibra`` and its ablations: mean TTFT of the measured requests, and over the whole run the
queueing, LoRA and KV cold starts (count and seconds waited) and their share of the TTFT sum,
swap-outs (of which LoRAs, and LoRAs that left their KV in HBM), the decisions the dependency tree
and LoRA_Eval changed, the share of ticks with LoRA_Eval > 1, HBM usage, busy ticks and the
invalid-KV share (README "Why the FastLibra ablations stay close to the full policy"). About a minute of
CPU. Run:

    PYTHONPATH=. python benchmarks/fastlibra_ablation_breakdown.py
"""
from twin.reproduce import fastlibra as F
from twin.reproduce.base import Runner

POINTS = (("fastlibra-chatbot", 5.0), ("fastlibra-agent", 16.0), ("fastlibra-translation", 48.0))
runner = Runner(cache=False)
print(f"{'workload':22} {'rps':>5} {'variant':14} {'TTFT ms':>8} {'queue ms':>8} {'LoRA cold':>12} {'KV cold':>12} "
      f"{'cold/TTFT':>9} {'swap-outs (LoRA, w/ KV)':>24} {'tree':>5} {'LoRA_Eval':>9} {'>1':>4} {'HBM use':>7} "
      f"{'busy':>5} {'invalid KV':>10}")
for trace, rps in POINTS:
    run = F.scenario(trace, F.FULL, {})
    for preset in (F.FASTLIBRA, *F.ABLATIONS.values()):
        s = runner.point(run, preset, rps, measure_from_s=F.FULL.warmup_s)
        inv = s.get("fastlibra_invalid_kv_share")
        above = s.get("fastlibra_lora_eval_above_1_share")
        cold = s["lora_cold_start_s"] + s["kv_cold_start_s"]
        share = cold / (s["ttft_ms_mean"] * s["requests_finished"] / 1000.0)
        outs = f"{s['fastlibra_swaps_out']} ({s['fastlibra_swaps_out_lora']}, {s['fastlibra_lora_swaps_out_with_kv']})"
        print(f"{trace:22} {rps:5g} {preset:14} {s['measured_ttft_ms_mean']:8.1f} {s['queue_ms_mean']:8.1f} "
              f"{s['lora_cold_starts']:4d} {s['lora_cold_start_s']:6.1f} s {s['kv_cold_starts']:4d} "
              f"{s['kv_cold_start_s']:6.1f} s {share:9.1%} {outs:>24} {s['fastlibra_dependency_decisions']:5d} "
              f"{s['fastlibra_lora_eval_decisions']:9d} {'-' if above is None else f'{above:.0%}':>4} "
              f"{s['fastlibra_hbm_usage_mean']:7.1%} {s['fastlibra_busy_tick_share']:5.0%} "
              f"{'-' if inv is None else f'{inv:.2%}':>10}")
