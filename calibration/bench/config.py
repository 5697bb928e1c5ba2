"""What one bench run measures: model dimensions, sweeps, repeats (torch-free).

:func:`resolve_config` turns the parsed command line into a :class:`BenchConfig`. The device
decides the defaults: a GPU run measures the model at its real dimensions over the full sweeps;
a CPU run (``--device cpu``, or no GPU) uses tiny dimensions (``--small``: hidden 256, 2 layers)
and short sweeps so that the whole harness finishes in well under a minute. Every default can
be overridden on the command line.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Sequence

from twin.model_spec import ALL_TARGETS, ModelSpec, get_model

PARTS = ("check", "linear", "lora", "h2d", "load")
DEFAULT_MODEL = "llama-2-7b"

#: Sweeps for a GPU (full) run and a CPU (small) run.
GPU_DEFAULTS = dict(
    ranks=(8, 16, 32, 64, 128),
    tokens=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096),
    lora_tokens=(1, 4, 16, 64, 256, 1024, 4096),
    adapters=(1, 2, 4, 8, 16, 32),
    concurrency=(1, 2, 4),
    repeats=20,
    warmup=5,
    load_repeats=10,
)
CPU_DEFAULTS = dict(
    ranks=(8, 16, 32, 64),
    tokens=(1, 16, 64, 256),
    lora_tokens=(1, 16, 64),
    adapters=(1, 4),
    concurrency=(1, 2),
    repeats=5,
    warmup=2,
    load_repeats=3,
)

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
    concurrency: tuple[int, ...] = CPU_DEFAULTS["concurrency"]
    tp: tuple[int, ...] = (1,)
    repeats: int = 5
    warmup: int = 2
    load_repeats: int = 3
    targets: tuple[str, ...] = ALL_TARGETS
    parts: tuple[str, ...] = PARTS
    cold_cache: bool = True
    keep_adapters: bool = False
    seed: int = 0
    threads: int | None = None
    quiet: bool = False
    command_line: list[str] = field(default_factory=list)

    @property
    def adapter_dtype(self) -> str:
        """Dtype of the adapter weights (files, copies): the model's serving dtype."""
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
        v = parse_int_list(getattr(args, name.replace("-", "_"), None), name)
        return v if v is not None else defaults[name.replace("-", "_")]

    dtype = args.dtype or ("float16" if device == "cuda" else "float32")
    if dtype not in ("float16", "bfloat16", "float32"):
        raise ValueError(f"--dtype must be float16, bfloat16 or float32, got {dtype!r}")
    parts = tuple(PARTS) if not args.parts else tuple(p.strip() for p in args.parts.split(",") if p.strip())
    bad = [p for p in parts if p not in PARTS]
    if bad:
        raise ValueError(f"--parts: unknown part(s) {bad}; choose from {', '.join(PARTS)}")
    targets = ALL_TARGETS if not args.targets else tuple(t.strip() for t in args.targets.split(",") if t.strip())
    for t in targets:
        spec.module_shape(t)  # validates the name
    repeats = args.repeats if args.repeats is not None else defaults["repeats"]
    warmup = args.warmup if args.warmup is not None else defaults["warmup"]
    load_repeats = args.load_repeats if args.load_repeats is not None else defaults["load_repeats"]
    if repeats < 1 or warmup < 0 or load_repeats < 1:
        raise ValueError("--repeats and --load-repeats must be >= 1 and --warmup >= 0")
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
        concurrency=pick("concurrency"),
        tp=tp,
        repeats=int(repeats),
        warmup=int(warmup),
        load_repeats=int(load_repeats),
        targets=targets,
        parts=parts,
        cold_cache=not args.warm_cache,
        keep_adapters=args.keep_adapters,
        seed=args.seed,
        threads=getattr(args, "threads", None),
        quiet=args.quiet,
        command_line=list(getattr(args, "command_line", None) or []),
    )
