"""Where FastLibra's TPOT goes, against vLLM's and S-LoRA's, on ``twin reproduce fastlibra-ttft``'s set-up.

One point per workload (64 GB, Llama-2-7B A100 profile, 50 LoRAs of ranks 32/64, 60 s of arrivals) at a
rate inside every system's peak. Per system: mean TTFT and TPOT, then the engine steps split into pure
decode steps and steps with prefill tokens (vLLM: chunked prefill mixed into decode; S-LoRA: prefill
batches apart from decode): their number, mean duration and batch, and the duration split into the
LoRA compute (the form the system pays, recomputed from each step's record; S-LoRA's Punica cost summed
as the engine charges it), the backbone without the attention context, and the rest (context
attention, scheduler CPU time, and synchronous loads or swaps on the step's path). About 15 CPU-seconds.

    PYTHONPATH=. python benchmarks/fastlibra_tpot_breakdown.py                       # the reproduction's set-up
    PYTHONPATH=. python benchmarks/fastlibra_tpot_breakdown.py --lora-compute profile --targets default  # earlier
    PYTHONPATH=. python benchmarks/fastlibra_tpot_breakdown.py --point fastlibra-translation:104  # another point
    PYTHONPATH=. python benchmarks/fastlibra_tpot_breakdown.py --slora-max-wait-tokens 1  # S-LoRA admitting after each decode
"""
import argparse
import dataclasses

from twin.compare import load_compare_profile
from twin.perf import slora_forms
from twin.registry import make_cache, make_scheduler, resolve_system
from twin.reproduce import fastlibra as F
from twin.scenario import build_engine_config, build_workload
from twin.simulate import simulate

POINTS = (("fastlibra-chatbot", 2.5), ("fastlibra-agent", 16.0), ("fastlibra-translation", 48.0))

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--lora-compute", default="paged", choices=["paged", "profile"],
                help="FastLibra's LoRA compute (default: paged, the reproduction's)")
ap.add_argument("--targets", default=F.LORA_TARGETS,
                help="the adapters' target modules (default: the reproduction's); 'default': each system's own "
                     "(vLLM: all seven projections, S-LoRA: q, k, v, o)")
ap.add_argument("--slora-max-wait-tokens", type=int, default=None, metavar="N",
                help="S-LoRA's decodes between admission attempts (EngineConfig.slora_max_wait_tokens; default: "
                     "S-LoRA's 10); 1 admits after every decode")
ap.add_argument("--point", action="append", default=None, metavar="WORKLOAD:RPS",
                help="a point to break down instead of the three defaults (repeatable)")
args = ap.parse_args()
points = POINTS
if args.point:
    try:
        points = tuple((w, float(r)) for w, r in (x.rsplit(":", 1) for x in args.point))
    except ValueError:
        ap.error(f"--point takes WORKLOAD:RPS (e.g. fastlibra-translation:104), got {args.point}")
    if any(r <= 0 for _, r in points):
        ap.error("--point: the rate must be > 0 req/s")
if args.slora_max_wait_tokens is not None and args.slora_max_wait_tokens < 1:
    ap.error(f"--slora-max-wait-tokens must be >= 1 (the S-LoRA engine's least), got {args.slora_max_wait_tokens}")

punica = {"s": 0.0}
_decode, _prefill = slora_forms.PunicaLoraCost.decode_s, slora_forms.PunicaLoraCost.prefill_s


def _count(f):
    def g(self, *a):
        v = f(self, *a)
        punica["s"] += v
        return v
    return g


slora_forms.PunicaLoraCost.decode_s = _count(_decode)     # sums the S-LoRA engine's LoRA time as charged
slora_forms.PunicaLoraCost.prefill_s = _count(_prefill)

print(f"FastLibra lora_compute={args.lora_compute}, adapter targets {args.targets}")
for trace, rps in points:
    # 60 s of arrivals from empty HBM, without the reproduction's warm-up (the README table's set-up)
    run = dataclasses.replace(F.scenario(trace, F.FULL, {}), rps=rps, duration=F.FULL.duration_s,
                              lora_targets=None if args.targets == "default" else args.targets,
                              **({} if args.slora_max_wait_tokens is None
                                 else {"slora_max_wait_tokens": args.slora_max_wait_tokens}))
    prof = load_compare_profile(run.profile, None)
    w = build_workload(run)
    for preset in (F.FASTLIBRA, F.VLLM, F.SLORA):
        punica["s"] = 0.0
        system = resolve_system(preset, run.system)
        cfg = build_engine_config(run, w, prof)
        if preset == F.FASTLIBRA:
            res = simulate(w, prof, cfg, scheduler_obj=make_scheduler("fcfs"),
                           cache_obj=make_cache("fastlibra", lora_compute=args.lora_compute), system=system)
        else:
            res = simulate(w, prof, cfg, policy=preset, system=system)
        e, s = res.engine, res.summary
        p = e.profile
        form = "punica" if system == "slora" else type(p.components["lora"]).__name__
        print(f"{trace} {rps:g} req/s {preset:15} ({system}, LoRA {form}"
              f"{'' if system == 'slora' else f', {e.config.max_loras} slots, rank {e.max_lora_rank}'}): "
              f"TTFT {s['ttft_ms_mean']:.0f} ms, TPOT {s['tpot_ms_mean']:.1f} ms, adapter loads {s['adapter_loads']}")
        parts: dict[str, dict[str, float]] = {}
        for r in res.steps.itertuples():
            k, P, D, A, B = int(r.n_steps), int(r.prefill_tokens), int(r.decode_tokens), int(r.distinct_adapters), \
                int(r.batch_size)
            d = parts.setdefault("decode" if P == 0 else "prefill", dict.fromkeys(("n", "t", "lora", "bb", "b"), 0.0))
            d["n"] += k
            d["t"] += r.t_end - r.t_start
            d["b"] += B * k
            d["bb"] += k * p.backbone_s(P, D, 0)
            if system == "vllm":
                d["lora"] += k * (p.lora_s(0.0, A, e.max_lora_rank, P + D, e.config.max_loras, B)
                                  + (p.mixed_s(P, A, e.config.max_loras) if P and p.mixed_s is not None else 0.0))
        if system == "slora":  # the engine's charged total over all steps
            tot = sum(d["n"] for d in parts.values())
            print(f"    all steps: LoRA {1000 * punica['s'] / tot:.1f} ms per step (S-LoRA's Punica estimate)")
        for kind, d in parts.items():
            n = d["n"]
            lora = f"LoRA {1000 * d['lora'] / n:5.1f}, " if system == "vllm" else ""
            rest = d["t"] - d["bb"] - (d["lora"] if system == "vllm" else 0.0)
            print(f"    {kind:7} steps {int(n):5d}: {1000 * d['t'] / n:5.1f} ms at batch {d['b'] / n:4.1f} = {lora}"
                  f"backbone {1000 * d['bb'] / n:5.1f}, rest {1000 * rest / n:5.1f} ms")
