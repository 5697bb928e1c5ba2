"""The run scenario: workload, policy, server and SLO options of ``twin run`` and ``twin compare``.

:class:`RunConfig` declares every option once, with its default and help text on the field;
the commands derive their flags from it (:func:`traces.flags.add_arguments`), so ``twin run``
and ``twin compare`` share names, defaults and meaning. :func:`build_workload` and
:func:`build_engine_config` turn a scenario into the workload and the :class:`EngineConfig`
a simulation takes.
"""

from __future__ import annotations

import ast
import dataclasses
from dataclasses import dataclass, field
from typing import Any

from traces.arguments import parse_list
from traces.registry import get_workload, run_defaults
from traces.workload import Workload
from twin.config import EngineConfig
from twin.perf.profile import Profile, kv_tokens_for_memory

#: GPU adapter slots when none are given, capped at the number of adapters. With max rank
#: 128, 32 slots would leave Llama-3.1-8B on an H100 less KV than one 131,072-token request,
#: and vLLM would refuse to start.
DEFAULT_ADAPTER_SLOTS = 16


def parse_ranks(text: str) -> list[int]:
    """Adapter ranks such as ``8,16,32`` or ``8-16-32``."""
    return parse_list(text, int, "--ranks", minimum=1)


def parse_workload_option(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` -> ``(KEY, VALUE)``; the value is a Python literal when it reads as one, else the text."""
    if "=" not in text:
        raise ValueError(f"--trace-opt takes KEY=VALUE, got {text!r}")
    key, value = text.split("=", 1)
    try:
        return key.strip(), ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return key.strip(), value


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
    trace: str = field(default="synthetic", metadata={"help": "trace name (`twin traces list`) or a file path"})
    rps: float | None = field(default=None, metadata={"help": "target mean request rate (rescales a trace)"})
    duration: float | None = field(default=None, metadata={"help": "seconds of arrivals to keep/generate"})
    adapters: int | None = field(default=None, metadata={"help": "number of adapters"})
    ranks: list[int] | None = field(default=None, metadata={
        "help": "adapter ranks, e.g. 8,16,32,64,128", "parse": parse_ranks})
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
    # server
    profile: str | None = field(default=None, metadata={
        "help": "profile name (`twin calibrate list`) or JSON file"})
    slots: int | None = field(default=None, metadata={
        "help": f"GPU adapter slots (max_loras; default {DEFAULT_ADAPTER_SLOTS}, at most the number of adapters)"})
    cpu_slots: int | None = _engine_field("max_cpu_loras", "--cpu-slots")
    max_lora_rank: int | None = _engine_field("max_lora_rank")
    max_num_seqs: int = _engine_field("max_num_seqs")
    max_batched_tokens: int = _engine_field("max_num_batched_tokens", "--max-batched-tokens")
    gpu_mem_gb: float | None = field(default=None, metadata={
        "help": "GPU memory; the KV capacity follows from it (default: the profile's GPU)"})
    kv_tokens: int | None = _engine_field("kv_capacity_tokens", help="override the KV capacity (tokens)")
    tp: int = _engine_field("tensor_parallel")
    # run
    horizon: float | None = field(default=None, metadata={
        "help": "stop the simulation at this time; requests in flight count as unfinished"})
    ttft_slo: float | None = field(default=None, metadata={"help": "TTFT SLO in seconds (SLO attainment)"})
    tbt_slo: float | None = field(default=None, metadata={"help": "time-between-tokens SLO in seconds"})

    def adapter_slots(self, n_adapters: int) -> int:
        """``slots``, or :data:`DEFAULT_ADAPTER_SLOTS` capped at ``n_adapters`` (at least 1)."""
        if self.slots is not None:
            return self.slots
        return max(1, min(n_adapters, DEFAULT_ADAPTER_SLOTS) if n_adapters else 1)


def with_trace_defaults(run: RunConfig) -> RunConfig:
    """``run`` with its trace's scenario defaults (:func:`traces.registry.run_defaults`, e.g. the
    rate, window and ranks ``splitwise`` is replayed with) in the options left unset."""
    unset = {k: v for k, v in run_defaults(run.trace).items() if getattr(run, k) is None}
    return dataclasses.replace(run, **unset) if unset else run


def build_workload(run: RunConfig) -> Workload:
    """The workload of a scenario (:func:`traces.registry.get_workload`), the trace's scenario
    defaults applied (:func:`with_trace_defaults`)."""
    run = with_trace_defaults(run)
    return get_workload(run.trace, data_dir=run.data_dir, rps=run.rps, duration=run.duration, adapters=run.adapters,
                        ranks=run.ranks, popularity=run.popularity, seed=run.seed, **dict(run.trace_options))


def build_engine_config(run: RunConfig, workload: Workload, profile: Profile) -> EngineConfig:
    """The server settings of a scenario; with ``gpu_mem_gb`` (and no ``kv_tokens``) the KV
    capacity follows from the GPU memory (:func:`twin.perf.profile.kv_tokens_for_memory`)."""
    n_adapters = int(workload.df["adapter_id"].max() + 1) if len(workload.df) else 0
    slots = run.adapter_slots(n_adapters)
    cfg = EngineConfig(max_num_batched_tokens=run.max_batched_tokens, max_num_seqs=run.max_num_seqs,
                       max_loras=slots, max_cpu_loras=run.cpu_slots, max_lora_rank=run.max_lora_rank,
                       kv_capacity_tokens=run.kv_tokens, tensor_parallel=run.tp)
    if run.gpu_mem_gb is not None and run.kv_tokens is None:
        max_rank = run.max_lora_rank or int(workload.df["adapter_rank"].max() or 0)
        cfg.kv_capacity_tokens = kv_tokens_for_memory(profile, run.gpu_mem_gb, slots, max_rank)
    return cfg
