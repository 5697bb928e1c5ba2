"""``twin calibrate bench`` and ``python -m calibration.bench``: the command line (torch-free).

Importing this module never imports torch or triton; they are imported when a bench runs, and
their absence then gives a clear error naming the ``calibration`` extra.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from calibration.bench.config import CHECK_CASE_NAMES, CPU_DEFAULTS, DEFAULT_MODEL, GPU_DEFAULTS, PARTS

DESCRIPTION = """Microbenchmarks for calibrating a LoRA Twin profile: base-model linear operators
(linear_ops.csv, Vidur's columns), Triton LoRA kernels SGMV/BGMV shrink and expand and vLLM 0.8.5's
slot-grid kernels at 8-512 slots (lora_kernels.csv), host-to-device copies of adapter weights
(h2d_copy.csv), disk/CPU adapter loads (adapter_load.csv), and whole mixed prefill + decode steps of
the model with random weights up to 300k context tokens (step_bench.csv), plus bench_meta.json. Run
`bench`, then `fit` on its --out and `bench-report` on it. On CPU (no GPU) the same harness runs with
torch on the CPU at tiny dimensions (figures labelled device=cpu), and the Triton kernels are checked
against a torch reference under TRITON_INTERPRET=1."""


def _csv(xs) -> str:
    return ",".join(str(x) for x in xs)


def add_bench_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--device", choices=("cuda", "cpu", "auto"), default="auto",
                   help="where to measure (default: cuda when a GPU is visible, else cpu)")
    p.add_argument("--out", required=True, help="directory for the tables (created)")
    g = p.add_argument_group("model dimensions")
    g.add_argument("--model-dims", metavar="NAME", default=None,
                   help=f"a model known to twin.model_spec (e.g. llama-2-7b, llama-3.1-8b; default {DEFAULT_MODEL})")
    g.add_argument("--hidden", type=int, help="hidden size (overrides --model-dims' value)")
    g.add_argument("--layers", type=int, help="decoder layers")
    g.add_argument("--heads", type=int, help="attention (query) heads")
    g.add_argument("--kv-heads", type=int, help="key/value heads (grouped-query attention)")
    g.add_argument("--intermediate", type=int, help="MLP intermediate size")
    g.add_argument("--vocab", type=int, help="vocabulary size (the LM head)")
    g.add_argument("--model-name", default=None, help="label for explicit dimensions (default: custom)")
    size = g.add_mutually_exclusive_group()
    size.add_argument("--small", dest="small", action="store_true", default=None,
                      help="tiny dimensions (hidden 256, 2 layers; the default on cpu)")
    size.add_argument("--full", dest="small", action="store_false",
                      help="the model's real dimensions (the default on cuda)")
    s = p.add_argument_group("sweeps (defaults: GPU / CPU)")
    s.add_argument("--ranks", help=f"LoRA ranks ({_csv(GPU_DEFAULTS['ranks'])} / {_csv(CPU_DEFAULTS['ranks'])})")
    s.add_argument("--tokens", help=f"num_tokens of the linear ops ({_csv(GPU_DEFAULTS['tokens'])} / "
                                    f"{_csv(CPU_DEFAULTS['tokens'])})")
    s.add_argument("--lora-tokens", help=f"batch tokens of the LoRA kernels ({_csv(GPU_DEFAULTS['lora_tokens'])} / "
                                         f"{_csv(CPU_DEFAULTS['lora_tokens'])})")
    s.add_argument("--adapters", help=f"distinct adapters per batch ({_csv(GPU_DEFAULTS['adapters'])} / "
                                      f"{_csv(CPU_DEFAULTS['adapters'])})")
    s.add_argument("--slots", help=f"adapter slots of vLLM's slot-grid LoRA kernels ({_csv(GPU_DEFAULTS['slots'])} / "
                                   f"{_csv(CPU_DEFAULTS['slots'])})")
    s.add_argument("--lora-time-limit", type=float, metavar="S",
                   help=f"stop the LoRA kernel sweep before a (module, rank) sweep that would end past S seconds, "
                        f"keeping the rows so far ({GPU_DEFAULTS['lora_time_limit']:g} on a GPU / none)")
    s.add_argument("--no-ref", action="store_true",
                   help="on a GPU, time only the Triton kernels, not their plain torch references (whose "
                        "per-adapter loops, with a host sync each, take most of a LoRA sweep's time; cuda only)")
    s.add_argument("--skip-measured", metavar="CSV",
                   help="a previous run's lora_kernels.csv (or its directory): skip the (module shape, rank) pairs it "
                        "measured on this device, so a second time-boxed run measures new ones")
    s.add_argument("--concurrency", help=f"simultaneous host-to-device copies ({_csv(GPU_DEFAULTS['concurrency'])} / "
                                         f"{_csv(CPU_DEFAULTS['concurrency'])})")
    s.add_argument("--tp", help="tensor-parallel degrees emulated for the linear ops (default 1)")
    s.add_argument("--targets", help="LoRA target modules (default: all 7: q,k,v,o,gate,up,down _proj)")
    s.add_argument("--repeats", type=int, help=f"timed repeats ({GPU_DEFAULTS['repeats']} / {CPU_DEFAULTS['repeats']})")
    s.add_argument("--warmup", type=int, help=f"untimed warm-ups ({GPU_DEFAULTS['warmup']} / {CPU_DEFAULTS['warmup']})")
    s.add_argument("--load-repeats", type=int,
                   help=f"adapter loads per rank ({GPU_DEFAULTS['load_repeats']} / {CPU_DEFAULTS['load_repeats']})")
    s.add_argument("--dtype", choices=("float16", "bfloat16", "float32"),
                   help="compute dtype (float16 on cuda, float32 on cpu)")
    s.add_argument("--parts", help=f"subset of {_csv(PARTS)} (default: all)")
    s.add_argument("--check-cases", metavar="NAMES",
                   help=f"cases of the Triton kernel check (default: all: {_csv(CHECK_CASE_NAMES)}; "
                        f"interpreted on CPU each takes 10-40 s)")
    st = p.add_argument_group("mixed steps (part step; defaults: GPU / CPU)")
    st.add_argument("--step-decodes", help=f"decodes per step ({_csv(GPU_DEFAULTS['step_decodes'])} / "
                                           f"{_csv(CPU_DEFAULTS['step_decodes'])})")
    st.add_argument("--step-context", help=f"context tokens of the decodes, in total "
                                           f"({_csv(GPU_DEFAULTS['step_context'])} / {_csv(CPU_DEFAULTS['step_context'])})")
    st.add_argument("--step-prefill", help="prefill tokens per step, 'fill' = the budget left by the decodes "
                                           "(0,512,fill)")
    st.add_argument("--step-prefill-ctx", help=f"tokens already in the cache before each prefill chunk "
                                               f"({_csv(GPU_DEFAULTS['step_prefill_ctx'])} / "
                                               f"{_csv(CPU_DEFAULTS['step_prefill_ctx'])})")
    st.add_argument("--step-chunk", type=int, help=f"tokens per prefill chunk (one sequence each; "
                                                   f"{GPU_DEFAULTS['step_chunk']} / {CPU_DEFAULTS['step_chunk']})")
    st.add_argument("--step-budget", type=int, help=f"a step's token budget, max_num_batched_tokens "
                                                    f"({GPU_DEFAULTS['step_budget']} / {CPU_DEFAULTS['step_budget']})")
    st.add_argument("--step-repeats", type=int, help=f"timed forward passes per shape ({GPU_DEFAULTS['step_repeats']} / "
                                                     f"{CPU_DEFAULTS['step_repeats']})")
    st.add_argument("--step-warmup", type=int, help=f"untimed passes per shape ({GPU_DEFAULTS['step_warmup']} / "
                                                    f"{CPU_DEFAULTS['step_warmup']})")
    st.add_argument("--step-attention", choices=("auto", "sdpa", "matmul"),
                    help="attention: torch SDPA with grouped KV heads, or batched matmuls (auto: SDPA where it runs)")
    st.add_argument("--step-time-limit", type=float, metavar="S",
                    help=f"stop the step sweep before a shape that would end past S seconds, keeping the rows so far "
                         f"({GPU_DEFAULTS['step_time_limit']:g} on a GPU / none)")
    st.add_argument("--step-graphs", action="store_true",
                    help="capture each step once in a CUDA graph and time its replays, as vLLM replays its "
                         "captured steps: the GPU's time without the eager host launch cost (cuda only)")
    s.add_argument("--warm-cache", action="store_true",
                   help="do not drop adapter files from the page cache before each disk load")
    s.add_argument("--keep-adapters", action="store_true", help="keep the safetensors files written under OUT/adapters")
    s.add_argument("--threads", type=int, help="torch CPU threads (default: 1 on --device cpu, torch's choice on cuda)")
    s.add_argument("--seed", type=int, default=0,
                   help="seed of the random weights, adapters and inputs, and of the time-boxed sweeps' order (default 0)")
    s.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.set_defaults(func=run_from_args, prog=p.prog)
    return p


def register_bench(calibrate_subparsers) -> None:
    """Add the ``bench`` subcommand to the ``twin calibrate`` subparsers (sets ``func``)."""
    p = calibrate_subparsers.add_parser(
        "bench", help="run the GPU/CPU microbenchmarks and write the tables `fit` consumes",
        description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_bench_arguments(p)


def build_parser(prog: str = "python -m calibration.bench") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=DESCRIPTION,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    return add_bench_arguments(p)


def run_from_args(args: argparse.Namespace) -> int:
    """Run the bench for parsed arguments; returns an exit code: 2 on a usage or dependency error, 1 when the
    kernel check failed, ``128 + signal`` (143 for SIGTERM) when a signal stopped the run (the tables so far and
    ``bench_meta.json`` are written)."""
    from calibration.bench import BenchDependencyError, require_torch

    if not getattr(args, "command_line", None):
        args.command_line = list(sys.argv)
    prog = getattr(args, "prog", None) or "bench"  # (errors named as argparse names them)
    try:
        torch = require_torch()
        from calibration.bench.config import check_triton_interpret, resolve_config
        from calibration.bench.harness import run_bench

        try:
            cfg = resolve_config(args, cuda_available=torch.cuda.is_available())
            check_triton_interpret(cfg.device)  # before any work, and before the GPU is looked at
            if cfg.device == "cuda" and not torch.cuda.is_available():
                raise ValueError("--device cuda, but torch sees no GPU (torch.cuda.is_available() is False); "
                                 "use --device cpu")
        except (ValueError, KeyError) as e:
            print(f"{prog}: error: {e.args[0] if e.args else e}", file=sys.stderr)
            return 2
        summary = run_bench(cfg)
    except BenchDependencyError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    if summary.get("interrupted"):
        sig = summary["interrupted"]
        print(f"bench: stopped by {sig['name']} in part {sig['part']}; wrote {', '.join(summary['tables'])} "
              f"(the rows measured so far) to {summary['out']}", file=sys.stderr)
        return 128 + int(sig["signum"])
    if not args.quiet:
        print(f"bench: wrote {', '.join(summary['tables'])} to {summary['out']}")
    return 0 if summary.get("ok", True) else 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.command_line = ["python", "-m", "calibration.bench"] + list(sys.argv[1:] if argv is None else argv)
    return args.func(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
