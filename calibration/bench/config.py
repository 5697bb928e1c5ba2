"""What one bench run measures: model dimensions, sweeps, repeats (torch-free).

:func:`resolve_config` turns the parsed command line into a :class:`BenchConfig`. The device
decides the defaults: a GPU run measures the model at its real dimensions over the full sweeps;
a CPU run (``--device cpu``, or no GPU) uses tiny dimensions (``--small``: hidden 256, 2 layers)
and short sweeps: the measurements take well under a minute, and the Triton kernel check, run in
Triton's interpreter, 1-2 minutes more (``--check-cases`` picks fewer of its four cases). Every
default can be overridden on the command line.
"""

from __future__ import annotations

import csv
import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Mapping, Sequence

from traces.arguments import check_writable_dir
from twin.model_spec import ALL_TARGETS, ModelSpec, get_model

PARTS = ("check", "linear", "lora", "h2d", "load", "step")
#: the Triton kernel check's cases (``calibration.bench.lora.CHECK_CASES``, by name): adapter index -1, an
#: empty segment, single-token decodes, a segment over several tiles, ranks above one block
CHECK_CASE_NAMES = ("mixed_ranks_empty_segment", "decode_like_single_tokens", "long_segment_multi_tile",
                    "rank_above_block")
DEFAULT_MODEL = "llama-2-7b"

#: Sweeps for a GPU (full) run and a CPU (small) run.
GPU_DEFAULTS = dict(
    ranks=(8, 16, 32, 64, 128),
    tokens=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096),
    lora_tokens=(1, 4, 16, 64, 256, 1024, 4096),
    adapters=(1, 2, 4, 8, 16, 32),
    slots=(8, 16, 32, 64, 128, 256, 512),
    concurrency=(1, 2, 4),
    repeats=20,
    warmup=5,
    load_repeats=10,
    # mixed prefill + decode steps (calibration/bench/step.py): up to the validation runs' saturated
    # steps (2,048 tokens, 500-800 running requests, 200-300k context tokens) and beyond
    step_decodes=(0, 32, 128, 256, 512, 768, 1024),
    step_context=(25_000, 50_000, 100_000, 200_000, 300_000),
    step_prefill=(0, 512, -1),
    step_prefill_ctx=(0, 1024),
    step_chunk=256,
    step_budget=2048,
    step_repeats=5,
    step_warmup=2,
    # time limits (s) that bound the default GPU run (every part) to about 7 minutes on an H200: the LoRA
    # sweep with its torch references takes 20-30 s per (module, rank) pair, 20 pairs (~8 min) unbounded;
    # the 154 step shapes took 70-84 s there. Give larger ones on the command line for full sweeps.
    lora_time_limit=150.0,
    step_time_limit=120.0,
)
CPU_DEFAULTS = dict(
    ranks=(8, 16, 32, 64),
    tokens=(1, 16, 64, 256),
    lora_tokens=(1, 16, 64),
    adapters=(1, 4),
    slots=(4, 8),
    concurrency=(1, 2),
    repeats=5,
    warmup=2,
    load_repeats=3,
    step_decodes=(0, 4, 16),
    step_context=(64, 256, 512),
    step_prefill=(0, 32, -1),
    step_prefill_ctx=(0, 32),
    step_chunk=16,
    step_budget=64,
    step_repeats=3,
    step_warmup=1,
    lora_time_limit=None,
    step_time_limit=None,
)

#: columns a ``--skip-measured`` table must have: the (d_in, d_out, rank) pairs it measured, and where
SKIP_MEASURED_COLUMNS = ("d_in", "d_out", "rank", "device")


def env_flag_set(value: str | None) -> bool:
    """Whether an environment flag such as ``TRITON_INTERPRET`` is on (anything but unset, empty, 0, false)."""
    return value is not None and value.strip().lower() not in ("", "0", "false", "off", "no")


def check_triton_interpret(device: str, environ: Mapping[str, str] | None = None) -> None:
    """Refuse a GPU run with ``TRITON_INTERPRET`` set, before any work.

    Triton reads the variable when a kernel is defined (at the import of ``calibration.bench.kernels``) and
    then runs every launch of it in its Python interpreter on host copies of the tensors. A GPU bench would time
    those interpreted launches with CUDA events and label them as the compiled kernels (``impl=triton``), so the
    figures would be meaningless; the only fix is to start the process without the variable.
    """
    env = os.environ if environ is None else environ
    value = env.get("TRITON_INTERPRET")
    if device == "cuda" and env_flag_set(value):
        raise ValueError(f"TRITON_INTERPRET={value} is set: on --device cuda Triton would interpret the LoRA kernels "
                         f"on the host while they are timed as compiled GPU kernels; unset it "
                         f"(`unset TRITON_INTERPRET`) and rerun")

SMALL_HIDDEN = 256
SMALL_HEADS = 4
SMALL_LAYERS = 2
SMALL_VOCAB = 4096


def small_spec(spec: ModelSpec) -> ModelSpec:
    """Shrink ``spec`` for CI / CPU: hidden 256, 4 heads (head_dim 64), 2 layers, same shape ratios."""
    ratio = spec.intermediate / spec.hidden
    kv_heads = max(1, SMALL_HEADS * spec.kv_heads // spec.heads)
    intermediate = max(32, int(round(SMALL_HIDDEN * ratio / 32.0)) * 32)
    return replace(
        spec,
        name=f"{spec.name}-small",
        hidden=SMALL_HIDDEN,
        layers=min(spec.layers, SMALL_LAYERS),
        heads=SMALL_HEADS,
        kv_heads=kv_heads,
        intermediate=intermediate,
        vocab=min(spec.vocab, SMALL_VOCAB),
        params_b=0.0,
    )


@dataclass
class BenchConfig:
    """Everything a run needs; ``spec`` is the (possibly shrunk) model that is measured."""

    device: str  # "cuda" or "cpu"
    spec: ModelSpec
    out: Path
    small: bool = False
    base_model: str = DEFAULT_MODEL
    dtype: str = "float16"  # compute dtype of the linear layers and LoRA kernels
    ranks: tuple[int, ...] = CPU_DEFAULTS["ranks"]
    tokens: tuple[int, ...] = CPU_DEFAULTS["tokens"]
    lora_tokens: tuple[int, ...] = CPU_DEFAULTS["lora_tokens"]
    adapters: tuple[int, ...] = CPU_DEFAULTS["adapters"]
    #: adapter slots of vLLM's slot-grid kernels (blocks launched for every slot)
    slots: tuple[int, ...] = CPU_DEFAULTS["slots"]
    concurrency: tuple[int, ...] = CPU_DEFAULTS["concurrency"]
    tp: tuple[int, ...] = (1,)
    repeats: int = 5
    warmup: int = 2
    load_repeats: int = 3
    targets: tuple[str, ...] = ALL_TARGETS
    parts: tuple[str, ...] = PARTS
    #: the kernel check's cases (part check); under Triton's interpreter each takes 10-40 s of CPU
    check_cases: tuple[str, ...] = CHECK_CASE_NAMES
    cold_cache: bool = True
    keep_adapters: bool = False
    #: step part: decodes per step, total decode context tokens, prefill tokens (-1: fill the budget),
    #: each chunk's prior context, tokens per prefill chunk, the step's token budget
    step_decodes: tuple[int, ...] = CPU_DEFAULTS["step_decodes"]
    step_context: tuple[int, ...] = CPU_DEFAULTS["step_context"]
    step_prefill: tuple[int, ...] = CPU_DEFAULTS["step_prefill"]
    step_prefill_ctx: tuple[int, ...] = CPU_DEFAULTS["step_prefill_ctx"]
    step_chunk: int = CPU_DEFAULTS["step_chunk"]
    step_budget: int = CPU_DEFAULTS["step_budget"]
    step_repeats: int = CPU_DEFAULTS["step_repeats"]
    step_warmup: int = CPU_DEFAULTS["step_warmup"]
    step_attention: str = "auto"
    step_time_limit_s: float | None = None
    #: capture each step shape once in a CUDA graph and time its replays (no host launch cost; GPU only)
    step_graphs: bool = False
    #: stop the LoRA kernel sweep before a (module, rank) sweep that would end past this many seconds
    lora_time_limit_s: float | None = None
    #: time the plain torch references beside the Triton kernels on a GPU (``--no-ref`` turns it off: their
    #: per-adapter loops with a host sync each dominate a GPU sweep's time)
    lora_refs: bool = True
    #: a previous ``lora_kernels.csv`` whose (d_in, d_out, rank) pairs measured on this device are skipped
    skip_measured: Path | None = None
    seed: int = 0
    threads: int | None = None
    quiet: bool = False
    command_line: list[str] = field(default_factory=list)

    @property
    def adapter_dtype(self) -> str:
        """Dtype of the adapter weights (files, copies): the model's serving dtype, of the width
        ``spec.dtype_bytes`` (so the bytes are :meth:`ModelSpec.adapter_bytes`); a 2-byte model's adapters
        are in the run's ``--dtype`` when that is bfloat16 (Llama-3.1 and Qwen-2.5 serve in bf16)."""
        if self.spec.dtype_bytes == 2 and self.dtype == "bfloat16":
            return "bfloat16"
        return {2: "float16", 4: "float32", 1: "int8"}.get(self.spec.dtype_bytes, "float16")

    @property
    def max_lora_rank(self) -> int:
        return max(self.ranks)

    def adapter_bytes(self, rank: int) -> int:
        """Bytes of one adapter, exactly :meth:`ModelSpec.adapter_bytes` for the measured model."""
        return self.spec.adapter_bytes(rank, self.targets)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["out"] = str(self.out)
        d["skip_measured"] = None if self.skip_measured is None else str(self.skip_measured)
        d["spec"] = self.spec.to_dict()
        d["adapter_dtype"] = self.adapter_dtype
        return d


def parse_int_list(text: str | Sequence[int] | None, name: str) -> tuple[int, ...] | None:
    """``"8,16,32"`` -> ``(8, 16, 32)``; validates positivity."""
    if text is None:
        return None
    if isinstance(text, str):
        try:
            vals = tuple(int(t) for t in text.replace(" ", "").split(",") if t)
        except ValueError:
            raise ValueError(f"--{name}: expected a comma-separated list of integers, got {text!r}") from None
    else:
        vals = tuple(int(t) for t in text)
    if not vals or any(v <= 0 for v in vals):
        raise ValueError(f"--{name}: expected positive integers, got {text!r}")
    return vals


def parse_step_list(text: str | Sequence[int] | None, name: str, fill: bool = False) -> tuple[int, ...] | None:
    """``"0,512,fill"`` -> ``(0, 512, -1)`` for the step sweeps: whole numbers >= 0, and with ``fill`` the
    word ``fill`` (the prefill that fills the step's budget)."""
    if text is None:
        return None
    items = text.replace(" ", "").split(",") if isinstance(text, str) else list(text)
    vals = []
    for t in items:
        if t == "":
            continue
        if fill and str(t) == "fill":
            vals.append(-1)
            continue
        try:
            v = int(t)
        except ValueError:
            raise ValueError(f"--{name}: {t!r} is not a whole number; give a comma-separated list such as "
                             f"{'0,512,fill' if fill else '0,128,512'}") from None
        if v < 0:
            raise ValueError(f"--{name}: {v} is negative; give token counts >= 0")
        vals.append(v)
    if not vals:
        raise ValueError(f"--{name}: no values in {text!r}")
    return tuple(vals)


def resolve_spec(model: str | None, hidden=None, layers=None, heads=None, kv_heads=None,
                 intermediate=None, vocab=None, name: str | None = None) -> ModelSpec:
    """A known model (``--model-dims``), optionally with explicit dimensions overriding it.

    With no model name but all six explicit dimensions, a custom model named ``name`` (or
    ``custom``) is built; a partial explicit set without a model name is an error.
    """
    explicit = dict(hidden=hidden, layers=layers, heads=heads, kv_heads=kv_heads,
                    intermediate=intermediate, vocab=vocab)
    given = {k: int(v) for k, v in explicit.items() if v is not None}
    if model is None and given:
        missing = [k for k, v in explicit.items() if v is None]
        if missing:
            flags = ", ".join("--" + m.replace("_", "-") for m in missing)
            raise ValueError(f"explicit model dimensions need all of --hidden --layers --heads --kv-heads "
                             f"--intermediate --vocab (missing {flags}), or a --model-dims NAME to start from")
        spec = ModelSpec(name or "custom", max_model_len=4096, **given)
    else:
        spec = get_model(model or DEFAULT_MODEL)
        if given:
            spec = replace(spec, name=name or f"{spec.name}-custom", **given)
        elif name:
            spec = replace(spec, name=name)
    small = [f"--{k.replace('_', '-')} {v}" for k, v in given.items() if v < 1]
    if small:
        raise ValueError(f"{', '.join(small)}: model dimensions must be >= 1")
    if spec.hidden % spec.heads:
        raise ValueError(f"hidden {spec.hidden} is not a multiple of heads {spec.heads}")
    if spec.heads % spec.kv_heads:
        raise ValueError(f"heads {spec.heads} is not a multiple of kv-heads {spec.kv_heads}")
    return spec


#: options that only some parts read: flag -> (its argparse destination, the parts that read it)
PART_OPTIONS: dict[str, tuple[str, tuple[str, ...]]] = {
    "--tokens": ("tokens", ("linear",)), "--tp": ("tp", ("linear",)),
    "--lora-tokens": ("lora_tokens", ("lora",)), "--adapters": ("adapters", ("lora",)),
    "--slots": ("slots", ("lora",)), "--lora-time-limit": ("lora_time_limit", ("lora",)),
    "--no-ref": ("no_ref", ("lora",)), "--skip-measured": ("skip_measured", ("lora",)),
    "--concurrency": ("concurrency", ("h2d",)), "--load-repeats": ("load_repeats", ("load",)),
    "--warm-cache": ("warm_cache", ("load",)), "--keep-adapters": ("keep_adapters", ("load",)),
    **{f"--{n.replace('_', '-')}": (n, ("step",)) for n in ("step_decodes", "step_context", "step_prefill",
                                                             "step_prefill_ctx", "step_chunk", "step_budget",
                                                             "step_repeats", "step_warmup", "step_attention",
                                                             "step_time_limit", "step_graphs")},
}


def _names(value: str | None, flag: str) -> tuple[str, ...] | None:
    """A comma-separated list of names (None when not given); an empty one is refused naming ``flag``."""
    if value is None:
        return None
    names = tuple(t.strip() for t in str(value).split(",") if t.strip())
    if not names:
        raise ValueError(f"{flag}: empty; give comma-separated names, or leave {flag} out for all of them")
    return names


def resolve_config(args, cuda_available: bool | None = None) -> BenchConfig:
    """Build the run's config from an argparse namespace (see :mod:`calibration.bench.cli`)."""
    device = args.device
    if device in (None, "auto"):
        device = "cuda" if cuda_available else "cpu"
    if device not in ("cuda", "cpu"):
        raise ValueError(f"--device must be cuda or cpu, got {device!r}")
    spec = resolve_spec(args.model_dims, args.hidden, args.layers, args.heads, args.kv_heads,
                        args.intermediate, args.vocab, getattr(args, "model_name", None))
    small = args.small if args.small is not None else device == "cpu"
    base_model = spec.name
    if small:
        spec = small_spec(spec)
    defaults = GPU_DEFAULTS if device == "cuda" and not small else CPU_DEFAULTS

    def pick(name: str):
        v = parse_int_list(getattr(args, name, None), name.replace("_", "-"))
        return v if v is not None else defaults[name]

    dtype = args.dtype or ("float16" if device == "cuda" else "float32")
    if dtype not in ("float16", "bfloat16", "float32"):
        raise ValueError(f"--dtype must be float16, bfloat16 or float32, got {dtype!r}")
    parts = _names(args.parts, "--parts") or tuple(PARTS)
    bad = [p for p in parts if p not in PARTS]
    if bad:
        raise ValueError(f"--parts: unknown part(s) {bad}; choose from {', '.join(PARTS)}")
    given_cases = _names(getattr(args, "check_cases", None), "--check-cases")
    check_cases = given_cases or CHECK_CASE_NAMES
    bad = [c for c in check_cases if c not in CHECK_CASE_NAMES]
    if bad:
        raise ValueError(f"--check-cases: unknown case(s) {bad}; choose from {', '.join(CHECK_CASE_NAMES)}")
    if given_cases and "check" not in parts:
        raise ValueError("--check-cases chooses the cases of the kernel check, but --parts leaves the check out; "
                         "add check to --parts, or leave --check-cases out")
    for flag, (dest, readers) in PART_OPTIONS.items():
        if getattr(args, dest, None) not in (None, False) and not set(readers) & set(parts):
            raise ValueError(f"{flag} sets the {' and '.join(readers)} part, but --parts {','.join(parts)} leaves it "
                             f"out, so it would change nothing; add {readers[0]} to --parts, or leave {flag} out")
    check_writable_dir("--out", args.out)
    targets = _names(args.targets, "--targets") or ALL_TARGETS
    for t in targets:
        spec.module_shape(t)  # validates the name
    repeats = args.repeats if args.repeats is not None else defaults["repeats"]
    warmup = args.warmup if args.warmup is not None else defaults["warmup"]
    load_repeats = args.load_repeats if args.load_repeats is not None else defaults["load_repeats"]
    if repeats < 1 or warmup < 0 or load_repeats < 1:
        raise ValueError("--repeats and --load-repeats must be >= 1 and --warmup >= 0")
    threads = getattr(args, "threads", None)
    if threads is not None and threads < 1:
        raise ValueError(f"--threads {threads}: torch's CPU threads must be >= 1 (or leave it out: 1 on --device "
                         f"cpu, torch's choice on cuda)")
    if args.seed < 0:
        raise ValueError(f"--seed {args.seed}: a seed must be >= 0 (numpy and torch take non-negative seeds)")
    step = _step_settings(args, defaults)
    if step["step_graphs"] and device != "cuda":
        raise ValueError("--step-graphs captures CUDA graphs and needs --device cuda; on the CPU leave it out "
                         "(the steps then run eagerly)")
    no_ref = bool(getattr(args, "no_ref", False))
    if no_ref and device != "cuda":
        raise ValueError("--no-ref drops the torch reference timings, which are the only LoRA timings on the CPU "
                         "(Triton is only checked there); use it with --device cuda, or leave it out")
    skip_measured = _skip_measured(getattr(args, "skip_measured", None))
    lora_limit = getattr(args, "lora_time_limit", None)
    lora_limit = defaults["lora_time_limit"] if lora_limit is None else lora_limit
    tp = parse_int_list(args.tp, "tp") or (1,)
    for t in tp:
        if spec.heads % t:
            raise ValueError(f"--tp {t} does not divide the model's {spec.heads} heads")
    return BenchConfig(
        device=device,
        spec=spec,
        out=Path(args.out),
        small=small,
        base_model=base_model,
        dtype=dtype,
        ranks=pick("ranks"),
        tokens=pick("tokens"),
        lora_tokens=pick("lora_tokens"),
        adapters=pick("adapters"),
        slots=pick("slots"),
        concurrency=pick("concurrency"),
        tp=tp,
        repeats=int(repeats),
        warmup=int(warmup),
        load_repeats=int(load_repeats),
        targets=targets,
        parts=parts,
        check_cases=check_cases,
        cold_cache=not args.warm_cache,
        keep_adapters=args.keep_adapters,
        **step,
        lora_time_limit_s=_time_limit(lora_limit, "--lora-time-limit"),
        lora_refs=not no_ref,
        skip_measured=skip_measured,
        seed=args.seed,
        threads=getattr(args, "threads", None),
        quiet=args.quiet,
        command_line=list(getattr(args, "command_line", None) or []),
    )


def _step_settings(args, defaults: dict) -> dict:
    """The step part's settings from the command line (``--step-*``), else the device's defaults."""
    def lst(name: str, fill: bool = False) -> tuple[int, ...]:
        v = parse_step_list(getattr(args, name, None), name.replace("_", "-"), fill)
        return v if v is not None else defaults[name]

    def num(name: str, minimum: int) -> int:
        v = getattr(args, name, None)
        v = defaults[name] if v is None else int(v)
        if v < minimum:
            raise ValueError(f"--{name.replace('_', '-')} {v}: must be >= {minimum}")
        return v

    out = dict(step_decodes=lst("step_decodes"), step_context=lst("step_context"),
               step_prefill=lst("step_prefill", fill=True), step_prefill_ctx=lst("step_prefill_ctx"),
               step_chunk=num("step_chunk", 1), step_budget=num("step_budget", 1),
               step_repeats=num("step_repeats", 1), step_warmup=num("step_warmup", 0),
               step_attention=getattr(args, "step_attention", None) or "auto",
               step_time_limit_s=(defaults["step_time_limit"] if getattr(args, "step_time_limit", None) is None
                                  else args.step_time_limit),
               step_graphs=bool(getattr(args, "step_graphs", False)))
    if out["step_attention"] not in ("auto", "sdpa", "matmul"):
        raise ValueError(f"--step-attention must be auto, sdpa or matmul, got {out['step_attention']!r}")
    out["step_time_limit_s"] = _time_limit(out["step_time_limit_s"], "--step-time-limit")
    if all(d == 0 for d in out["step_decodes"]) and all(p == 0 for p in out["step_prefill"]):
        raise ValueError("--step-decodes and --step-prefill are all 0: every step would be empty")
    return out


def _skip_measured(value: str | None) -> Path | None:
    """``--skip-measured FILE``: a readable CSV with the columns :data:`SKIP_MEASURED_COLUMNS` (checked before any
    work, so a wrong path does not cost a lent GPU's time)."""
    if value is None:
        return None
    p = Path(value)
    if p.is_dir():
        p = p / "lora_kernels.csv"
    if not p.is_file():
        raise ValueError(f"--skip-measured {value}: no such file; give a previous run's lora_kernels.csv (or its "
                         f"--out directory)")
    try:
        with p.open(newline="") as f:
            header = next(csv.reader(f), [])
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"--skip-measured {value}: not readable ({type(e).__name__}: {e})") from None
    missing = [c for c in SKIP_MEASURED_COLUMNS if c not in header]
    if missing:
        raise ValueError(f"--skip-measured {value}: not a lora_kernels.csv (missing columns {missing})")
    return p


def _time_limit(value: float | None, flag: str) -> float | None:
    """A part's time limit: None (no limit) or finite seconds > 0, else an error naming ``flag``."""
    if value is None:
        return None
    if not (value > 0 and value < float("inf")):
        raise ValueError(f"{flag} {value}: give seconds > 0")
    return float(value)
