"""The run scenario: workload, policy, server and SLO options of ``twin run`` and ``twin compare``.

:class:`RunConfig` declares every option once, with its default and help text on the field;
the commands derive their flags from it (:func:`traces.flags.add_arguments`), so ``twin run``
and ``twin compare`` share names, defaults and meaning. :func:`build_workload` and
:func:`build_engine_config` turn a scenario into the workload and the :class:`EngineConfig`
a simulation takes.

**Checks before any work.** :func:`check_run` refuses every option value that makes no sense
(a non-positive rate, duration, horizon, SLO, slot count or KV size, an ambiguous rank list,
an unknown policy or workload option, ...) with a :class:`ConfigError` that names the flag and
the fix; :func:`build_workload` refuses workloads too large to generate
(:data:`traces.registry.MAX_REQUESTS`), empty ones and arrivals a run cannot simulate
(:func:`check_arrivals`: beyond :data:`MAX_SIM_SECONDS`, e.g. epoch timestamps, or none before the
horizon); :func:`check_server` refuses server set-ups vLLM would not start (weights larger than
the GPU memory, a KV cache smaller than one ``max_model_len`` request, a tensor-parallel degree
that does not divide the model's heads).

**Scenario files.** A scenario is a mapping of :class:`RunConfig` field names to values (TOML,
YAML or JSON; :func:`load_scenario_file`). Every ``summary.json`` carries the resolved scenario
(:func:`resolved_scenario`) under ``"scenario"``: every field, the profile's name and content
hash and the policy's parameters, so ``twin run --config RUN/summary.json`` replays the run;
:func:`to_toml` writes it as TOML (``twin run --dump-config``).
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import json
import math
import re
import tomllib
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar

from traces.adapters import parse_popularity
from traces.arguments import RepeatedKey, did_you_mean, parse_list, unique_keys_object
from traces.flags import flag_name
from traces.lengths import LENGTH_SOURCE_MODELS
from traces.registry import BUILTINS, REAL_OPTIONS, get_workload, run_defaults, seed_acts
from traces.synth import MAX_ADAPTERS, OPTIONS, option_value_problem
from traces.workload import Workload
from twin.config import (MAX_SIM_SECONDS, ConfigError, EngineConfig,  # noqa: F401  (MAX_SIM_SECONDS re-exported)
                         vllm_default_limits)
from twin.perf.profile import DEFAULT_FITTED, GPU_GB, Profile, available_profiles, gpu_memory_gb, parse_lora_targets
from twin.interfaces import PolicyError, check_policy_objects
from twin.registry import CACHES, PRESETS, SCHEDULERS, load_entry_points, resolve_policy, resolve_system
from twin.slora_engine import batch_max_tokens, check_slora_config, slora_pool_tokens
from twin.tensor_parallel import calibrated_degree, kv_tokens_for_memory, tp_profile, valid_degrees

#: GPU adapter slots when none are given, capped at the number of adapters. With max rank
#: 128, 32 slots would leave Llama-3.1-8B on an H100 less KV than one 131,072-token request,
#: and vLLM would refuse to start.
DEFAULT_ADAPTER_SLOTS = 16


def parse_ranks(text: Any) -> list[int]:
    """Adapter ranks such as ``8,16,32`` (a dashed ``8-128`` is refused: a range or a list?)."""
    return parse_list(text, int, "--ranks", minimum=1, dashes=False)


def parse_key_value(text: str, flag: str = "--trace-opt") -> tuple[str, Any]:
    """``KEY=VALUE`` -> ``(KEY, VALUE)``; the value is a Python literal when it reads as one (``5``,
    ``0.5``, ``True``, ``None``, ``'x'``), else the text."""
    if "=" not in text:
        raise ValueError(f"{flag} takes KEY=VALUE, got {text!r}")
    key, value = text.split("=", 1)
    if not key.strip():
        raise ValueError(f"{flag} takes KEY=VALUE, got {text!r} (no key)")
    try:
        return key.strip(), ast.literal_eval(value)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return key.strip(), value


def parse_workload_option(text: str) -> tuple[str, Any]:
    """A ``--trace-opt KEY=VALUE`` (:func:`parse_key_value`)."""
    return parse_key_value(text, "--trace-opt")


def parse_scheduler_option(text: str) -> tuple[str, Any]:
    """A ``--scheduler-opt KEY=VALUE`` (:func:`parse_key_value`)."""
    return parse_key_value(text, "--scheduler-opt")


def parse_cache_option(text: str) -> tuple[str, Any]:
    """A ``--cache-opt KEY=VALUE`` (:func:`parse_key_value`)."""
    return parse_key_value(text, "--cache-opt")


def _engine_field(name: str, flag: str | None = None, help: str | None = None) -> Any:
    """A scenario field with the default and help text of ``EngineConfig.<name>``."""
    f = next(f for f in dataclasses.fields(EngineConfig) if f.name == name)
    metadata = {"help": help or f.metadata["help"], **({"flag": flag} if flag else {})}
    return field(default=f.default, metadata=metadata)


@dataclass
class RunConfig:
    """One simulation scenario as the ``twin`` command describes it (``None``: the trace's or
    the profile's own value)."""

    # workload
    trace: str = field(default="synthetic", metadata={"help": "trace name (`twin traces list`) or a file path "
                                                              "(workload .parquet/.csv/.jsonl or a raw trace)"})
    rps: float | None = field(default=None, metadata={"help": "target mean request rate (a replayed trace is rescaled to it over its whole span, so a --duration window of "
                "it may offer more or less: the summary's offered_rps)"})
    duration: float | None = field(default=None, metadata={"help": "seconds of arrivals to keep/generate"})
    adapters: int | None = field(default=None, metadata={"help": "number of adapters (0: the base model only)"})
    ranks: list[int] | None = field(default=None, metadata={
        "help": "adapter ranks, comma-separated, e.g. 8,16,32,64,128", "parse": parse_ranks})
    popularity: str | None = field(default=None, metadata={
        "help": "adapter popularity, e.g. powerlaw, zipf:1.2, U-P"})
    trace_options: list[tuple[str, Any]] = field(default_factory=list, metadata={
        "help": "extra workload option (repeatable), e.g. length_scale=0.5", "flag": "--trace-opt",
        "action": "append", "metavar": "KEY=VALUE", "parse": parse_workload_option})
    seed: int = field(default=0, metadata={"help": "random seed of the workload"})
    data_dir: str | None = field(default=None, metadata={"help": "data directory (default $TWIN_DATA_DIR)"})
    # policy
    policy: str | None = field(default=None, metadata={
        "help": "preset: scheduler + cache (`twin policies`); default vllm"})
    scheduler: str | None = field(default=None, metadata={"help": "override the preset's scheduler"})
    cache: str | None = field(default=None, metadata={"help": "override the preset's adapter-cache policy"})
    system: str | None = field(default=None, metadata={
        "help": "serving system: vllm (vLLM v1 engine) or slora (S-LoRA's router and unified pool); default: the "
                "preset's (`twin policies`)"})
    scheduler_options: list[tuple[str, Any]] = field(default_factory=list, metadata={
        "help": "a constructor argument of the scheduler (repeatable), over the preset's, e.g. slo_s=5 for "
                "chameleon's quota SLO (a run's summary.json lists them: scenario.scheduler_params)",
        "flag": "--scheduler-opt", "action": "append", "metavar": "KEY=VALUE", "parse": parse_scheduler_option})
    cache_options: list[tuple[str, Any]] = field(default_factory=list, metadata={
        "help": "a constructor argument of the adapter-cache policy (repeatable), over the preset's, e.g. "
                "freq_window_s=60 for chameleon's cache", "flag": "--cache-opt", "action": "append",
        "metavar": "KEY=VALUE", "parse": parse_cache_option})
    # server
    profile: str | None = field(default=None, metadata={
        "help": f"profile name (`twin calibrate list`) or JSON file (default {DEFAULT_FITTED}: the calibrated "
                "Llama-3.1-8B / H100 / vLLM 0.8.5 profile with vLLM's per-step adapter check)"})
    slots: int | None = field(default=None, metadata={
        "help": f"GPU adapter slots of the vLLM engine (max_loras; default {DEFAULT_ADAPTER_SLOTS} capped at the "
                f"number of adapters; a given value is used as is: vLLM accepts more slots than adapters and sizes "
                f"its buffers for them). S-LoRA has no slots: refused for a run on it; `twin compare` gives it to "
                f"its vLLM presets only"})
    cpu_slots: int | None = _engine_field("max_cpu_loras", "--cpu-slots")
    max_lora_rank: int | None = _engine_field("max_lora_rank", help=(
        "rank every slot's buffers are padded to (vLLM --max-lora-rank; default: the largest rank in the workload); "
        "a vLLM option: refused for a run on S-LoRA, `twin compare` gives it to its vLLM presets only"))
    max_model_len: int | None = _engine_field("max_model_len")
    max_num_seqs: int | None = field(default=None, metadata={
        "help": "most requests running at once (vLLM --max-num-seqs; default: vLLM 0.8.5's for the GPU's memory, "
                "256 below 70 GiB and 1024 from 70 GiB, e.g. 1024 on an A100-80GB profile or --gpu-mem-gb 80)"})
    max_batched_tokens: int | None = field(default=None, metadata={
        "help": "token budget of one engine step (vLLM --max-num-batched-tokens; default: vLLM 0.8.5's API server's "
                "for the GPU's memory, 2048 below 70 GiB and 8192 from 70 GiB)", "flag": "--max-batched-tokens"})
    gpu_mem_gb: float | None = field(default=None, metadata={
        "help": "GPU memory in GB as the GPU states it, read as GiB (2^30 bytes), e.g. 80 for an H100-80GB; the KV "
                "capacity follows from it (default: the profile's GPU)"})
    kv_tokens: int | None = _engine_field("kv_capacity_tokens", help=(
        "override the KV capacity (tokens); at most what the GPU memory holds (the profile's GPU, or --gpu-mem-gb)"))
    tp: int = _engine_field("tensor_parallel")
    lora_targets: str | None = _engine_field("lora_targets")
    max_total_tokens: int | None = _engine_field("max_total_tokens")
    slora_prefetch: bool = _engine_field("slora_prefetch")
    slora_max_wait_tokens: int = _engine_field("slora_max_wait_tokens")
    slora_max_prompt_len: int = _engine_field("slora_max_prompt_len")
    slora_max_total_len: int = _engine_field("slora_max_total_len")
    slora_batch_max_tokens: int | None = _engine_field("slora_batch_max_tokens")
    # run
    horizon: float | None = field(default=None, metadata={
        "help": "stop the simulation at this time; requests in flight count as unfinished"})
    ttft_slo: float | None = field(default=None, metadata={"help": "TTFT SLO in seconds (SLO attainment)"})
    tbt_slo: float | None = field(default=None, metadata={"help": "time-between-tokens SLO in seconds"})
    frontend_ms: float = field(default=0.0, metadata={
        "help": "front-end latency in ms: the request's path outside the engine (API server, tokeniser, streamed "
                "chunk), added to the client-observed TTFT and E2E, not to ITL/TPOT; 0: the engine's own times "
                "(twin validate uses 8.6, fitted on the real runs' fit split)"})
    serving_us: float = field(default=0.0, metadata={
        "help": "host time of the serving path in microseconds per running request and engine step (vLLM behind "
                "its API server with streaming clients), added to every step; 0: the calibrated engine alone "
                "(twin validate uses 18, fitted on the real runs' fit split)"})
    rank_tile_cost: float | None = field(default=None, metadata={
        "help": "cost of a LoRA shrink rank tile beyond the first, relative to the first (vLLM 0.8.5's kernel tiles "
                "the rank by 16: rank-32 slots run two tiles); default: the profile's own (1 in the calibrated "
                "profiles, measured at rank 8 only; twin validate uses 0.7091, fitted on the real runs' fit split)"})

    #: the sections of the flags' help (:func:`traces.flags.add_arguments`): every field under one title
    FLAG_GROUPS: ClassVar[dict[str, tuple[str, ...]]] = {
        "workload": ("trace", "rps", "duration", "adapters", "ranks", "popularity", "trace_options", "seed",
                     "data_dir"),
        "policy": ("policy", "scheduler", "cache", "system", "scheduler_options", "cache_options"),
        "server (profile, GPU, vLLM engine)": ("profile", "slots", "cpu_slots", "max_lora_rank", "max_model_len",
                                               "max_num_seqs", "max_batched_tokens", "gpu_mem_gb", "kv_tokens", "tp",
                                               "lora_targets"),
        "S-LoRA server (--system slora)": ("max_total_tokens", "slora_prefetch", "slora_max_wait_tokens",
                                           "slora_max_prompt_len", "slora_max_total_len",
                                           "slora_batch_max_tokens"),
        "run": ("horizon", "ttft_slo", "tbt_slo"),
        "terms fitted on the real runs (twin validate's; unset: the calibrated engine alone)": (
            "frontend_ms", "serving_us", "rank_tile_cost"),
    }

    def adapter_slots(self, n_adapters: int) -> int:
        """``slots``, or :data:`DEFAULT_ADAPTER_SLOTS` capped at ``n_adapters`` (at least 1)."""
        if self.slots is not None:
            return self.slots
        return max(1, min(n_adapters, DEFAULT_ADAPTER_SLOTS) if n_adapters else 1)



RUN_FIELDS: dict[str, dataclasses.Field] = {f.name: f for f in dataclasses.fields(RunConfig)}


def option_name(name: str) -> str:
    """The flag of a :class:`RunConfig` field (``max_batched_tokens`` -> ``--max-batched-tokens``)."""
    return flag_name(RUN_FIELDS[name])


# --------------------------------------------------------------------------- option checks
#: numeric options: (integer?, lower bound, bound allowed?, what to give)
_NUMERIC: dict[str, tuple[bool, float, bool, str]] = {
    "rps": (False, 0, False, "the mean request rate in requests per second, e.g. --rps 2"),
    "duration": (False, 0, False, "seconds of arrivals, e.g. --duration 300"),
    "adapters": (True, 0, True, "a number of adapters, e.g. --adapters 100 (0: the base model only)"),
    "seed": (True, 0, True, "a non-negative integer, e.g. --seed 0"),
    "slots": (True, 1, True, "at least one GPU adapter slot, e.g. --slots 16"),
    "cpu_slots": (True, 1, True, "at least as many CPU slots as GPU slots, e.g. --cpu-slots 64"),
    "max_lora_rank": (True, 1, True, "a rank of at least 1, e.g. --max-lora-rank 128"),
    "max_model_len": (True, 1, True, "a context length in tokens, e.g. --max-model-len 8192"),
    "max_num_seqs": (True, 1, True, "at least one running request, e.g. --max-num-seqs 256"),
    "max_batched_tokens": (True, 1, True, "a token budget per step, e.g. --max-batched-tokens 2048"),
    "gpu_mem_gb": (False, 0, False, "the GPU memory in GB as the GPU states it, e.g. --gpu-mem-gb 80"),
    "kv_tokens": (True, 1, True, "a KV capacity in tokens, e.g. --kv-tokens 200000 (or leave it to the profile)"),
    "tp": (True, 1, True, "a tensor-parallel degree that divides the model's heads, e.g. --tp 2"),
    "max_total_tokens": (True, 2, True, "S-LoRA's pool in token slots, e.g. --max-total-tokens 65000"),
    "slora_max_wait_tokens": (True, 1, True, "decodes between S-LoRA's admission attempts, at least 1, e.g. "
                                             "--slora-max-wait-tokens 10 (S-LoRA's own)"),
    "slora_max_prompt_len": (True, 1, True, "a prompt length in tokens, e.g. --slora-max-prompt-len 2048"),
    "slora_max_total_len": (True, 1, True, "a request length in tokens, e.g. --slora-max-total-len 3072"),
    "slora_batch_max_tokens": (True, 1, True, "prompt tokens of one prefill mini-batch, e.g. "
                                              "--slora-batch-max-tokens 8192 (or leave it to max(N_tok/6, --slora-max-total-len))"),
    "horizon": (False, 0, False, "the simulated seconds to stop at, e.g. --horizon 600 (or leave it out to "
                                 "run until every request finished)"),
    "ttft_slo": (False, 0, False, "a TTFT SLO in seconds, e.g. --ttft-slo 2"),
    "tbt_slo": (False, 0, False, "a time-between-tokens SLO in seconds, e.g. --tbt-slo 0.1"),
    "frontend_ms": (False, 0, True, "a front-end latency in ms, e.g. --frontend-ms 8.6 (0: the engine's own times)"),
    "serving_us": (False, 0, True, "microseconds per running request and step, e.g. --serving-us 18 (0: the "
                                   "calibrated engine alone)"),
    "rank_tile_cost": (False, 0, True, "a cost relative to the first rank tile, e.g. --rank-tile-cost 0.7091 (or leave "
                                       "it to the profile)"),
}


#: upper bounds of the host-time terms and the rank tile cost (a value above would be an error of
#: units or of typing: ``--frontend-ms 1e300`` ran, and printed latencies of 300 digits): the largest
#: value, and what it means
HOST_TERM_MAXIMA: dict[str, tuple[float, str]] = {
    "frontend_ms": (1e6, "1,000 s per request"),
    "serving_us": (1e6, "1 s per running request and step"),
    "rank_tile_cost": (100.0, "a rank tile costing 100 times the first"),
    # (not a host term, bounded the same way: 1e300 GB failed inside the KV sizing with "cannot convert float NaN")
    "gpu_mem_gb": (1e5, "100 TB on one GPU"),
}


def check_host_term(name: str, v: float, flag: str | None = None, fix: str | None = None) -> None:
    """The :class:`RunConfig` number ``name`` (``frontend_ms``, ``serving_us``, ``rank_tile_cost``) is
    finite, within its lower bound (:data:`_NUMERIC`) and at most its :data:`HOST_TERM_MAXIMA`; otherwise
    a :class:`ConfigError` naming ``flag`` (default the option's) and the fix."""
    _, low, inclusive, default_fix = _NUMERIC[name]
    flag = flag or option_name(name)
    fix = fix or default_fix
    check_number(flag, v, low, inclusive, fix)
    high, meaning = HOST_TERM_MAXIMA[name]
    if v > high:
        raise ConfigError(f"{flag} {v:g}: more than {high:g} ({meaning}); give {fix}")


_RUN_HINTS: dict[str, Any] = {}


def _run_hint(name: str) -> Any:
    """The type hint of :class:`RunConfig` field ``name``, resolved once (``typing.get_type_hints`` evaluates every
    annotation string of the class on each call: about 2 ms, which a sweep's or a reproduction's thousands of
    checked runs paid again and again)."""
    if not _RUN_HINTS:
        _RUN_HINTS.update(typing.get_type_hints(RunConfig))
    return _RUN_HINTS[name]


def _check_type(name: str, value: Any) -> Any:
    """``value`` as the type of field ``name`` (a scenario file's value), or ConfigError."""
    hint = _run_hint(name)
    flag = option_name(name)
    if value is None:
        if type(None) in typing.get_args(hint):
            return None
        raise ConfigError(f"{flag}: a value is required (default {RUN_FIELDS[name].default!r})")
    if name == "ranks":
        try:
            return parse_ranks(value)
        except ValueError as e:
            raise ConfigError(str(e)) from None
    if name == "trace_options":
        return _trace_options(value)
    if name in ("scheduler_options", "cache_options"):
        return _key_values(value, "--scheduler-opt" if name == "scheduler_options" else "--cache-opt", name)
    base = next((a for a in (typing.get_args(hint) or (hint,)) if a is not type(None)), hint)
    if base is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{flag}: expected true or false, got {value!r}")
        return value
    if base is int:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (
                isinstance(value, float) and not value.is_integer()):
            raise ConfigError(f"{flag}: expected an integer, got {value!r}")
        if isinstance(value, float) and abs(value) > 2 ** 53:  # (1e308 would be a 309-digit integer)
            raise ConfigError(f"{flag}: {value!r} is not an exact integer (a float beyond 2**53); write the "
                              f"whole number, e.g. {flag} 16")
        return int(value)
    if base is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{flag}: expected a number, got {value!r}")
        return float(value)
    if base is str:
        if not isinstance(value, str):
            raise ConfigError(f"{flag}: expected a string, got {value!r}")
        return value
    return value


def _trace_options(value: Any) -> list[tuple[str, Any]]:
    """``trace_options`` from a file: a table ``{key = value}``, ``["key=value", ...]`` or ``[[key, value], ...]``."""
    return _key_values(value, "--trace-opt", "trace_options")


def _key_values(value: Any, flag: str, name: str) -> list[tuple[str, Any]]:
    """Options given as ``flag KEY=VALUE`` (the workload's, a policy's) as a file holds them: a table
    ``{key = value}``, ``["key=value", ...]`` or ``[[key, value], ...]``."""
    if isinstance(value, dict):
        return [(str(k), v) for k, v in value.items()]
    if isinstance(value, (list, tuple)):
        out = []
        for item in value:
            if isinstance(item, str):
                try:
                    out.append(parse_key_value(item, flag))
                except ValueError as e:
                    raise ConfigError(str(e)) from None
            elif isinstance(item, (list, tuple)) and len(item) == 2 and isinstance(item[0], str):
                out.append((item[0], item[1]))
            else:
                raise ConfigError(f"{flag} / {name}: expected KEY=VALUE entries, got {item!r}")
        return out
    raise ConfigError(f"{flag} / {name}: expected a table of KEY = VALUE, got {value!r}")


def _check_policy_options(run: "RunConfig") -> None:
    """The policies the run builds implement their protocols (:func:`twin.interfaces.check_policy_objects`: a
    plug-in's constructor arguments stored, its capabilities in range), and ``--scheduler-opt`` /
    ``--cache-opt`` give each key once, each a constructor argument of the policy it names, with a value the
    policy takes (a built-in's kinds and ranges), before any work."""
    for flag, options in (("--scheduler-opt", run.scheduler_options), ("--cache-opt", run.cache_options)):
        keys = [k for k, _ in options]
        twice = sorted({k for k in keys if keys.count(k) > 1})
        if twice:
            raise ConfigError(f"{flag} {twice[0]}=... is given twice; give it once")
    try:  # (the policies the run builds, checked as an engine checks them: a plug-in's too)
        s, c, _ = resolve_policy(run.policy, run.scheduler, run.cache, dict(run.scheduler_options),
                                 dict(run.cache_options))
        check_policy_objects(s, c)
    except (PolicyError, TypeError, ValueError) as e:
        if not (run.scheduler_options or run.cache_options):
            raise ConfigError(str(e)) from None
        flag = "--scheduler-opt" if run.scheduler_options and not run.cache_options else \
            "--cache-opt" if run.cache_options and not run.scheduler_options else "--scheduler-opt / --cache-opt"
        given = ", ".join(f"{k}={v!r}" for k, v in [*run.scheduler_options, *run.cache_options])
        why = str(e) if isinstance(e, (PolicyError, KeyError)) or "option" in str(e) else \
            f"{e} (of {given}); give a value it takes" if isinstance(e, ValueError) else \
            f"the policy could not take {given} ({type(e).__name__}: {e}); give values of the kind its defaults are"
        raise ConfigError(f"{flag}: {why}") from None


def _check_trace_options(options: list[tuple[str, Any]]) -> None:
    known = sorted(OPTIONS) + sorted(REAL_OPTIONS)
    keys = [k for k, _ in options]
    twice = sorted({k for k in keys if keys.count(k) > 1})
    if twice:  # (the workload read the first value and the summary recorded the last)
        raise ConfigError(f"--trace-opt {twice[0]}=... is given twice; give it once")
    for key, value in options:
        if key not in OPTIONS and key not in REAL_OPTIONS:
            raise ConfigError(f"--trace-opt: unknown workload option {key!r}; known options: {', '.join(known)} "
                              f"(`twin traces synth --help` describes them)")
        if key in OPTIONS:
            conv = OPTIONS[key][2]
            try:
                v = conv(value)
            except TypeError as e:
                what = {list: "a list", tuple: "a list", dict: "a table"}.get(type(value))
                msg = f"{what} where one value belongs" if what else str(e)
                raise ConfigError(f"--trace-opt {key}={value!r}: {msg}; {OPTIONS[key][3]}") from None
            except (ValueError, OverflowError) as e:
                raise ConfigError(f"--trace-opt {key}={value!r}: {e}; {OPTIONS[key][3]}") from None
            problem = option_value_problem(key, v)
            if problem:
                shown = ",".join(map(str, value)) if isinstance(value, (list, tuple)) else repr(value)
                raise ConfigError(f"--trace-opt {key}={shown}: {problem}")
            if key == "popularity":
                _check_popularity(v, f"--trace-opt {key}")


def _check_popularity(value: str, flag: str = "--popularity") -> None:
    try:
        parse_popularity(value)
    except (ValueError, TypeError, KeyError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
        raise ConfigError(f"{flag}: {msg}") from None


def check_number(flag: str, v: float, low: float, inclusive: bool, fix: str) -> None:
    """A flag's number is finite and above ``low`` (or at it with ``inclusive``); otherwise a
    :class:`ConfigError` naming the flag, the bound and ``fix`` (what to give)."""
    if not math.isfinite(v):
        raise ConfigError(f"{flag} {v}: must be a finite number; give {fix}")
    if v < low or (v == low and not inclusive):
        bound = f">= {low:g}" if inclusive else f"> {low:g}"
        raise ConfigError(f"{flag} {v:g}: must be {bound}; give {fix}")


def check_slo(flag: str, v: float | None, horizon: float | None, fix: str) -> None:
    """An SLO in seconds that some request could miss: finite and > 0 (:func:`check_number`), at most
    :data:`MAX_SIM_SECONDS` (the longest a run may simulate; ``twin compare --slo`` has the same bound) and at
    most ``horizon`` when one is given (no latency of the run can exceed the simulated time, so a larger SLO is met
    by every request that finishes and bounds nothing); otherwise a :class:`ConfigError` naming ``flag``, the bound
    and ``fix``."""
    if v is None:
        return
    check_number(flag, v, 0, False, fix)
    if v > MAX_SIM_SECONDS:
        raise ConfigError(f"{flag} {v:g}: beyond the {MAX_SIM_SECONDS:g} s (about 3 years) a run may simulate, so "
                          f"every request would meet it; give {fix}")
    if horizon is not None and v > horizon:
        raise ConfigError(f"{flag} {v:g}: beyond --horizon {horizon:g}: no latency of the run can exceed the "
                          f"simulated time, so every request that finishes would meet it; give {fix} (at most the "
                          f"horizon), or raise --horizon")


def check_run(run: RunConfig) -> None:
    """Refuse option values that make no sense, naming the flag and the fix (no work done)."""
    for name in RUN_FIELDS:
        setattr(run, name, _check_type(name, getattr(run, name)))
    for name, (integer, low, inclusive, fix) in _NUMERIC.items():
        v = getattr(run, name)
        if v is not None:
            check_number(option_name(name), v, low, inclusive, fix)
            if name in HOST_TERM_MAXIMA:
                check_host_term(name, v)
    for name in ("ttft_slo", "tbt_slo"):
        check_slo(option_name(name), getattr(run, name), run.horizon, _NUMERIC[name][3])
    if run.horizon is not None and run.horizon > MAX_SIM_SECONDS:
        raise ConfigError(f"--horizon {run.horizon:g}: beyond the {MAX_SIM_SECONDS:g} s (about 3 years) a run may "
                          f"simulate; the summary's rates are per second up to the horizon, so they would read ~0; "
                          f"give the seconds to measure, e.g. --horizon 600 (or leave it out to run until every "
                          f"request finished)")
    if run.adapters is not None and run.adapters > MAX_ADAPTERS:
        raise ConfigError(f"--adapters {run.adapters}: more than the {MAX_ADAPTERS:,} adapters a workload may have "
                          f"(the popularity tables hold one entry per adapter); give fewer")
    seqs, tokens = run.max_num_seqs, run.max_batched_tokens  # (one left out: engine_limits checks its default)
    if seqs is not None and tokens is not None and tokens < seqs:
        raise ConfigError(f"--max-batched-tokens {run.max_batched_tokens} is below --max-num-seqs "
                          f"{run.max_num_seqs} (vLLM refuses a step budget smaller than the running requests); raise "
                          f"--max-batched-tokens or lower --max-num-seqs")
    if run.slots is not None and run.cpu_slots is not None and run.cpu_slots < run.slots:
        raise ConfigError(f"--cpu-slots {run.cpu_slots} is below --slots {run.slots} (vLLM requires max_cpu_loras >= "
                          f"max_loras); raise --cpu-slots or lower --slots")
    if run.popularity is not None:
        _check_popularity(run.popularity)
    if not run.trace.strip():
        raise ConfigError("--trace: empty; give a trace name (`twin traces list`) or a file path")
    if run.profile is not None and not run.profile.strip():  # (load_profile reads '' as the default)
        raise ConfigError("--profile: empty; give a profile name (`twin calibrate list`) or a profile JSON file, or "
                          "leave --profile out for the default")
    if run.data_dir is not None and not str(run.data_dir).strip():
        raise ConfigError("--data-dir: empty; give the data directory, or leave --data-dir out for $TWIN_DATA_DIR")
    if run.data_dir is not None and not Path(run.data_dir).expanduser().is_dir():  # (ignored where no data was read)
        what = "is a file" if Path(run.data_dir).expanduser().exists() else "does not exist"
        raise ConfigError(f"--data-dir {run.data_dir}: {what}; give the data directory (the one holding traces/, "
                          f"calibration/, ...), or leave --data-dir out for $TWIN_DATA_DIR")
    _check_trace_options(run.trace_options)
    given = {"rps", "duration", "adapters", "ranks", "popularity"}
    twice = [k for k, _ in run.trace_options if k in given and getattr(run, k) is not None]
    if twice:
        raise ConfigError(f"--trace-opt {twice[0]}=... repeats {option_name(twice[0])}; give it once")
    load_entry_points()
    if run.policy is not None and run.policy not in PRESETS:
        raise ConfigError(f"unknown policy {run.policy!r}{did_you_mean(run.policy, PRESETS)}; available presets: "
                          f"{', '.join(sorted(PRESETS))}; "
                          f"or mix with --scheduler and --cache (`twin policies`)")
    if run.scheduler is not None and run.scheduler not in SCHEDULERS:
        raise ConfigError(f"--scheduler: unknown scheduler {run.scheduler!r}{did_you_mean(run.scheduler, SCHEDULERS)}; "
                          f"available: "
                          f"{', '.join(sorted(SCHEDULERS))} (`twin policies`)")
    if run.cache is not None and run.cache not in CACHES:
        raise ConfigError(f"--cache: unknown adapter-cache policy {run.cache!r}{did_you_mean(run.cache, CACHES)}; "
                          f"available: "
                          f"{', '.join(sorted(CACHES))} (`twin policies`)")
    _check_policy_options(run)
    _check_system(run)


#: the ``max_lora_rank`` values vLLM 0.8.5 accepts (``LoRAConfig.__post_init__``: ``possible_max_ranks``,
#: ``vllm/config.py`` of the 0.8.5 wheel, line 2677)
VLLM_MAX_LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)
#: the ``max_lora_rank`` values vLLM 0.5.0 accepts (the same check, ``vllm/config.py`` of the 0.5.0 wheel, line
#: 1054): the servers of the older calibration runs (``calibration.fitting.vllm050``); the twin's engine is 0.8.5's
VLLM050_MAX_LORA_RANKS = (8, 16, 32, 64)


def rank_limit(system: str, model: Any | None = None) -> tuple[int, str]:
    """The largest adapter rank a run may serve, and why: on vLLM the largest ``max_lora_rank`` it
    accepts (:data:`VLLM_MAX_LORA_RANKS`; an adapter above ``max_lora_rank`` is refused); on either
    system the model's hidden size (``model``, a :class:`twin.model_spec.ModelSpec`), beyond which an
    adapter is no low-rank update of its layers."""
    limit, why = (VLLM_MAX_LORA_RANKS[-1], f"the largest --max-lora-rank vLLM accepts "
                                           f"({', '.join(map(str, VLLM_MAX_LORA_RANKS))}; LoRAConfig)") \
        if system == "vllm" else (None, "")
    if model is not None and (limit is None or model.hidden < limit):
        limit, why = model.hidden, f"{model.name}'s hidden size: a higher rank is no low-rank update of its layers"
    return (limit if limit is not None else 2 ** 62), why


def _check_system(run: RunConfig) -> None:
    """``--system``, ``--lora-targets`` and ``--max-total-tokens``: a known name, a combination
    the system can run (S-LoRA: one GPU; ``--max-total-tokens`` is S-LoRA's pool)."""
    try:
        system = resolve_system(run.policy, run.system)
    except KeyError as e:
        raise ConfigError(f"--system: {e.args[0]}") from None
    if run.lora_targets is not None:
        try:
            parse_lora_targets(run.lora_targets)
        except ValueError as e:
            raise ConfigError(str(e)) from None
    if system == "slora":
        why = "--system slora" if run.system else f"preset {run.policy!r} runs on S-LoRA"
        if run.tp > 1:
            raise ConfigError(f"--tp {run.tp} with the S-LoRA system ({why}): the released S-LoRA runs on one GPU "
                              f"(LoraTpPartAdapter asserts world_size == 1); give --tp 1 or --system vllm")
        if run.rank_tile_cost is not None:
            raise ConfigError(f"--rank-tile-cost with the S-LoRA system ({why}): it prices vLLM 0.8.5's Triton shrink "
                              f"kernel, and S-LoRA's paged kernels price each request at its own rank; leave it out "
                              f"or give --system vllm")
        if run.max_total_tokens is not None and run.kv_tokens is not None:
            raise ConfigError(f"--kv-tokens {run.kv_tokens} and --max-total-tokens {run.max_total_tokens} with the "
                              f"S-LoRA system ({why}): both size S-LoRA's one pool of token slots (--max-total-tokens "
                              f"wins, --kv-tokens was ignored); give one of them")
        _, cache, _ = resolve_policy(run.policy, run.scheduler, run.cache)
        check_slora_config(EngineConfig(), cache)
    if system != "slora" and run.max_total_tokens is not None:
        raise ConfigError("--max-total-tokens sizes S-LoRA's pool (--system slora); on the vLLM engine give "
                          "--kv-tokens")
    if run.ranks and max(run.ranks) > rank_limit(system)[0]:
        limit, why = rank_limit(system)
        raise ConfigError(f"--ranks {max(run.ranks)}: above {limit}, {why}: vLLM cannot serve such an adapter; give "
                          f"ranks of at most {limit}, e.g. --ranks 8,16,32")
    if system == "vllm" and run.max_lora_rank is not None and run.max_lora_rank not in VLLM_MAX_LORA_RANKS:
        up = min((r for r in VLLM_MAX_LORA_RANKS if r >= run.max_lora_rank), default=VLLM_MAX_LORA_RANKS[-1])
        raise ConfigError(f"--max-lora-rank {run.max_lora_rank}: vLLM accepts only "
                          f"{', '.join(map(str, VLLM_MAX_LORA_RANKS))} (LoRAConfig); give --max-lora-rank {up}")
    if system == "slora":
        prompt, total = run.slora_max_prompt_len, run.slora_max_total_len
        if prompt is not None and total is not None and not prompt < total:
            raise ConfigError(f"--slora-max-prompt-len {prompt} is not below --slora-max-total-len {total}: a prompt "
                              f"of the largest length needs room for an output token (S-LoRA's max_req_input_len < "
                              f"max_req_total_len); raise --slora-max-total-len or lower --slora-max-prompt-len")


#: ``twin run`` / ``twin compare`` options that one serving system only reads: option -> (the system, what the
#: other system does instead). Given on the command line for a run on the other system they would change nothing,
#: so they are refused (:func:`check_system_options`); ``twin compare`` refuses one only when none of its presets
#: reads it and gives it to the presets that do (:func:`for_preset`). ``--slots`` and ``--max-lora-rank`` are
#: among them: the S-LoRA engine has no adapter slots and pads no rank (nor does its pool reserve slot buffers, see
#: :func:`build_engine_config`). A scenario file (``--config``, a run's summary.json) records every option, so its
#: values are not refused, only the flags given.
SYSTEM_OPTIONS: dict[str, tuple[str, str]] = {
    "slots": ("vllm", "S-LoRA has no adapter slots: its unified pool holds the adapters' weights with the KV cache"),
    "max_lora_rank": ("vllm", "S-LoRA pads no adapter to a common rank: its kernels run each adapter at its own "
                              "rank"),
    "max_total_tokens": ("slora", "vLLM's KV cache is --kv-tokens or follows from the GPU memory"),
    "slora_prefetch": ("slora", "vLLM-engine policies prefetch through their own cache policy"),
    "slora_max_wait_tokens": ("slora", "vLLM's scheduler considers waiting requests at every step"),
    "slora_max_prompt_len": ("slora", "vLLM's limit is --max-model-len"),
    "slora_max_total_len": ("slora", "vLLM's limit is --max-model-len"),
    "slora_batch_max_tokens": ("slora", "vLLM's step budget is --max-batched-tokens"),
    "cpu_slots": ("vllm", "S-LoRA keeps every adapter in host memory"),
    "max_model_len": ("vllm", "S-LoRA's limits are --slora-max-prompt-len and --slora-max-total-len"),
    "max_num_seqs": ("vllm", "S-LoRA caps the running requests by its running_max_req_size"),
    "max_batched_tokens": ("vllm", "S-LoRA's prefill batch is its batch_max_tokens, max(N_tok/6, --slora-max-total-len)"),
    "rank_tile_cost": ("vllm", "S-LoRA's paged kernels price each request at its own rank"),
}
_SYSTEM_NAMES = {"vllm": "vLLM", "slora": "S-LoRA"}


def check_system_options(given: typing.Collection[str], runs_on: dict[str, str], system_given: bool,
                         compare: bool = False) -> None:
    """Refuse an option of ``given`` (the :class:`RunConfig` fields given on the command line) that no
    simulated run reads (:data:`SYSTEM_OPTIONS`): ``runs_on`` maps each simulated preset to its serving
    system; ``system_given``: ``--system`` chose it (else each preset's own); ``compare``: the presets are
    ``twin compare --policies`` (the fix names that flag)."""
    systems = set(runs_on.values())
    for name in given:
        if name not in SYSTEM_OPTIONS or SYSTEM_OPTIONS[name][0] in systems:
            continue
        needs, instead = SYSTEM_OPTIONS[name]
        other = next(iter(systems))
        if system_given:
            why = f"--system {other}"
        elif len(runs_on) == 1:
            preset = next(iter(runs_on))
            why = f"preset {preset!r} runs on {_SYSTEM_NAMES[other]}"
        else:
            why = f"presets {', '.join(runs_on)} all run on {_SYSTEM_NAMES[other]}"
        example = "slora" if needs == "slora" else "vllm"
        fix = f"give --system {needs}" + ("" if system_given else
                                          f" (or add a preset on {_SYSTEM_NAMES[needs]} to --policies, e.g. {example})"
                                          if compare else f" (or a preset on {_SYSTEM_NAMES[needs]}, e.g. --policy "
                                                          f"{example})")
        raise ConfigError(f"{option_name(name)}: an option of the {_SYSTEM_NAMES[needs]} engine, but the run is on the "
                          f"{_SYSTEM_NAMES[other]} engine ({why}), which does not read it ({instead}); leave "
                          f"{option_name(name)} out, or {fix}")


def for_preset(run: RunConfig, policy: str) -> RunConfig:
    """``run`` as preset ``policy`` runs it in a comparison of presets (``twin compare --policies``): with
    that preset, and with the options of the other serving system (:data:`SYSTEM_OPTIONS`) back at their
    defaults, so an S-LoRA option given for the S-LoRA presets does not stop the vLLM presets, nor the
    reverse (:func:`check_system_options` refuses one that no compared preset reads)."""
    system = resolve_system(policy, run.system)
    defaults = {f.name: f.default for f in dataclasses.fields(RunConfig)}
    reset = {name: defaults[name] for name, (needs, _) in SYSTEM_OPTIONS.items()
             if needs != system and getattr(run, name) != defaults[name]}
    if system == "slora" and run.max_total_tokens is not None and run.kv_tokens is not None:
        # (--max-total-tokens sizes the S-LoRA presets' pool, --kv-tokens the vLLM presets' KV cache; a comparison
        # of S-LoRA presets alone reads no --kv-tokens: compare refuses the pair, as twin run does)
        reset["kv_tokens"] = defaults["kv_tokens"]
    return dataclasses.replace(run, policy=policy, **reset)


# --------------------------------------------------------------------------- workload and server
def with_trace_defaults(run: RunConfig) -> RunConfig:
    """``run`` with its trace's scenario defaults (:func:`traces.registry.run_defaults`, e.g. the
    rate, window and ranks ``splitwise`` is replayed with) in the options left unset."""
    given = {k for k, _ in run.trace_options}
    if "n_requests" in given:  # (a request count instead of a window: no default window beside it)
        given.add("duration")
    unset = {k: v for k, v in run_defaults(run.trace).items() if getattr(run, k) is None and k not in given}
    return dataclasses.replace(run, **unset) if unset else run


def build_workload(run: RunConfig) -> Workload:
    """The workload of a scenario (:func:`traces.registry.get_workload`), after :func:`check_run`,
    with the trace's scenario defaults applied (:func:`with_trace_defaults`); an empty workload is refused."""
    check_run(run)
    run = with_trace_defaults(run)
    options = {"rps": run.rps, "duration": run.duration, "adapters": run.adapters, "ranks": run.ranks,
               "popularity": run.popularity}
    for key, value in run.trace_options:  # --trace-opt duration=5 is --duration 5
        if key in options and options[key] is None:
            options[key] = value
        elif key not in options:
            options[key] = value
    w = get_workload(run.trace, data_dir=run.data_dir, seed=run.seed, **options)
    if not len(w):
        given = ", ".join(f"--{k} {v:g}" for k, v in (("duration", options.get("duration")), ("rps", options.get("rps")))
                          if isinstance(v, (int, float)))
        raise ConfigError(f"the workload of --trace {run.trace} holds no request"
                          f"{f' (with {given})' if given else ''}; lengthen --duration or raise --rps")
    check_arrivals(run, w)
    return w


def check_adapter_options_act(run: RunConfig, w: Workload, given: typing.Collection[str]) -> None:
    """``--ranks`` and ``--popularity`` (of ``given``, the options given on the command line) shape the adapters of
    a workload: on one without adapters (a trace file with no ``adapter_id``, ``--adapters 0``) they change nothing,
    so they are refused (a recorded scenario holds the defaults it resolved, and replays). So is ``--seed`` on a
    saved workload file replayed as written: its seed only draws new adapters (:func:`traces.registry.seed_acts`)."""
    if "seed" in given:
        drawn = [k for k in ("adapters", "popularity") if getattr(run, k) is not None]
        drawn += [k for k, _ in run.trace_options if k in ("adapters", "popularity")]
        if not seed_acts(run.trace, run.data_dir, drawn):
            raise ConfigError(f"--seed {run.seed} has no effect: {run.trace} is a workload file, replayed as written "
                              f"(a seed only draws new adapters for it, with --adapters N or --popularity); leave "
                              f"--seed out, or give --adapters N to draw adapters with it")
    if not len(w) or (w.df["adapter_id"].to_numpy() >= 0).any():
        return
    for key in ("ranks", "popularity"):
        value = getattr(run, key)
        if key not in given or value is None:
            continue
        shown = ",".join(map(str, value)) if key == "ranks" else value
        why = ("--adapters 0" if run.adapters == 0 else f"the trace {run.trace!r} has no adapters here"
               if run.trace in BUILTINS else f"{run.trace} gives no request an adapter: no adapter_id column, or all -1")
        raise ConfigError(f"--{key} {shown} has no effect: the workload serves the base model only ({why}); give "
                          f"--adapters N to draw adapters, or leave --{key} out")


def _seconds(x: float) -> str:
    """A time in seconds written out in full (``1700000000``, ``109.5``), to the millisecond; past 1e15 s (no
    clock's timestamp: a garbled value) in ``%g`` form (``1e+300``)."""
    if not abs(x) < 1e15:
        return f"{x:g}"
    v = round(x, 3)
    return str(int(v)) if v.is_integer() else repr(v)


def check_arrivals(run: RunConfig, workload: Workload) -> None:
    """Arrivals a run can simulate: none beyond :data:`MAX_SIM_SECONDS` (the clock starts at 0; a
    trace of absolute, epoch timestamps is refused with how to rebase it), and the first one before
    ``--horizon``."""
    t = workload.df["arrival_s"]  # sorted
    t0, t1 = float(t.iloc[0]), float(t.iloc[-1])
    first, last = _seconds(t0), _seconds(t1)
    if t1 > MAX_SIM_SECONDS:
        if t0 > MAX_SIM_SECONDS:
            how = (f"arrival_s looks like absolute (epoch) timestamps: rebase the arrivals to start at 0 (subtract "
                   f"the first, {first}), or keep a window with --trace-opt window_start={first} "
                   f"[--duration SECONDS]")
        else:
            how = "shorten --duration, raise --rps, or keep a window with --trace-opt window_start=S --duration SECONDS"
        raise ConfigError(f"--trace {run.trace}: the arrivals run from {first} s to {last} s, beyond the "
                          f"{MAX_SIM_SECONDS:g} s (about 3 years) a run may simulate (the clock starts at 0 and the "
                          f"summary's rates are per second from 0); {how}")
    if run.horizon is not None and t0 >= run.horizon:
        raise ConfigError(f"--horizon {run.horizon:g}: the first request of --trace {run.trace} arrives at "
                          f"{first} s, so nothing arrives before the horizon; raise --horizon (the arrivals run "
                          f"to {last} s) or rebase the arrivals to start at 0")


def check_model(run: RunConfig, profile: Profile) -> None:
    """Options that depend on the model only: the tensor-parallel degree and ``max_model_len``; and
    ``--rank-tile-cost``, which needs a profile whose LoRA form has rank tiles."""
    if run.rank_tile_cost is not None:
        try:
            profile.with_rank_tile_cost(run.rank_tile_cost)
        except ValueError as e:
            raise ConfigError(f"--rank-tile-cost {run.rank_tile_cost:g}: {e}") from None
    m = profile.model
    try:
        system = resolve_system(run.policy, run.system)
    except KeyError as e:
        raise ConfigError(f"--system: {e.args[0]}") from None
    limit, why = rank_limit(system, m)
    if run.ranks and max(run.ranks) > limit:
        raise ConfigError(f"--ranks {max(run.ranks)}: above {limit}, {why}; give ranks of at most {limit}, e.g. "
                          f"--ranks 8,16,32")
    if run.tp > 1 and run.tp not in valid_degrees(m):  # twin/tensor_parallel.py: vLLM's QKVParallelLinear rule
        ok = valid_degrees(m)
        raise ConfigError(f"--tp {run.tp} does not divide {m.name}'s {m.heads} attention heads and {m.kv_heads} KV "
                          f"heads (vLLM refuses it); use one of {', '.join(map(str, ok))}")
    if run.max_model_len is not None and run.max_model_len > m.max_model_len:
        raise ConfigError(f"--max-model-len {run.max_model_len} exceeds {m.name}'s context length "
                          f"{m.max_model_len} (vLLM refuses it); give at most {m.max_model_len}")


def build_engine_config(run: RunConfig, workload: Workload, profile: Profile) -> EngineConfig:
    """The server settings of a scenario; with ``gpu_mem_gb`` (and no ``kv_tokens``) the KV
    capacity follows from the GPU memory (:func:`twin.perf.profile.kv_tokens_for_memory`).
    Refuses set-ups vLLM would not start (:func:`check_server`)."""
    check_model(run, profile)
    single_gpu = profile
    profile = tp_profile(profile, run.tp)  # weights, KV heads and LoRA buffers per GPU (twin/tensor_parallel.py)
    n_adapters = int(workload.df["adapter_id"].max() + 1) if len(workload.df) else 0
    slots = run.adapter_slots(n_adapters)
    max_lora_rank = run.max_lora_rank
    if max_lora_rank is None and resolve_system(run.policy, run.system) == "vllm":
        # vLLM takes a max_lora_rank of its list only, at least the largest adapter's: the default is the smallest
        # such (a workload of rank-33 adapters ran padded to 33, which vLLM refuses; it needs --max-lora-rank 64)
        ranks = workload.df.loc[workload.df["adapter_id"] >= 0, "adapter_rank"]
        top = int(ranks.max()) if len(ranks) else 0
        if top and top not in VLLM_MAX_LORA_RANKS and top < VLLM_MAX_LORA_RANKS[-1]:
            max_lora_rank = min(r for r in VLLM_MAX_LORA_RANKS if r >= top)
    max_num_seqs, max_batched_tokens = engine_limits(run, single_gpu)
    cfg = EngineConfig(max_num_batched_tokens=max_batched_tokens, max_num_seqs=max_num_seqs,
                       max_loras=slots, max_cpu_loras=run.cpu_slots, max_lora_rank=max_lora_rank,
                       max_model_len=run.max_model_len, kv_capacity_tokens=run.kv_tokens, tensor_parallel=run.tp,
                       lora_targets=run.lora_targets, max_total_tokens=run.max_total_tokens,
                       slora_max_prompt_len=run.slora_max_prompt_len, slora_max_total_len=run.slora_max_total_len,
                       slora_prefetch=run.slora_prefetch, slora_max_wait_tokens=run.slora_max_wait_tokens,
                       slora_batch_max_tokens=run.slora_batch_max_tokens)
    if run.gpu_mem_gb is not None and run.kv_tokens is None:
        max_rank = max_lora_rank or int(workload.df["adapter_rank"].max() or 0)
        # S-LoRA keeps no per-slot LoRA buffers: its unified pool holds the adapters' weights with the KV cache
        # (S-LoRA MemoryAllocator, pool_size_lora 0), so the memory left after the weights is all pool
        buffers = 0 if resolve_system(run.policy, run.system) == "slora" else slots
        cfg.kv_capacity_tokens = kv_tokens_in_memory(profile, run.gpu_mem_gb, buffers, max_rank, run.tp,
                                                     bool(buffers and max_rank))
    check_kv_fits(run, cfg, workload, profile)
    try:
        check_server(run, cfg, workload, profile)
    except KVCapacityError as e:  # a memory problem: more GPUs may hold the weights and the KV cache
        raise KVCapacityError(str(e) + _tp_hint(run, cfg, workload, single_gpu)) from None
    return cfg


def device_memory_gb(run: RunConfig, profile: Profile) -> float | None:
    """One GPU's memory in GB as GPUs state it (:data:`twin.perf.profile.GPU_GB`: GiB): ``--gpu-mem-gb`` when given,
    else what the profile's GPU names
    (``A100-80GB``), else None (unknown)."""
    return run.gpu_mem_gb if run.gpu_mem_gb is not None else gpu_memory_gb(profile.gpu)


def engine_limits(run: RunConfig, profile: Profile) -> tuple[int, int]:
    """``(max_num_seqs, max_batched_tokens)`` of a vLLM-engine run: the given ones, the others vLLM 0.8.5's
    API-server defaults for the GPU's memory (:func:`twin.config.vllm_default_limits`: 1,024 / 8,192 from 70 GiB,
    e.g. an A100-80GB profile, else 256 / 2,048, e.g. the H100-64GB calibration). A step budget below the running
    requests is refused, as vLLM refuses it (``SchedulerConfig._verify_args``), naming where each came from."""
    gb = device_memory_gb(run, profile)
    seqs_d, tokens_d = vllm_default_limits(None if gb is None else gb * GPU_GB)
    seqs = run.max_num_seqs if run.max_num_seqs is not None else seqs_d
    tokens = run.max_batched_tokens if run.max_batched_tokens is not None else tokens_d
    if tokens < seqs:
        gpu = f"a GPU of {run.gpu_mem_gb:g} GB" if run.gpu_mem_gb is not None else profile.gpu or "this GPU"

        def said(v: int, given: bool, flag: str) -> str:
            return f"{flag} {v}" if given else f"{flag} {v} (vLLM's default on {gpu})"
        raise ConfigError(f"{said(tokens, run.max_batched_tokens is not None, '--max-batched-tokens')} is below "
                          f"{said(seqs, run.max_num_seqs is not None, '--max-num-seqs')} (vLLM refuses a step budget "
                          f"smaller than the running requests); raise --max-batched-tokens or lower --max-num-seqs")
    return seqs, tokens


def _tp_hint(run: RunConfig, cfg: EngineConfig, workload: Workload, profile: Profile) -> str:
    """When the weights leave no KV room on one GPU of the profile: the smallest ``--tp`` that holds one
    ``max_model_len`` request (profiles sized by their own GPU memory only)."""
    if run.kv_tokens is not None or run.gpu_mem_gb is not None:
        return ""
    slots = cfg.max_loras if cfg.enable_lora else 0
    ranks = workload.df.loc[workload.df["adapter_id"] >= 0, "adapter_rank"]
    max_rank = (cfg.max_lora_rank or (int(ranks.max()) if len(ranks) else 0)) if slots else 0
    need = cfg.max_model_len or profile.model.max_model_len
    if calibrated_degree(profile) != 1:  # (it prices its calibrated degree only: tp_profile refuses the others)
        return ""
    for d in valid_degrees(profile.model, 8):
        if d > run.tp and tp_profile(profile, d).kv_capacity_tokens(slots, max_rank) >= need:
            return f"; or split the weights over more GPUs: --tp {d} holds it ({profile.name} on {profile.gpu})"
    return ""


def kv_tokens_in_memory(profile: Profile, gpu_mem_gb: float, slots: int, max_rank: int, tp: int,
                        slot_hint: bool, **memory: float) -> int:
    """:func:`twin.tensor_parallel.kv_tokens_for_memory`, a memory too small for the weights (and slot
    buffers) a :class:`ConfigError` naming ``--gpu-mem-gb`` (with ``slot_hint``: and fewer slots or a
    lower rank as the other fixes); ``memory``: its ``utilization`` and ``runtime_overhead_gb``."""
    try:
        return kv_tokens_for_memory(profile, gpu_mem_gb, slots, max_rank, tp, **memory)
    except ValueError as e:
        if slot_hint and slots:  # fewer slots help only when the weights alone fit
            try:
                kv_tokens_for_memory(profile, gpu_mem_gb, 0, 0, tp, **memory)
            except ValueError:
                slot_hint = False
        raise ConfigError(f"--gpu-mem-gb {gpu_mem_gb:g}: {e}; give a larger --gpu-mem-gb"
                          + (", fewer --slots or a lower --max-lora-rank" if slot_hint else "")) from None


def check_kv_fits(run: RunConfig, cfg: EngineConfig, workload: Workload, profile: Profile) -> None:
    """A KV size given as such (``--kv-tokens``; S-LoRA's pool, ``--max-total-tokens``) fits in the GPU's memory:
    at most what the whole memory holds after the weights (and, on vLLM, the adapter slots' LoRA buffers) even at
    ``--gpu-memory-utilization 1.0`` with no runtime reserve (:func:`twin.tensor_parallel.kv_tokens_for_memory`),
    the memory being ``--gpu-mem-gb`` when given, else the one the profile's GPU names (``H100-64GB``; a profile
    whose GPU names none is not checked). A value below that bound is a cache vLLM could allocate at a higher
    utilization than its default 0.9 (``num_gpu_blocks_override``), so it is accepted; a larger one could not be
    allocated at all, and the error gives both numbers. ``profile``: the per-GPU profile
    (:func:`twin.tensor_parallel.tp_profile`)."""
    given = [(name, v) for name, v in (("kv_tokens", run.kv_tokens), ("max_total_tokens", run.max_total_tokens))
             if v is not None]
    mem = device_memory_gb(run, profile)
    if not given or mem is None:
        return
    slora = resolve_system(run.policy, run.system) == "slora"
    df = workload.df
    ranks = df.loc[df["adapter_id"] >= 0, "adapter_rank"]
    top_rank = int(ranks.max()) if len(ranks) else 0
    slots = 0 if slora or not cfg.enable_lora else cfg.max_loras  # (S-LoRA's pool reserves no slot buffers)
    max_rank = (cfg.max_lora_rank or top_rank) if slots else 0
    most = kv_tokens_in_memory(profile, mem, slots, max_rank, run.tp, bool(slots and max_rank), utilization=1.0,
                               runtime_overhead_gb=0.0)
    if run.gpu_mem_gb is not None:
        memory = f"the whole {mem:g} GB of GPU memory (--gpu-mem-gb)"
        more = "a larger --gpu-mem-gb"
    else:
        memory = f"the whole {mem:g} GB of profile {profile.name}'s GPU ({profile.gpu})"
        more = "--gpu-mem-gb for a GPU with more memory"
    tp = f" per GPU at --tp {run.tp}" if run.tp > 1 else ""
    for name, v in given:
        if v <= most:
            continue
        flag = option_name(name)
        if slora:
            what = f"after {profile.model.name}'s weights, for S-LoRA's unified pool"
            fewer = ""
        else:
            what = (f"after {profile.model.name}'s weights and {slots} adapter slots of rank {max_rank}, for vLLM's "
                    f"KV cache" if slots else f"after {profile.model.name}'s weights, for vLLM's KV cache")
            fewer = ", fewer --slots or a lower --max-lora-rank" if slots and max_rank else ""
        raise ConfigError(f"{flag} {v}: more than the {most} tokens {memory} can hold{tp} ({what}, even at "
                          f"--gpu-memory-utilization 1.0); the {'pool' if slora else 'cache'} could not be allocated: "
                          f"give {flag} {most} or less, or {more}{fewer}")


class KVCapacityError(ConfigError):
    """A KV cache too small for one ``max_model_len`` request: a memory problem (vLLM would not start)."""


def check_server(run: RunConfig, cfg: EngineConfig, workload: Workload, profile: Profile) -> None:
    """vLLM's start-up checks with the flags to change: KV for one ``max_model_len`` request,
    CPU slots, ranks and lengths the server accepts."""
    if cfg.max_cpu_loras is not None and cfg.max_cpu_loras < cfg.max_loras:
        raise ConfigError(f"--cpu-slots {cfg.max_cpu_loras} is below the {cfg.max_loras} GPU adapter slots (vLLM "
                          f"requires max_cpu_loras >= max_loras); raise --cpu-slots or lower --slots")
    cfg.validate()
    df = workload.df
    ranks = df.loc[df["adapter_id"] >= 0, "adapter_rank"]
    top_rank = int(ranks.max()) if len(ranks) else 0
    limit, why = rank_limit(resolve_system(run.policy, run.system), profile.model)
    if top_rank > limit:
        raise ConfigError(f"the workload's largest adapter rank {top_rank} is above {limit}, {why}; give ranks of at "
                          f"most {limit} (--ranks, --trace-opt ranks=..., or the trace file's adapter_rank)")
    if cfg.max_lora_rank is not None and top_rank > cfg.max_lora_rank:
        raise ConfigError(f"--max-lora-rank {cfg.max_lora_rank} is below the workload's largest adapter rank "
                          f"{top_rank}: vLLM would reject every request of those adapters; raise --max-lora-rank to "
                          f"{top_rank} or give smaller --ranks")
    max_len = cfg.max_model_len or profile.model.max_model_len
    slots = cfg.max_loras if cfg.enable_lora else 0
    max_rank = (cfg.max_lora_rank or top_rank) if slots else 0
    kv = cfg.kv_capacity_tokens or profile.kv_capacity_tokens(slots, max_rank)
    if resolve_system(run.policy, run.system) == "slora":
        # S-LoRA starts with any pool and refuses, per request, one longer than the pool or its limits
        # (``slora.md`` §1; twin/slora_engine.py ``_apply_rejection_rules``): refuse only a set-up where
        # every request of the workload would be refused
        pool = slora_pool_tokens(cfg, profile)
        tot = (df["prompt_tokens"] + df["output_tokens"]).to_numpy()
        lim = min(run.slora_max_total_len, pool - 1) if pool else run.slora_max_total_len
        if len(tot) and tot.min() > lim:
            why = (f"the pool of {pool} tokens" if pool and pool - 1 < run.slora_max_total_len
                   else f"--slora-max-total-len {run.slora_max_total_len}")
            raise ConfigError(f"every request of the workload is longer than {why} (the shortest has "
                              f"{int(tot.min())} tokens): S-LoRA would refuse them all; raise it")
        prompts = df["prompt_tokens"].to_numpy()
        # its HTTP server's prompt limit, and a prompt is prefilled whole in one mini-batch (batch_max_tokens)
        batch = batch_max_tokens(cfg, pool)
        for limit, flag in ((run.slora_max_prompt_len, "--slora-max-prompt-len"),
                            (batch, "--slora-batch-max-tokens")):
            if limit is not None and len(prompts) and prompts.min() > limit:
                what = f"{flag} {limit}" if flag != "--slora-batch-max-tokens" or run.slora_batch_max_tokens else \
                    f"S-LoRA's batch_max_tokens {limit} (max(pool / 6, the max request length) of its {pool}-token pool)"
                raise ConfigError(f"every prompt of the workload is longer than {what} (the shortest has "
                                  f"{int(prompts.min())} tokens): S-LoRA would refuse them all; raise {flag}")
        return
    if run.kv_tokens is not None and kv < max_len:  # the size given is the problem, not the memory
        lower = f", or lower --max-model-len (at most {kv})" if kv >= 16 * cfg.block_size else ""
        raise ConfigError(f"--kv-tokens {kv}: too small; vLLM needs a KV cache that holds at least one "
                          f"--max-model-len request ({max_len} tokens) and would refuse to start: give --kv-tokens "
                          f"{max_len} or more{lower}")
    # the weights alone (no adapter slots) leave too little: fewer slots or a lower rank cannot help (a cache the
    # profile sizes; --kv-tokens and --gpu-mem-gb give their own messages)
    bare = profile.kv_capacity_tokens(0, 0) if not cfg.kv_capacity_tokens else max_len
    if kv < max_len and bare < max_len:
        more = "use a GPU with more memory"
        raise KVCapacityError(f"the KV cache holds {max(kv, 0)} tokens: {profile.model.name}'s weights alone leave "
                              f"{max(bare, 0)} tokens even without adapter slots ({profile.name}), less than one "
                              f"--max-model-len {max_len} request; vLLM would refuse to start: {more}"
                              + (f", or lower --max-model-len (at most {bare})" if bare >= 16 * cfg.block_size
                                 else ""))
    if kv < max_len and kv < 16 * cfg.block_size:
        raise KVCapacityError(f"the KV cache holds {max(kv, 0)} tokens: {profile.model.name}'s weights and {slots} "
                              f"adapter slots of rank {max_rank} leave no room for it ({profile.name}); vLLM would "
                              f"refuse to start: lower --slots or --max-lora-rank (or the --ranks), or set --kv-tokens")
    if kv < max_len:
        how = ("lower --max-model-len (at most " + str(kv) + ")" +
               (", lower --slots or --max-lora-rank" if slots and max_rank else "") +
               (", give a larger --gpu-mem-gb" if run.gpu_mem_gb is not None else ", or set --kv-tokens"))
        raise KVCapacityError(f"the KV cache holds {kv} tokens, less than one --max-model-len {max_len} request "
                              f"({profile.model.name}, {slots} adapter slots of rank {max_rank}); vLLM would refuse "
                              f"to start: {how}")
    total = (df["prompt_tokens"] + df["output_tokens"]).to_numpy()
    if len(total) and total.min() > max_len:
        raise ConfigError(f"every request of the workload is longer than --max-model-len {max_len} (the shortest "
                          f"has {int(total.min())} tokens): vLLM would reject them all; raise --max-model-len")


# --------------------------------------------------------------------------- scenario files
#: keys of a resolved scenario that record facts rather than options (checked when replayed)
RECORDED = ("profile_sha256", "trace_sha256", "scheduler_params", "cache_params")
#: keys of a run's summary.json (its metrics) that no scenario option has: a file with one of them is a summary
SUMMARY_MARKERS = frozenset({"requests_arrived", "requests_finished", "throughput_rps", "simulated_s", "ttft_ms_mean"})


class ScenarioFileError(ConfigError):
    """A scenario file that cannot be read (named in the message)."""


def profile_sha256(profile: Profile) -> str:
    """SHA-256 of the profile's content (its JSON with sorted keys)."""
    return hashlib.sha256(json.dumps(profile.raw, sort_keys=True, default=str).encode()).hexdigest()


def trace_sha256(trace: str) -> str | None:
    """SHA-256 of a workload file's bytes (``--trace PATH``); None for a built-in trace (a name) or a path that is
    not a file."""
    if trace in BUILTINS:
        return None
    path = Path(trace)
    if not path.is_file():
        return None
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _plain(x: Any) -> Any:
    """JSON-compatible copy (tuples as lists, numpy scalars as numbers)."""
    return json.loads(json.dumps(x, default=lambda o: o.item() if hasattr(o, "item") else str(o)))


def policy_params(run: RunConfig) -> dict[str, Any]:
    """``scheduler_params`` and ``cache_params``: ``get_params()`` of the policy the scenario builds."""
    s, c, _ = resolve_policy(run.policy, run.scheduler, run.cache, dict(run.scheduler_options),
                             dict(run.cache_options))
    return {"scheduler_params": _plain(s.get_params()), "cache_params": _plain(c.get_params())}


def profile_reference(run: RunConfig, profile: Profile) -> str:
    """The name (or path) that loads ``profile`` again: the default resolved to its name."""
    if run.profile not in (None, "", "default"):
        return run.profile
    return profile.name if profile.name in available_profiles() else "embedded"


#: generation settings of a synthetic preset pinned into a resolved scenario (option -> (section, field))
_PINNED_OPTIONS = {"lengths": ("lengths", "dist"), "length_scale": ("lengths", "scale"),
                   "mean_in": ("lengths", "mean_in"), "mean_out": ("lengths", "mean_out"),
                   "max_total": ("lengths", "max_total"), "max_prompt": ("lengths", "max_prompt"),
                   "max_output": ("lengths", "max_output")}


def _pin_synthetic(d: dict[str, Any], workload: Workload) -> None:
    """Write a synthetic preset's own settings (rate, duration, adapters, ranks, popularity,
    length model) into the scenario, so a later change of the preset's defaults does not change
    a replay."""
    c = workload.meta.get("config") if workload.meta.get("kind") == "synthetic" else None
    if not isinstance(c, dict):
        return
    a, ad = c.get("arrivals", {}), c.get("adapters", {})
    if a.get("n_requests") is None and d["duration"] is None:
        d["duration"] = a.get("duration_s")
    if a.get("process") in ("poisson", "gamma", "onoff") and d["rps"] is None:
        d["rps"] = a.get("rps")
    for key, value in (("adapters", ad.get("n_adapters")), ("ranks", ad.get("ranks")),
                       ("popularity", ad.get("popularity"))):
        if d[key] is None:
            d[key] = value
    opts = d["trace_options"]
    for key, (section, name) in _PINNED_OPTIONS.items():
        value = c.get(section, {}).get(name)
        if key not in opts and value is not None:
            opts[key] = value


def resolved_scenario(run: RunConfig, profile: Profile, cfg: EngineConfig | None = None,
                      workload: Workload | None = None) -> dict[str, Any]:
    """Every :class:`RunConfig` field (the policy, profile and slot defaults resolved, and a
    synthetic preset's own rate, duration, adapters and length model), the profile's content
    hash and the policy's parameters."""
    d = dataclasses.asdict(run)
    d["trace_options"] = {k: v for k, v in run.trace_options}
    d["scheduler_options"] = {k: v for k, v in run.scheduler_options}
    d["cache_options"] = {k: v for k, v in run.cache_options}
    if workload is not None and run.trace in BUILTINS:  # (a saved workload file is replayed as it is)
        _pin_synthetic(d, workload)
    d["policy"] = run.policy or "vllm"
    d["profile"] = profile_reference(run, profile)
    for key in PATH_OPTIONS:  # (a replay from another directory finds the files)
        d[key] = absolute_path(key, d[key])
    if "lengths" in d["trace_options"]:  # (a length model's source file, likewise)
        d["trace_options"]["lengths"] = _map_length_source(d["trace_options"]["lengths"],
                                                           lambda a: absolute_path("trace", a))
    if cfg is not None:
        d["slots"] = cfg.max_loras
    d = _plain(d)
    d["profile_sha256"] = profile_sha256(profile)
    if (digest := trace_sha256(run.trace)) is not None:  # (a replay of an edited workload file is said to differ)
        d["trace_sha256"] = digest
    d.update(policy_params(run))
    return d


#: YAML 1.2's core-schema numbers (PyYAML reads YAML 1.1: ``010`` as octal 8, ``1:00`` as 60 in base 60, and
#: ``1e0`` as text): decimal, ``0o`` octal and ``0x`` hexadecimal integers, and floats with or without a dot
_YAML12_INT = re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$")
_YAML12_FLOAT = re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)"
                           r"|\.(?:nan|NaN|NAN))$")
_YAML_INT_TAG, _YAML_FLOAT_TAG = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"


def _yaml12_int(loader: Any, node: Any) -> int:
    v = loader.construct_scalar(node)
    sign, digits = (-1, v[1:]) if v[0] == "-" else (1, v.lstrip("+"))
    base = 8 if digits.startswith("0o") else 16 if digits.startswith("0x") else 10
    return sign * int(digits[2:] if base != 10 else digits, base)


def _yaml12_float(loader: Any, node: Any) -> float:
    v = loader.construct_scalar(node).lower().replace(".inf", "inf").replace(".nan", "nan")
    return float(v)


def _unique_keys_yaml_loader(yaml: Any) -> Any:
    """PyYAML's safe loader, refusing a repeated key in a mapping (PyYAML keeps the last), reading numbers
    as YAML 1.2 does (TOML and JSON read them alike: ``slots: 010`` is 10, ``rps: 1e0`` is 1.0, and
    ``1:00`` is text, refused where a number belongs)."""
    class Loader(yaml.SafeLoader):
        yaml_implicit_resolvers = {
            first: [(tag, rx) for tag, rx in resolvers if tag not in (_YAML_INT_TAG, _YAML_FLOAT_TAG)]
            for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}

        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            seen = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # (<<: *anchor: its keys may be overridden)
                    continue
                key = self.construct_object(key_node, deep=deep)
                try:
                    repeated = key in seen
                    seen.add(key)
                except TypeError:  # an unhashable key: the base class refuses it
                    break
                if repeated:
                    raise RepeatedKey(key, f" (line {key_node.start_mark.line + 1})")
            return super().construct_mapping(node, deep=deep)

    Loader.add_implicit_resolver(_YAML_INT_TAG, _YAML12_INT, list("-+0123456789"))
    Loader.add_implicit_resolver(_YAML_FLOAT_TAG, _YAML12_FLOAT, list("-+.0123456789"))
    Loader.add_constructor(_YAML_INT_TAG, _yaml12_int)
    Loader.add_constructor(_YAML_FLOAT_TAG, _yaml12_float)
    return Loader


def read_mapping_file(path: Path, label: str = "--config", what: str = "scenario",
                      yaml_extra: str = "yaml", example: str = "`twin run --dump-config` prints one",
                      also: str = " (a run's summary.json works too)",
                      error: type[ConfigError] = ScenarioFileError) -> dict[str, Any]:
    """The table of options in a TOML, YAML or JSON file (by its extension), or ``error`` naming
    ``label`` and the file and saying what to give instead: a missing, unreadable, empty, binary or
    malformed file, YAML without PyYAML (the ``yaml_extra`` extra), or a document that is not a table."""
    suffix = path.suffix.lower()
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise error(f"{label} {path}: file not found") from None
    except OSError as e:
        raise error(f"{label} {path}: cannot read it ({e.strerror or e})") from None
    if not raw.strip():
        raise error(f"{label} {path}: the file is empty; give a {what} ({example})")
    try:
        text = raw.decode("utf-8-sig")  # (a byte-order mark, as some editors write, is no key)
    except UnicodeDecodeError:
        raise error(f"{label} {path}: not a text file (not UTF-8); give a TOML, YAML or JSON {what}") from None
    if suffix == ".toml":
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise error(f"{label} {path}: not valid TOML ({e})") from None
    elif suffix in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise error(f"{label} {path}: YAML {what}s need PyYAML (pip install 'lora-twin[{yaml_extra}]'); "
                        f"or write the {what} as TOML") from None
        try:
            data = yaml.load(text, Loader=_unique_keys_yaml_loader(yaml))
        except RepeatedKey as e:
            raise error(f"{label} {path}: key {e.key!r} is given twice{e.where}; give each option once (the "
                        f"second value would silently replace the first)") from None
        except yaml.YAMLError as e:
            raise error(f"{label} {path}: not valid YAML ({str(e).splitlines()[0]})") from None
    elif suffix == ".json":
        try:
            data = json.loads(text, object_pairs_hook=unique_keys_object)
        except RepeatedKey as e:
            raise error(f"{label} {path}: key {e.key!r} is given twice; give each option once (the second value "
                        f"would silently replace the first)") from None
        except (json.JSONDecodeError, RecursionError) as e:
            raise error(f"{label} {path}: not valid JSON ({e})") from None
    else:
        raise error(f"{label} {path}: unknown {what} format {suffix or '(no extension)'!r}; give a "
                    f".toml, .yaml/.yml or .json file{also}")
    if not isinstance(data, dict):
        raise error(f"{label} {path}: expected a table of options, got {type(data).__name__}")
    return data


#: scenario options whose value may be a file or directory path (``trace``, ``profile``: else a name)
PATH_OPTIONS = ("trace", "profile", "data_dir")


def _is_name(option: str, value: str) -> bool:
    """``value`` is a built-in name of ``option`` (a trace or a shipped profile), not a path."""
    return (option == "trace" and value in BUILTINS) or (option == "profile" and value in available_profiles())


def _relative_path(option: str, value: Any) -> Path | None:
    """``value`` of a path option as a relative path; None for a name, an absolute path or a non-string."""
    if not isinstance(value, str) or not value or _is_name(option, value):
        return None
    p = Path(value).expanduser()
    return None if p.is_absolute() else p


def rebase_path(option: str, value: Any, base: Path) -> Any:
    """A path option's ``value`` read from a file in directory ``base``: a relative path that names
    something there is taken there (a scenario or grid file is read the same from any directory).
    Names, absolute paths, relative paths found only from the current directory (summaries of older
    versions, which recorded paths as given) and paths the current directory reads the same (a grid
    file run from its own directory keeps its digest) are left as they are."""
    p = _relative_path(option, value)
    if p is None or not (base / p).exists() or (p.exists() and p.resolve() == (base / p).resolve()):
        return value
    return str((base / p).resolve())


def _map_length_source(value: Any, fn: Callable[[Any], Any]) -> Any:
    """The ``lengths`` trace option ``value`` with its source (``empirical:SRC``, ``lognormal:SRC``)
    passed through ``fn`` as a ``trace`` value; other values as they are."""
    if not isinstance(value, str):
        return value
    kind, sep, arg = value.partition(":")
    if not sep or kind.strip().lower() not in LENGTH_SOURCE_MODELS:
        return value
    new = fn(arg)
    return value if new == arg else f"{kind}:{new}"


def rebase_trace_options(options: list[tuple[str, Any]], base: Path) -> list[tuple[str, Any]]:
    """``trace_options`` read from a file in directory ``base``: a ``lengths`` source file
    (``empirical:PATH``, ``lognormal:PATH``) is read relative to the file, as :func:`rebase_path`
    reads ``trace``."""
    return [(k, _map_length_source(v, lambda a: rebase_path("trace", a, base)) if k == "lengths" else v)
            for k, v in options]


def absolute_path(option: str, value: Any) -> Any:
    """A path option's ``value`` as recorded in a resolved scenario: an existing relative path made
    absolute, so that ``twin run --config RUN/summary.json`` replays the run from any directory."""
    p = _relative_path(option, value)
    return str(p.resolve()) if p is not None and p.exists() else value


def load_scenario_file(path: str | Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(options, recorded)`` of a scenario file: TOML, YAML or JSON; a run's ``summary.json``
    gives its ``scenario``. Options are checked as :class:`RunConfig` values; unknown keys are
    refused, listing the known ones. Relative paths (:data:`PATH_OPTIONS`) are read relative to the
    file's directory (:func:`rebase_path`)."""
    path = Path(path)
    data = read_mapping_file(path)
    if SUMMARY_MARKERS & set(data):  # a run's summary.json: its options are its scenario table
        if not isinstance(data.get("scenario"), dict):
            got = "no 'scenario' key" if "scenario" not in data else \
                f"a {type(data['scenario']).__name__} under 'scenario'"
            raise ScenarioFileError(f"--config {path}: a run's summary (metrics such as "
                                    f"{sorted(SUMMARY_MARKERS & set(data))[0]}) with {got} instead of the table of "
                                    f"the run's options (a summary of an older twin, or an edited one), so the run "
                                    f"cannot be replayed from it; give a scenario file (`twin run ... --dump-config` "
                                    f"writes one) or a summary.json of this version")
        data = data["scenario"]
    options: dict[str, Any] = {}
    recorded: dict[str, Any] = {}
    unknown = []
    spelt: dict[str, str] = {}
    for key, value in data.items():
        name = str(key).replace("-", "_")
        if name in spelt:  # (max-num-seqs and max_num_seqs: the last one won silently)
            raise ScenarioFileError(f"--config {path}: option {name} is given twice, as {spelt[name]!r} and "
                                    f"{str(key)!r}; keep one")
        spelt[name] = str(key)
        if name in RUN_FIELDS:
            try:
                options[name] = _check_type(name, value)
            except ConfigError as e:
                raise ScenarioFileError(f"--config {path}: {name}: {e}") from None
            if name in PATH_OPTIONS:
                options[name] = rebase_path(name, options[name], path.parent)
            elif name == "trace_options":
                options[name] = rebase_trace_options(options[name], path.parent)
        elif name in RECORDED:
            if name.endswith("_sha256") and not (isinstance(value, str) and re.fullmatch(r"[0-9a-f]{64}", value)):
                raise ScenarioFileError(f"--config {path}: {name} = {value!r} is not a SHA-256 digest (64 hexadecimal "
                                        f"digits, as the twin records it); remove the line (it is a fact the twin "
                                        f"writes, not an option)")
            recorded[name] = value
        else:
            unknown.append(str(key))
    if unknown:
        raise ScenarioFileError(f"--config {path}: unknown option(s) {', '.join(unknown)}; a scenario takes "
                                f"{', '.join(RUN_FIELDS)}")
    return options, recorded


def replay_warnings(recorded: dict[str, Any], scenario: dict[str, Any]) -> list[str]:
    """Differences between a replayed file's recorded facts and the scenario as built now."""
    out = []
    if "trace_sha256" in recorded and "trace_sha256" not in scenario:  # (no workload file: nothing to compare with)
        out.append(f"the scenario file records a workload file's content (trace_sha256) but replays no file (trace "
                   f"{scenario.get('trace')!r}); the line is not read: remove it")
    for key in RECORDED:
        if key == "trace_sha256" and "trace_sha256" not in scenario:
            continue
        if key in recorded and _strip_none(recorded[key]) != _strip_none(scenario.get(key)):
            what = {"profile_sha256": "the profile's content",
                    "trace_sha256": "the workload file's content"}.get(key, key.replace("_", " "))
            why = ("" if key in ("profile_sha256", "trace_sha256") else
                   f" ([{key}] records the settings the preset gave its policy; it is not read as an option, so an edit "
                   f"of it changes nothing: the preset, --policy / --scheduler / --cache, sets them)")
            out.append(f"{what} differ(s) from the scenario file's; the results may differ from the recorded run{why}")
    return out


def _strip_none(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _strip_none(v) for k, v in x.items() if v is not None}
    if isinstance(x, (list, tuple)):
        return [_strip_none(v) for v in x]
    return x


# --------------------------------------------------------------------------- TOML
def _toml_key(k: Any) -> str:
    k = str(k)
    return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else json.dumps(k, ensure_ascii=False)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v) if math.isfinite(v) else ("nan" if v != v else ("inf" if v > 0 else "-inf"))
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v if x is not None) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_toml_key(k)} = {_toml_value(x)}" for k, x in v.items() if x is not None) + "}"
    return json.dumps(str(v))


def to_toml(scenario: dict[str, Any]) -> str:
    """The scenario as TOML: options first (unset ones as comments, with their help), then the
    tables (``trace_options``, the policy's parameters)."""
    lines = ["# LoRA Twin scenario: `twin run --config THIS_FILE` (command-line flags override it)"]
    tables = []
    for key, value in scenario.items():
        if isinstance(value, dict):
            tables.append((key, value))
            continue
        if value is None:
            help_text = RUN_FIELDS[key].metadata.get("help", "") if key in RUN_FIELDS else ""
            lines.append(f"# {key} =  (unset: {help_text})")
        else:
            lines.append(f"{key} = {_toml_value(value)}")
    for key, table in tables:
        lines += ["", f"[{key}]"]
        for k, v in table.items():
            if v is None:
                lines.append(f"# {k} =  (None)")
            else:
                lines.append(f"{_toml_key(k)} = {_toml_value(v)}")
    return "\n".join(lines) + "\n"
