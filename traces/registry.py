"""Named traces: ``get_workload("splitwise")``, ``twin run --trace NAME``.

A name is either a *synthetic* preset (no file needed) or a *real* trace file in the data
directory (``traces.datadir.data_dir()``); anything else is taken as a path -- a saved workload
``.parquet`` or a raw trace in one of the formats of :mod:`traces.loaders` (sniffed).

Real traces carry no adapters, so adapters are assigned by the synthesis options (default:
100 adapters, ranks 8..128 with N/5 each, ``powerlaw`` popularity; a conversation keeps one
adapter), or mapped from the trace's key column with ``adapters_from="key"`` (the n
most-invoked Azure Functions / most-used models over the whole trace become n adapters; the
default for ``azure-functions``; the requests of the other keys have no adapter and are dropped
before any re-timing, rescaling or window, so ``rps`` holds for what is run, and the count is in
``meta["transform"]["dropped_by_adapters_from_key"]``). ``rps`` rescales a replayed trace to
that mean rate keeping its shape; ``duration`` keeps the first ``duration`` seconds (after
rescaling; ``window_start`` moves the window). Datasets without timestamps (ShareGPT, LMSYS) get
conversation starts from the arrival options (default Poisson, 4 req/s, 300 s) and later turns
from the think-time model. A trace that has timestamps is re-timed only when asked
(``arrival=poisson|gamma``): its arrivals are then drawn from 0 s for ``duration`` seconds at
``rps`` (default 4 req/s, 300 s), and each arrival takes a request (a conversation, for a
conversation dataset) of the trace in a seeded random order without replacement, or with
replacement when the window needs more than the trace has (``reused_requests`` /
``reused_conversations`` in ``meta["transform"]["arrivals"]``). A trace whose timestamps are only
partly missing (an Arena or WildChat conversation without its start time) is refused naming the
rows, as the loaders refuse a missing timestamp (:func:`traces.loaders.base.seconds_from_timestamps`):
its recorded times are not silently replaced.

Every workload's ``meta`` holds ``source``, ``seed`` and ``options``; :func:`regenerate`
rebuilds it from them.

A path with a workload extension (``.csv``, ``.jsonl``, ``.parquet``) whose columns are the
workload's (:mod:`traces.workload`) is read as a workload; other files are sniffed as raw
traces. Empty, header-only or unreadable files are refused naming the file. Workloads too large
to generate are refused before anything is drawn: the expected request count (rate x duration,
or ``n_requests``, times the mean turns where ``n_requests`` counts conversations) must stay
within :data:`MAX_REQUESTS`.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Collection

import numpy as np
import pandas as pd

from traces.adapters import assign_adapters, assign_ranks, map_keys_to_adapters
from traces.arguments import did_you_mean, parse_bool
from traces.arrivals import rescale_to_rps, time_window
from traces.conversations import ConversationConfig, exclusive_group_cumsum, fill_turn_arrivals
from traces.fetch import SOURCES, fetch_command
from traces.lengths import LengthConfig, build_length_model, load_fitted, sample_lengths, scale_lengths
from traces.loaders import CONVERSATION_FORMATS, LOADERS, UNTIMED_FORMATS, TraceTable, detect_format
from traces.loaders.tokens import tokenizer_problem
from traces.synth import (DEFAULT_RATES, ArrivalConfig, AdapterConfig, OPTIONS, SynthConfig, align_warmup,
                          apply_options, check_options_apply, generate_arrivals, synthesize, validate_config,
                          whole_number)
from traces.workload import FILE_SUFFIXES, Workload, WorkloadError
from traces.datadir import data_dir as _data_dir

#: Most requests a generated workload may have (about 0.7 GB of workload table, and the engine's
#: per-request arrays on top): larger ones are refused before anything is drawn.
MAX_REQUESTS = 5_000_000


class OptionError(TypeError, ValueError):
    """An unknown or misapplied workload option (a ``TypeError`` as before, and a ``ValueError``
    so that commands report it as bad input)."""

#: options for real traces beyond the synthesis options
REAL_OPTIONS: dict[str, str] = {
    "window_start": "start of the time window (s, after rescaling)",
    "adapters_from": "synthetic (draw by popularity) | key (map the n most frequent functions/models to n adapters; "
                     "the requests of other keys are dropped, before --rps and --duration, and counted in the meta)",
    "tokenizer": "text -> tokens for conversation datasets: auto | approx | hf:NAME | tiktoken:NAME",
    "turns": "conversation datasets: all (multi-turn with prefixes) | first",
    "side": "chatbot-arena: a | b | both",
    "max_conversations": "read at most this many conversations",
    "days": "azure-functions: number of day files to read",
    "start_min": "azure-functions: first minute", "end_min": "azure-functions: end minute",
    "keep_failed": "burstgpt: keep failed requests (0 response tokens)",
    "log_type": "burstgpt: only 'Conversation log' or 'API log' rows",
}
_LOADER_KWARGS = {"tokenizer", "turns", "side", "max_conversations", "days", "start_min", "end_min",
                  "keep_failed", "log_type"}


@dataclass(frozen=True)
class TraceSpec:
    """A built-in trace name."""

    name: str
    kind: str                        # "real" | "synthetic"
    description: str
    file: str | None = None          # path inside the data directory (real traces)
    fmt: str | None = None           # loader format (real traces)
    defaults: dict[str, Any] = field(default_factory=dict)  # option defaults of this name
    #: scenario options ``twin run`` and ``twin compare`` use for this name when not given
    #: (``rps``, ``duration``, ``ranks``: a set-up sized for one GPU; :func:`run_defaults`)
    run_defaults: dict[str, Any] = field(default_factory=dict)

    @property
    def fetch(self) -> str | None:
        return self.name if self.name in SOURCES else None


def _real(name: str, fmt: str, desc: str, run_defaults: dict[str, Any] | None = None, **defaults: Any) -> TraceSpec:
    return TraceSpec(name, "real", desc, SOURCES[name].dest, fmt, defaults, dict(run_defaults or {}))


def run_defaults(name_or_path: str) -> dict[str, Any]:
    """The scenario defaults of a built-in name for ``twin run``/``twin compare`` (empty for
    paths and for names without any)."""
    spec = BUILTINS.get(name_or_path)
    return copy.deepcopy(spec.run_defaults) if spec is not None else {}


def _synth(name: str, desc: str, **defaults: Any) -> TraceSpec:
    return TraceSpec(name, "synthetic", desc, None, None, defaults)


#: The embedded default scenario (``twin run``). Moderate by measurement (README "Defaults"): vllm
#: on 16 slots sustains 1.52 req/s with P99 TTFT within 5x the unloaded mean
#: (``twin compare --policies vllm --rps 0.5,0.75,1,1.25,1.5,1.75,2,2.5``), so 1 req/s is about
#: two thirds of it. Ranks 8/16/32 are those the default profile's adapter loads and KV
#: reservation were measured at (its LoRA step cost at rank 8; 16 and 32 through the kernels'
#: block counts).
SYNTHETIC_DEFAULTS: dict[str, Any] = {"rps": 1.0, "ranks": [8, 16, 32]}
#: The scenario of the headline ``twin run --trace splitwise --policy chameleon`` (a set-up sized
#: for one GPU, :attr:`TraceSpec.run_defaults`): the trace's own 5.4 req/s is beyond what one H100
#: serves (about 4 req/s with chameleon at ranks 8..128, mean TTFT 869 s); chameleon sustains
#: 3.35 req/s on the first 600 s at ranks 8/16/32 (``twin compare --trace splitwise --policies
#: chameleon,vllm --rps 1,2,3,4,5``), so 2.2 req/s is about two thirds of it.
#: ``--rps``/``--duration``/``--ranks`` replace these; ``get_workload("splitwise")`` and
#: ``twin traces show splitwise`` give the trace as recorded.
SPLITWISE_RUN_DEFAULTS: dict[str, Any] = {"rps": 2.2, "duration": 600.0, "ranks": [8, 16, 32]}

#: FastLibra's three workloads (Zhang et al., 2025, §6), synthesised: LMSYS-33k, OPUS-100,
#: Taskmaster and the Azure Functions trace (MAFT) are not in the data directory (with the
#: 2019 Azure Functions files at hand, ``--trace azure-functions`` maps its top-n functions to n
#: adapters, :mod:`traces.loaders.azure_functions`). Common: 50 LoRAs (the paper's 20/50/100 with
#: ``--adapters``), ranks 32 and 64 (the paper draws each at random from {32, 64}; here the two
#: alternate over adapter ids and popularity is a seeded permutation independent of rank),
#: 600 s. Where a number is published we use it; otherwise it is an estimate, said so:
#:
#: * chatbot -- LMSYS-Chat-1M's published statistics (Zheng et al., ICLR 2024, Table 1): 2.0
#:   turns per conversation, 69.5 tokens per user prompt, 214.5 per response; per-turn lengths
#:   drawn with ShareGPT's shape matched to those means; every turn resends the history
#:   (:mod:`traces.conversations`); think time between turns 30 s (the twin's default: LMSYS's
#:   timestamps are not here); Poisson conversation starts (the paper scales LMSYS's timestamps);
#:   adapter popularity Zipf(1) (LMSYS's per-model counts are skewed -- a few models take most
#:   conversations -- but the shares are not here); contexts capped at 4096 tokens (Llama-2's).
#: * translation -- one request per sentence pair, no history; lengths an estimate (an
#:   instruction of ~15 tokens plus a ~25-token OPUS sentence in, ~25 tokens out), drawn
#:   log-normally with the Splitwise-fitted spread.
#: * agent -- Taskmaster-1 dialogues have about 20 utterances of about 10 words (Byrne et al.,
#:   2019; approximate, not checked against the data here): mean 10 user/agent exchanges
#:   (geometric, at most 30) of ~15 tokens each way, the longest conversations of the three.
#: * MAFT stand-in (translation, agent) -- Azure Functions' per-function invocation counts span
#:   orders of magnitude and arrivals are bursty (Shahrad et al., ATC 2020); the top-n functions
#:   mapped to n LoRAs are drawn Zipf(1) over the adapters, the arrivals (conversation starts for
#:   the agent) a gamma renewal with CV 2. Not fitted to the trace.
#:
#: Default rates are moderate for ``fastlibra`` on the default profile (README "FastLibra").
FASTLIBRA_COMMON: dict[str, Any] = {"adapters": 50, "ranks": [32, 64], "duration": 600.0, "popularity": "zipf:1.0"}
FASTLIBRA_CHATBOT: dict[str, Any] = {**FASTLIBRA_COMMON, "rps": 2.0, "conversations": True, "mean_turns": 2.0,
                                     "lengths": "sharegpt", "mean_in": 69.5, "mean_out": 214.5, "max_total": 4096}
FASTLIBRA_TRANSLATION: dict[str, Any] = {**FASTLIBRA_COMMON, "rps": 4.0, "arrival": "gamma", "cv": 2.0,
                                         "lengths": "lognormal", "mean_in": 40.0, "mean_out": 25.0,
                                         "max_total": 4096}
FASTLIBRA_AGENT: dict[str, Any] = {**FASTLIBRA_COMMON, "rps": 2.0, "arrival": "gamma", "cv": 2.0,
                                   "conversations": True, "mean_turns": 10.0, "max_turns": 30, "lengths": "lognormal",
                                   "mean_in": 15.0, "mean_out": 15.0, "max_total": 4096}

BUILTINS: dict[str, TraceSpec] = {s.name: s for s in [
    _real("splitwise", "azure-llm", "Azure LLM inference 2023, conversation service (Splitwise; 19,366 req, 1 h); "
          "twin run/compare replay its first 600 s rescaled to a 2.2 req/s hourly mean, adapters of ranks 8/16/32, "
          "unless --duration/--rps/--ranks are given (README 'Defaults')", run_defaults=SPLITWISE_RUN_DEFAULTS),
    _real("splitwise-code", "azure-llm", "Azure LLM inference 2023, coding service (Splitwise; 8,819 req, 1 h)"),
    _real("splitwise-2024", "azure-llm", "Azure LLM inference 2024, conversation, one week"),
    _real("splitwise-code-2024", "azure-llm", "Azure LLM inference 2024, code, one week"),
    _real("azure-functions", "azure-functions-2019",
          "Azure Functions 2019 per-minute invocations (day 1); top-N functions -> N adapters, Splitwise lengths",
          adapters_from="key", lengths="splitwise"),
    _real("azure-functions-2021", "azure-functions-2021",
          "Azure Functions 2021 invocations; top-N functions -> N adapters, Splitwise lengths",
          adapters_from="key", lengths="splitwise"),
    _real("lmsys", "lmsys", "LMSYS-Chat-1M conversations (multi-turn lengths; Poisson starts)"),
    _real("chatbot-arena", "arena", "Chatbot Arena conversations with timestamps"),
    _real("sharegpt", "sharegpt", "ShareGPT V3 conversations (multi-turn lengths; Poisson starts)"),
    _real("wildchat", "wildchat", "WildChat(-1M) conversations with timestamps"),
    _real("burstgpt", "burstgpt", "BurstGPT ChatGPT/GPT-4 request log with timestamps"),
    _synth("synthetic", "embedded default: 100 adapters of ranks 8/16/32 (a third each), powerlaw popularity, "
           "Poisson 1 req/s (about two thirds of the rate vllm sustains on 16 slots of an H100 with Llama-3.1-8B; "
           "README 'Defaults'), 300 s, Splitwise-like lengths", **SYNTHETIC_DEFAULTS),
    _synth("splitwise-synth", "generator fitted on the Splitwise conv trace (rate profile, renewal CV, copula lengths)",
           arrival="fitted", fit="splitwise_conv_fit", rps=None, duration=3600.0, lengths="splitwise"),
    _synth("splitwise-code-synth", "generator fitted on the Splitwise code trace",
           arrival="fitted", fit="splitwise_code_fit", rps=None, duration=3600.0, lengths="splitwise-code"),
    _synth("sharegpt-synth", "Poisson 4 req/s, ShareGPT-like lengths matched to 222/196 (the real runs' pool means)",
           lengths="sharegpt", mean_in=222.0, mean_out=196.0),
    _synth("adapter-twin", "published adapter twin: per-adapter Poisson rates 0.1/0.05/0.025 round-robin, 96 adapters "
           "of ranks 8/16/32, ShareGPT-like 222/196, 3600 s",
           arrival="per-adapter", rates=[0.1, 0.05, 0.025], rps=None, adapters=96, ranks=[8, 16, 32],
           duration=3600.0, lengths="sharegpt", mean_in=222.0, mean_out=196.0),
    _synth("chameleon", "Chameleon: 100 adapters ranks 8-128 (N/5 each), U-P popularity, Poisson, Splitwise-like "
           "lengths scaled by 0.5", popularity="U-P", length_scale=0.5),
    _synth("fastlibra-chatbot", "FastLibra chatbot (LMSYS-like, synthesised): multi-turn, every turn resends the "
           "history; LMSYS-Chat-1M's published means (2.0 turns, 69.5 prompt / 214.5 response tokens per turn) on "
           "ShareGPT-shaped lengths; 50 LoRAs (--adapters 20|50|100) of ranks 32/64, Zipf popularity, Poisson starts",
           **FASTLIBRA_CHATBOT),
    _synth("fastlibra-translation", "FastLibra translation (synthesised): one turn per request, short sentence "
           "lengths (estimate: 40 prompt / 25 output tokens); Azure-Functions-like arrivals (Zipf over the top-n "
           "functions = n LoRAs, bursty gamma CV 2); 50 LoRAs (--adapters 20|50|100) of ranks 32/64",
           **FASTLIBRA_TRANSLATION),
    _synth("fastlibra-agent", "FastLibra personal agent (Taskmaster-like, synthesised): the longest conversations "
           "(mean 10 exchanges of ~15/15 tokens, estimate), every turn resends the history; Azure-Functions-like "
           "conversation starts; 50 LoRAs (--adapters 20|50|100) of ranks 32/64", **FASTLIBRA_AGENT),
    _synth("fastlibra-many-uniform", "FastLibra's many-adapter study set-up: 2000 adapters, uniform popularity; "
           "lengths ShareGPT-like (our choice, the study names none)", adapters=2000, popularity="uniform",
           lengths="sharegpt"),
    _synth("fastlibra-many-distinct", "FastLibra's many-adapter study set-up: 2000 adapters, round-robin; "
           "lengths ShareGPT-like (our choice)", adapters=2000, popularity="distinct", lengths="sharegpt"),
    _synth("fastlibra-many-skewed", "FastLibra's many-adapter study set-up: 2000 adapters, Skewed-0.1 (Gaussian "
           "popularity, std 0.1 N); lengths ShareGPT-like (our choice)", adapters=2000, popularity="skewed:0.1",
           lengths="sharegpt"),
    _synth("multiturn-synth", "multi-turn conversations (mean 3 turns, 30 s think time) with shared prefixes, "
           "ShareGPT-like lengths", conversations=True, lengths="sharegpt", max_total=8192),
]}


def list_traces(data_dir: str | os.PathLike | None = None) -> list[dict[str, Any]]:
    """One dict per built-in name: name, kind, description, needs_file, available, fetch."""
    root = _data_dir(data_dir)
    out = []
    for s in BUILTINS.values():
        avail = True if s.file is None else (root / s.file).exists()
        out.append({"name": s.name, "kind": s.kind, "description": s.description, "needs_file": s.file,
                    "available": avail, "fetch": fetch_command(s.fetch) if s.fetch else None})
    return out


def _missing(spec: TraceSpec, root: Path) -> FileNotFoundError:
    how = f"run `{fetch_command(spec.name)}`" if spec.fetch else "download it"
    src = SOURCES.get(spec.name)
    extra = f" ({src.note})" if src and src.note else ""
    return FileNotFoundError(f"trace {spec.name!r} needs {spec.file}, not found in the data directory {root} "
                             f"(TWIN_DATA_DIR or --data-dir); {how}{extra}, or set TWIN_DATA_DIR to a directory "
                             f"that holds it")


def resolve(name_or_path: str, data_dir: str | os.PathLike | None = None) -> tuple[TraceSpec | None, Path | None]:
    """``(spec, path)``: a built-in (path of its file for real ones) or a path."""
    if name_or_path in BUILTINS:
        spec = BUILTINS[name_or_path]
        if spec.file is None:
            return spec, None
        root = _data_dir(data_dir)
        p = root / spec.file
        if not p.exists():
            raise _missing(spec, root)
        return spec, p
    p = Path(name_or_path).expanduser()
    if p.exists():
        return None, p
    looks_like_path = os.sep in name_or_path or "/" in name_or_path or p.suffix != ""
    if looks_like_path:
        raise FileNotFoundError(f"trace file {p} does not exist (and {name_or_path!r} is not a built-in name: "
                                f"{', '.join(BUILTINS)})")
    raise KeyError(f"unknown trace {name_or_path!r}{did_you_mean(name_or_path, BUILTINS)}; built-in names: "
                   f"{', '.join(BUILTINS)} (or give a path to a "
                   f"workload .parquet or a raw trace file)")


# --------------------------------------------------------------------------- helpers
def _trace_lengths_loader(data_dir: str | os.PathLike | None) -> Callable[[str], tuple[np.ndarray, np.ndarray]]:
    def load(name: str) -> tuple[np.ndarray, np.ndarray]:
        spec, path = resolve(name, data_dir)
        if spec is not None and spec.kind == "synthetic":
            raise ValueError(f"empirical lengths need a real trace or a file, not the synthetic {name!r}")
        if _file_format(path) == "workload":
            df = Workload.load(path).df
        else:
            tab = LOADERS[spec.fmt if spec else _file_format(path)](path)
            if not tab.has_lengths:
                raise ValueError(f"{name} has no request lengths to resample")
            df = tab.df
        return df["prompt_tokens"].to_numpy(), df["output_tokens"].to_numpy()
    return load


#: real-trace options that take a whole number -> the least one
_REAL_WHOLE_NUMBERS = {"max_conversations": 1, "days": 1, "start_min": 0, "end_min": 1}
#: real-trace options that take one of a few words -> those words
_REAL_CHOICES = {"turns": ("all", "first"), "side": ("a", "b", "both"), "adapters_from": ("synthetic", "key")}


def check_real_option_values(real: dict[str, Any]) -> dict[str, Any]:
    """The real-trace options of ``real`` (:data:`REAL_OPTIONS`) with whole numbers as ``int``; an
    :class:`OptionError` naming the option and what it takes for a value of the wrong type or out of
    range (a text where a number belongs, ``max_conversations=0``, an unknown ``turns``, a tokenizer
    that cannot be used here), before the trace is read."""
    out: dict[str, Any] = {}
    for key, v in real.items():
        if key in _REAL_WHOLE_NUMBERS:
            low = _REAL_WHOLE_NUMBERS[key]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v != int(v) \
                    or v < low:
                raise OptionError(f"workload option {key}={v!r}: give a whole number >= {low} ({REAL_OPTIONS[key]})")
            out[key] = int(v)
        elif key == "window_start":
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise OptionError(f"workload option window_start={v!r}: give a finite number of seconds >= 0 "
                                  f"({REAL_OPTIONS[key]})")
        elif key == "keep_failed":
            try:
                out[key] = parse_bool(v, key)
            except ValueError as e:
                raise OptionError(f"workload option {e} ({REAL_OPTIONS[key]})") from None
        elif key in _REAL_CHOICES and v not in _REAL_CHOICES[key]:
            raise OptionError(f"workload option {key}={v!r}: give {' or '.join(_REAL_CHOICES[key])} "
                              f"({REAL_OPTIONS[key]})")
        elif key == "tokenizer" and tokenizer_problem(v):
            raise OptionError(f"workload option {tokenizer_problem(v)}")
        elif key == "log_type" and not isinstance(v, str):
            raise OptionError(f"workload option log_type={v!r}: give the text of a log type ({REAL_OPTIONS[key]})")
    return out


def check_arrival_options(fmt: str, given: dict[str, Any], source: str) -> None:
    """Refuse the arrival options of ``given`` that a replayed trace of format ``fmt`` does not read:
    ``window_start`` where no recorded time is windowed (a trace re-timed by ``arrival``, or a dataset
    that records no time, :data:`UNTIMED_FORMATS`: its arrivals are drawn from 0 s); ``n_requests``
    where it counts nothing (it counts the conversations a conversation dataset's drawn starts begin;
    a trace of single requests is replayed with its own requests, or re-timed for ``duration``
    seconds at ``rps``); an ``arrival`` other than poisson or gamma on a trace of single requests
    (the processes its re-timing draws)."""
    drawn = given.get("arrival") is not None or fmt in UNTIMED_FORMATS
    if given.get("arrival") is not None and fmt not in CONVERSATION_FORMATS and given["arrival"] not in ("poisson",
                                                                                                       "gamma"):
        raise OptionError(f"workload option arrival={given['arrival']}: re-timing a trace supports arrival=poisson "
                          f"or gamma, not {given['arrival']!r} ({source} is re-timed by drawing its arrivals for "
                          f"--duration seconds at --rps); give arrival=poisson or arrival=gamma, or leave arrival out "
                          f"to replay its own times")
    if given.get("window_start") is not None and drawn:
        why = (f"{source} is re-timed by arrival={given['arrival']}" if given.get("arrival") is not None else
               f"{source} is a {fmt} dataset, which records no time")
        raise OptionError(f"workload option window_start={given['window_start']:g} has no effect: {why}, so its "
                          f"arrivals are drawn from the arrival process (from 0 s, for --duration seconds) and no "
                          f"recorded time is windowed; leave window_start out")
    if given.get("n_requests") is not None and not (drawn and fmt in CONVERSATION_FORMATS):
        what = (f"{source} is {'an' if fmt[:1] in 'aeiou' else 'a'} {fmt} trace of single requests, replayed with "
                f"its own requests, or re-timed (arrival=poisson|gamma) for --duration seconds at --rps"
                if fmt not in CONVERSATION_FORMATS else
                f"{source} is a {fmt} dataset replayed with its own (recorded) conversation starts")
        raise OptionError(f"workload option n_requests={given['n_requests']} has no effect: {what}; n_requests sets "
                          f"the request count of a synthetic preset, or the conversations of a conversation dataset "
                          f"whose starts are drawn (arrival=poisson|gamma); keep fewer requests with --duration (and "
                          f"window_start), or leave n_requests out")


#: the workload options of synthetic conversations (:class:`traces.conversations.ConversationConfig`)
CONVERSATION_OPTIONS = ("conversations", "mean_turns", "max_turns", "think_s", "tpot_s")
#: those a replayed conversation dataset reads: they time its later turns (which carry no time of their own)
TURN_TIMING_OPTIONS = ("think_s", "tpot_s")


def _given_list(keys: list[str], given: dict[str, Any]) -> str:
    def shown(v: Any) -> str:
        return f"{v:g}" if isinstance(v, float) else str(v).lower() if isinstance(v, bool) else str(v)
    return ", ".join(f"{k}={shown(given[k])}" for k in keys)


def check_conversation_options(fmt: str, given: dict[str, Any], turns: str, source: str) -> None:
    """Refuse the conversation options of ``given`` (the options the caller gave) that a replayed
    trace of format ``fmt`` does not read: every one of them on a trace of single requests (not one of
    :data:`CONVERSATION_FORMATS`); on a conversation dataset, which keeps its own conversations and
    turns, all but the turn timing (``think_s``, ``tpot_s``), and those too with ``turns="first"`` (no
    later turn). An :class:`OptionError` naming the options, the trace and the options that apply."""
    keys = [k for k in CONVERSATION_OPTIONS if given.get(k) is not None]
    if not keys:
        return
    them = "it" if len(keys) == 1 else "them"
    opts = f"workload option{'s' if len(keys) > 1 else ''} {_given_list(keys, given)}"
    effect = "has no effect" if len(keys) == 1 else "have no effect"
    datasets = [s.name for s in BUILTINS.values() if s.fmt in CONVERSATION_FORMATS]
    if fmt not in CONVERSATION_FORMATS:
        article = "an" if fmt[:1] in "aeiou" else "a"
        raise OptionError(f"{opts} {effect}: {source} is {article} {fmt} trace of single requests, not a conversation "
                          f"dataset: it has no turns to count or time; think_s and tpot_s time the later turns of a "
                          f"replayed conversation dataset (--trace {', '.join(datasets)}, or a "
                          f"{'/'.join(CONVERSATION_FORMATS)} file) and conversations, mean_turns, max_turns shape "
                          f"synthetic ones (e.g. --trace multiturn-synth); leave {them} out")
    unread = [k for k in keys if k not in TURN_TIMING_OPTIONS]
    if unread:
        them = "it" if len(unread) == 1 else "them"
        raise OptionError(f"workload option{'s' if len(unread) > 1 else ''} {_given_list(unread, given)} "
                          f"{'has' if len(unread) == 1 else 'have'} no effect: {source} is a {fmt} conversation "
                          f"dataset, replayed with its own conversations and turns (turns=first keeps the first turn "
                          f"of each); conversations, mean_turns and max_turns shape synthetic conversations only (e.g. "
                          f"--trace multiturn-synth), while think_s and tpot_s apply here (they time the later turns); "
                          f"leave {them} out")
    if turns == "first":
        raise OptionError(f"{opts} {effect} with turns=first: {source} is then replayed with the first turn of each "
                          f"conversation only, so no later turn is timed; give turns=all, or leave {them} out")


def _split_options(options: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    synth, real = {}, {}
    for k, v in options.items():
        if k in OPTIONS:
            synth[k] = v
        elif k in REAL_OPTIONS:
            real[k] = v
        else:
            raise OptionError(f"unknown workload option {k!r}; valid: {', '.join(sorted(OPTIONS))}, "
                            f"{', '.join(sorted(REAL_OPTIONS))}")
    return synth, real


def _length_filter_keep(df: pd.DataFrame, lc: LengthConfig) -> np.ndarray:
    """Rows passing the length limits; a failing turn drops the rest of its conversation."""
    ok = lc.filter().mask(df["prompt_tokens"].to_numpy(), df["output_tokens"].to_numpy())
    if "conversation_id" in df and (df["conversation_id"] >= 0).any():
        conv = df["conversation_id"].to_numpy()
        bad = (~ok).astype(np.int64)
        ok = (exclusive_group_cumsum(bad, conv) + bad) == 0
    return ok


def _conversations_at(df: pd.DataFrame, starts: np.ndarray, rng: np.random.Generator, info: dict[str, Any],
                      ) -> tuple[pd.DataFrame, np.ndarray]:
    """One dataset conversation per start time (rows grouped by conversation, in turn order).

    Conversations are taken in a seeded random order without replacement, or with replacement
    when there are more starts than conversations (then each use gets a fresh id).
    Returns the expanded rows and their arrival times (NaN for later turns).
    """
    conv = df["conversation_id"].to_numpy()
    first_rows = np.flatnonzero(np.r_[True, conv[1:] != conv[:-1]])
    lens = np.diff(np.r_[first_rows, conv.size])
    u, s = first_rows.size, starts.size
    if s <= u:
        chosen = rng.permutation(u)[:s]
    else:
        chosen = rng.integers(0, u, size=s)
        info["reused_conversations"] = True
    lens_c = lens[chosen]
    new_id = np.repeat(np.arange(s, dtype=np.int64), lens_c)
    within = np.arange(new_id.size) - np.repeat(np.cumsum(lens_c) - lens_c, lens_c)
    rows = np.repeat(first_rows[chosen], lens_c) + within
    out = df.iloc[rows].reset_index(drop=True)
    out["conversation_id"] = new_id
    t = np.where(out["turn"].to_numpy() == 0, starts[new_id], np.nan)
    return out, t


def _requests_at(df: pd.DataFrame, times: np.ndarray, rng: np.random.Generator, info: dict[str, Any]) -> pd.DataFrame:
    """One request of a single-request trace per drawn arrival time (as :func:`_conversations_at` does
    with conversations): requests taken in a seeded random order without replacement, or with
    replacement when there are more arrivals than requests (``info["reused_requests"]``)."""
    u, s = len(df), times.size
    if s <= u:
        chosen = rng.permutation(u)[:s]
    else:
        chosen = rng.integers(0, u, size=s)
        info["reused_requests"] = True
    out = df.iloc[chosen].reset_index(drop=True)
    out["arrival_s"] = np.asarray(times, float)
    return out


def _first_few(values: np.ndarray, k: int = 5) -> str:
    shown = ", ".join(str(int(v)) for v in values[:k])
    return shown + (f" ... ({values.size} in all)" if values.size > k else "")


def _starts_are_drawn(df: pd.DataFrame, has_conv: bool, fmt: str, source: str) -> bool:
    """Whether a trace's arrivals (conversation starts) are drawn although no ``arrival`` was given:
    a dataset that records no time at all (:data:`UNTIMED_FORMATS`: ShareGPT, LMSYS). A trace whose
    times are missing otherwise (a first turn or a single request without a timestamp) is refused
    naming the first few, before any work: it used to be re-timed as a whole with Poisson arrivals
    (and its ``window_start`` ignored) without a word, as the loaders' own missing timestamps were
    (:func:`traces.loaders.base.seconds_from_timestamps`). Later turns without a time are timed by
    the think-time model, as documented (:func:`traces.conversations.fill_turn_arrivals`)."""
    if fmt in UNTIMED_FORMATS:
        return True
    t = df["arrival_s"].to_numpy(float) if "arrival_s" in df else np.full(len(df), np.nan)
    if has_conv:
        first = df["turn"].to_numpy() == 0
        missing = np.unique(df["conversation_id"].to_numpy()[first][~np.isfinite(t[first])])
        total, what = int(first.sum()), "conversation"
    else:
        missing = np.flatnonzero(~np.isfinite(t)) + 1
        total, what = len(t), "request"
    if not missing.size:
        return False
    fix = ("re-time the whole trace explicitly with arrival=poisson (or gamma; --trace-opt arrival=poisson, with "
           "--rps and --duration)")
    if missing.size == total:
        raise WorkloadError(f"{source}: no {what} of this {fmt} trace has a timestamp"
                            f"{' (start time)' if has_conv else ''}, so there are no recorded times to replay; give "
                            f"the file with its timestamps, or {fix}")
    where = (f"conversations {_first_few(missing)} (numbered from 0 in the order read)" if has_conv else
             f"rows {_first_few(missing)} (numbered from 1 in the order read)")
    raise WorkloadError(f"{source}: {missing.size} of the {total} {what}s of this {fmt} trace have no timestamp"
                        f"{' for their first turn' if has_conv else ''}: {where}; drop those {what}s from the file to "
                        f"replay the recorded times of the others, or {fix}")


def _table_to_workload(table: TraceTable, cfg: SynthConfig, real: dict[str, Any], given: dict[str, Any],
                       data_dir: str | os.PathLike | None, fmt: str | None = None) -> tuple[Workload, dict[str, Any]]:
    """Apply lengths, arrivals, window/rescale and adapters to a loaded trace (the module docstring
    says how). The trace's timestamps (:func:`_starts_are_drawn`) and the key column of
    ``adapters_from="key"`` are checked first, before any work."""
    r_arr, r_ad, r_len, r_conv = (np.random.default_rng(s) for s in np.random.SeedSequence(cfg.seed).spawn(4))
    lc, cc, ad = cfg.lengths, cfg.conversations, cfg.adapters
    fmt = str(fmt if fmt is not None else table.meta.get("format", ""))
    source = str(table.meta.get("path") or "the trace")
    df = table.df.copy()
    info: dict[str, Any] = {"rows_loaded": int(len(df))}
    has_conv = "conversation_id" in df
    retime = "arrival" in given
    drawn = retime or _starts_are_drawn(df, has_conv, fmt, source)
    mode = real.get("adapters_from", "synthetic")
    if mode not in ("synthetic", "key"):
        raise ValueError(f"adapters_from must be 'synthetic' or 'key', got {mode!r}")
    if mode == "key" and "key" not in df:
        raise ValueError(f"{table.meta.get('format')} traces have no key column to map adapters from; "
                         f"use adapters_from=synthetic")
    if has_conv:
        df = df.sort_values(["conversation_id", "turn"], kind="stable").reset_index(drop=True)
        conv = df["conversation_id"].to_numpy()
        new = (df["prompt_tokens"] - df["prefix_tokens"]).to_numpy()
    # ---- lengths
    if lc.dist == "trace" and (lc.mean_in is not None or lc.mean_out is not None):
        raise ValueError("mean_in/mean_out need a synthetic length model (lengths=sharegpt|lognormal); "
                         "a replayed trace keeps its own lengths (use length_scale to resize them)")
    if not table.has_lengths or lc.dist != "trace":
        if lc.dist == "trace":
            raise ValueError(f"{table.meta.get('path')} has no request lengths; choose a length model with "
                             f"lengths=splitwise|sharegpt|... ")
        model = build_length_model(lc, _trace_lengths_loader(data_dir))
        p, o = sample_lengths(model, len(df), r_len, lc.scale, lc.filter())
        info["lengths_model"] = model.describe()
        if has_conv:
            new, o = p, o
        else:
            df["prompt_tokens"], df["output_tokens"] = p, o
    elif lc.scale != 1.0:
        if has_conv:
            new, o = scale_lengths(new, df["output_tokens"].to_numpy(), lc.scale)
        else:
            p, o = scale_lengths(df["prompt_tokens"].to_numpy(), df["output_tokens"].to_numpy(), lc.scale)
            df["prompt_tokens"], df["output_tokens"] = p, o
    if has_conv and (not table.has_lengths or lc.dist != "trace" or lc.scale != 1.0):
        df["output_tokens"] = o
        df["prefix_tokens"] = exclusive_group_cumsum(new + o, conv)
        df["prompt_tokens"] = np.maximum(df["prefix_tokens"].to_numpy() + new, 1)
    keep = _length_filter_keep(df, lc)
    info["dropped_by_length_filter"] = int((~keep).sum())
    df = df[keep].reset_index(drop=True)
    if df.empty:
        raise ValueError("no request of the trace passes the length limits (max_prompt/max_total/min_*)")
    # ---- adapters_from=key: the n most frequent keys of the whole trace become the n adapters; the requests of
    # the others (whole conversations) have no adapter and are dropped here, before any re-timing, rescaling or
    # window, so that --rps and --duration hold for the requests that are run (they were dropped after them)
    if mode == "key":
        keys = df["key"].to_numpy()
        kid, _, _ = map_keys_to_adapters(keys, ad.n_adapters, ad.ranks)
        unmapped = kid < 0
        if has_conv:  # (a conversation keeps one key; drop it whole should a turn carry another)
            conv = df["conversation_id"].to_numpy()
            unmapped = np.isin(conv, np.unique(conv[unmapped]))
        n_keys = int(pd.unique(keys).size)
        n_mapped = min(ad.n_adapters, n_keys)
        info["dropped_by_adapters_from_key"] = int(unmapped.sum())
        if unmapped.any():
            info["adapters_from_key_reason"] = (
                f"adapters_from=key maps the {n_mapped} most frequent of the trace's {n_keys} keys to adapters "
                f"(adapters={ad.n_adapters}); the requests of the other {n_keys - n_mapped} keys have no adapter and "
                f"were dropped before re-timing, --rps and --duration")
            df = df[~unmapped].reset_index(drop=True)
        if df.empty:
            raise ValueError(f"{source}: adapters_from=key with adapters={ad.n_adapters} maps no key of the trace to "
                             f"an adapter, so no request is left; give adapters >= 1")
    # ---- arrivals
    ac = cfg.arrivals
    t = df["arrival_s"].to_numpy(float) if "arrival_s" in df else np.full(len(df), np.nan)
    if has_conv:
        conv = df["conversation_id"].to_numpy()
        if drawn:
            # conversation starts from the arrival process; conversations in a seeded random order
            rps = ac.rps if ac.rps is not None else 4.0
            uniq = np.unique(conv)
            divisor = float(len(conv) / uniq.size)
            a2 = copy.deepcopy(ac)
            a2.rps, a2.process = rps, (ac.process if retime else "poisson")
            warm = align_warmup(a2, cc.warmup_s()) if ac.n_requests is None else 0.0
            a2.duration_s += warm
            check_size(dataclasses.replace(cfg, arrivals=a2, conversations=dataclasses.replace(cc, enabled=False)),
                       source, turns=divisor)  # (its duration holds the warm-up already)
            starts, _, ainfo = generate_arrivals(a2, ad.n_adapters, r_arr, divisor, lead_s=warm)
            starts = starts - warm
            info["arrivals"] = {"process": a2.process, "rps": rps, "conversation_rate": rps / divisor, **ainfo}
            df, t = _conversations_at(df, starts, r_arr, info["arrivals"])
            conv = df["conversation_id"].to_numpy()
        t = fill_turn_arrivals(t, conv, df["output_tokens"].to_numpy(), cc, r_conv)
        df["arrival_s"] = t
        if drawn and ac.n_requests is None:
            a_s = df["arrival_s"]
            df = df[(a_s >= 0) & (a_s < ac.duration_s)].reset_index(drop=True)
    elif drawn:  # re-timed (arrival=poisson|gamma, check_arrival_options): arrivals over [0, duration) at rps
        a2 = copy.deepcopy(ac)
        a2.rps, a2.n_requests, a2.process = (ac.rps if ac.rps is not None else 4.0), None, ac.process
        check_size(dataclasses.replace(cfg, arrivals=a2), source, replay=True)
        tt, _, ainfo = generate_arrivals(a2, 0, r_arr)
        info["arrivals"] = {"process": a2.process, "rps": a2.rps, "duration_s": float(a2.duration_s), **ainfo}
        df = _requests_at(df, tt, r_arr, info["arrivals"])
    if not drawn:  # replay: start at 0, rescale to the target rate, cut the window
        df["arrival_s"] = df["arrival_s"] - float(df["arrival_s"].min())
        if given.get("rps") is not None:
            t2, factor = rescale_to_rps(df["arrival_s"].to_numpy(), float(given["rps"]))
            df["arrival_s"] = t2
            info["time_scale_factor"] = factor
        start = float(real.get("window_start") or 0.0)
        dur = given.get("duration")
        if start or dur is not None:
            m = time_window(df["arrival_s"].to_numpy(), start, None if dur is None else float(dur))
            df = df[m].reset_index(drop=True)
            df["arrival_s"] = df["arrival_s"] - start
            info["window"] = [start, None if dur is None else start + float(dur)]
    if df.empty:
        raise ValueError("the time window holds no request; widen duration or move window_start")
    # ---- adapters
    if mode == "key":  # (every key left is one of the n mapped ones; ids by frequency in what is run, as before)
        ids, ranks, top = map_keys_to_adapters(df["key"].to_numpy(), ad.n_adapters, ad.ranks)
        info["adapter_keys"] = [str(k) for k in top[:20]]
    elif has_conv:
        conv = df["conversation_id"].to_numpy()
        uniq, inv = np.unique(conv, return_inverse=True)
        cid, crank = assign_adapters(uniq.size, ad.n_adapters, r_ad, ad.ranks, ad.popularity)
        ids, ranks = cid[inv.ravel()], crank[inv.ravel()]
    else:
        order = np.argsort(df["arrival_s"].to_numpy(), kind="stable")
        ids_s, ranks_s = assign_adapters(len(df), ad.n_adapters, r_ad, ad.ranks, ad.popularity)
        ids, ranks = np.empty_like(ids_s), np.empty_like(ranks_s)
        ids[order], ranks[order] = ids_s, ranks_s
    extra = {}
    if has_conv:
        extra = {"conversation_id": df["conversation_id"].to_numpy(), "turn": df["turn"].to_numpy(),
                 "prefix_tokens": df["prefix_tokens"].to_numpy()}
    w = Workload.from_arrays(df["arrival_s"].to_numpy(), df["prompt_tokens"].to_numpy(),
                             df["output_tokens"].to_numpy(), ids, ranks, **extra)
    return w, info


def expected_requests(cfg: SynthConfig, replay: bool = False, turns: float | None = None) -> float:
    """Requests the arrival options of ``cfg`` generate, on average (``replay``: the process
    re-times a dataset, whose default rate is 4 req/s). ``n_requests`` counts the drawn arrivals:
    requests, or conversation starts where each starts a conversation (:class:`traces.synth.ArrivalConfig`),
    whose turns are counted too: ``n_requests`` x the mean turns of a conversation (``turns``, a
    replayed dataset's, else ``cfg.conversations.expected_turns()`` of synthetic ones)."""
    a = cfg.arrivals
    if a.n_requests is not None:
        if turns is None:
            turns = cfg.conversations.expected_turns() if cfg.conversations.enabled else 1.0
        return float(a.n_requests) * float(turns)
    if a.process == "per-adapter":
        rates = [float(r) for r in (a.rates or DEFAULT_RATES)]
        n = max(cfg.adapters.n_adapters, 1)
        rate = a.rps if a.rps is not None else sum(rates[i % len(rates)] for i in range(min(n, 10 ** 6))) \
            * (n / min(n, 10 ** 6))
    elif a.process == "fitted":
        rate = a.rps if a.rps is not None else float(load_fitted(a.fit)["arrivals"]["mean_rps"]) if a.fit else 0.0
    else:
        rate = a.rps if a.rps is not None else (4.0 if replay else 0.0)
    return float(rate) * (float(a.duration_s) + _warmup_s(cfg))


def _warmup_s(cfg: SynthConfig) -> float:
    """The seconds of conversations drawn before the window (their later turns reach into it), or 0."""
    if not cfg.conversations.enabled or cfg.arrivals.n_requests is not None:
        return 0.0
    return cfg.conversations.warmup_s()


def check_size(cfg: SynthConfig, name: str, replay: bool = False, turns: float | None = None) -> None:
    """Refuse, before drawing anything, a workload expected to exceed :data:`MAX_REQUESTS`
    (:func:`expected_requests`; ``turns``: the mean turns of a replayed dataset's conversations, whose
    starts ``n_requests`` counts)."""
    try:
        n = expected_requests(cfg, replay, turns)
    except (KeyError, TypeError, ValueError, FileNotFoundError):
        return  # an invalid option is reported by the generator itself
    if n > MAX_REQUESTS and cfg.arrivals.n_requests is not None:
        per = n / cfg.arrivals.n_requests
        if per == 1.0:
            raise OptionError(f"the workload of {name} would hold n_requests={cfg.arrivals.n_requests} requests, more "
                              f"than the {MAX_REQUESTS:,} a run may generate; give a smaller n_requests")
        raise OptionError(f"the workload of {name} would hold about {n:.3g} requests: n_requests="
                          f"{cfg.arrivals.n_requests} counts conversations, of {per:.3g} turns each on average (every "
                          f"turn a request), more than the {MAX_REQUESTS:,} requests a run may generate; give "
                          f"n_requests <= {int(MAX_REQUESTS / per):,}")
    if n > MAX_REQUESTS:
        warm = _warmup_s(cfg)
        if warm > 0 and warm >= cfg.arrivals.duration_s:  # (the conversations' warm-up is most of it)
            raise OptionError(f"the workload of {name} would draw about {n:.3g} requests, more than the "
                              f"{MAX_REQUESTS:,} a run may generate: its conversations start {warm:.3g} s before the "
                              f"window ((max_turns - 1) x (think_s + 1000 tpot_s), so that their later turns reach "
                              f"it); lower think_s or max_turns (or --rps)")
        raise OptionError(f"the workload of {name} would hold about {n:.3g} requests (rate "
                          f"{cfg.arrivals.rps if cfg.arrivals.rps is not None else 'of the trace'} req/s x duration "
                          f"{cfg.arrivals.duration_s:g} s), more than the {MAX_REQUESTS:,} a run may generate; "
                          f"lower --duration or --rps")


def _file_format(path: Path) -> str:
    """The format of a trace file: ``workload`` for workload columns in a workload extension,
    else the sniffed raw format; errors name the file."""
    if path.is_file() and (path.stat().st_size == 0 or (path.stat().st_size < 4096 and not path.read_bytes().strip())):
        raise WorkloadError(f"{path}: the file is empty; give a workload ({', '.join(FILE_SUFFIXES)} with the "
                            f"workload columns) or a raw trace")
    if path.is_file() and path.suffix.lower() != ".parquet":
        with open(path, "rb") as fh:
            head = fh.read(4096)
        try:
            head.decode("utf-8")
            text = b"\0" not in head
        except UnicodeDecodeError as e:
            text = e.start > len(head) - 4  # a character cut at the end of the chunk
        if not text:
            raise WorkloadError(f"{path}: a binary file, not a trace; give a workload ({', '.join(FILE_SUFFIXES)} "
                                f"with the workload columns) or a raw trace in one of the formats of `twin traces "
                                f"list`")
    if path.is_file() and path.suffix.lower() in FILE_SUFFIXES:  # workload columns: read (and checked) as a workload
        cols = _first_columns(path)
        if cols is not None and ({"arrival_s", "prompt_tokens", "output_tokens"} & set(cols)):
            return "workload"
    try:
        return detect_format(path)
    except (FileNotFoundError, WorkloadError):
        raise
    except Exception as e:  # pyarrow/json/decoding errors of a file that is no trace at all
        msg = str(e).strip().splitlines()[0] if str(e).strip() else repr(e)
        if str(path) in msg:
            raise WorkloadError(msg) from None
        raise WorkloadError(f"{path}: not a readable trace or workload file ({msg}); give a workload "
                            f"({', '.join(FILE_SUFFIXES)}) or a raw trace (`twin traces list`)") from None


def _first_columns(path: Path) -> list[str] | None:
    """The header of a CSV, the keys of a JSON Lines file's first object or a Parquet file's column
    names (None if unreadable)."""
    if path.suffix.lower() == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            return list(pq.read_schema(path).names)
        except (pa.ArrowException, OSError, ValueError):  # not a Parquet file: sniffed (and refused) later
            return None
    try:
        with open(path, encoding="utf-8-sig") as fh:
            for line in fh:
                if not line.strip():
                    continue
                if path.suffix.lower() == ".csv":
                    return [c.strip().strip('"') for c in line.strip().split(",")]
                obj = json.loads(line)
                return [str(k) for k in obj] if isinstance(obj, dict) else None
    except (UnicodeDecodeError, ValueError, OSError, RecursionError):  # (RecursionError: a JSON nested too deep)
        return None
    return None


# --------------------------------------------------------------------------- entry points
def get_workload(name_or_path: str = "synthetic", *, data_dir: str | os.PathLike | None = None,
                 rps: float | None = None, duration: float | None = None, adapters: int | None = None,
                 ranks: list[int] | None = None, popularity: str | None = None, seed: int = 0,
                 **options: Any) -> Workload:
    """The workload of a built-in name or a path (see the module docstring).

    ``options`` are the synthesis options of :data:`traces.synth.OPTIONS` (``arrival``, ``cv``,
    ``lengths``, ``mean_in``, ``length_scale``, ``max_total``, ``conversations``, ...) and, for
    real traces, :data:`REAL_OPTIONS`. Raises ``KeyError`` (listing the names) for an unknown
    name and ``FileNotFoundError`` (naming the file, the data directory and the fetch command)
    for a real trace whose file is missing.
    """
    try:
        seed = whole_number(seed)
    except (TypeError, ValueError) as e:
        raise ValueError(f"seed = {seed!r}: {e}; give a whole number") from None
    given = {"rps": rps, "duration": duration, "adapters": adapters, "ranks": ranks, "popularity": popularity,
             **options}
    given = {k: v for k, v in given.items() if v is not None}
    synth_opts, real_opts = _split_options({k: v for k, v in given.items()})
    spec, path = resolve(name_or_path, data_dir)
    record = {"source": name_or_path, "seed": int(seed), "options": _jsonable(given)}
    if spec is not None and spec.kind == "synthetic":
        if real_opts:
            raise OptionError(f"options {sorted(real_opts)} apply to real traces, not to the synthetic {spec.name!r}")
        cfg = apply_options(SynthConfig(seed=seed), {**spec.defaults, **synth_opts, "seed": seed})
        if cfg.arrivals.process in ("per-adapter", "fitted") and "rps" not in synth_opts:
            cfg.arrivals.rps = None  # per-adapter: the rates list decides; fitted: the fitted mean rate
        check_size(cfg, spec.name)
        validate_config(cfg)  # (a bad value is named first, then an option its settings do not read)
        check_options_apply(cfg, synth_opts, f"synthetic preset {spec.name!r}")
        w = synthesize(cfg, _trace_lengths_loader(data_dir))
        w.meta.update(record, kind="synthetic", name=spec.name, description=spec.description)
        return w
    given.update(check_real_option_values(real_opts))
    fmt = spec.fmt if spec is not None else _file_format(path)
    if fmt == "workload":
        return _from_saved(path, given, synth_opts, real_opts, seed, record)
    source = f"trace {spec.name!r}" if spec is not None else f"trace file {path}"
    check_arrival_options(fmt, given, source)
    defaults = dict(spec.defaults) if spec is not None else {}
    if fmt in ("azure-functions-2019", "azure-functions-2021") and spec is None:
        defaults = dict(BUILTINS["azure-functions"].defaults)
    merged = {**defaults, **given}
    given_synth = synth_opts
    synth_opts, real_opts = _split_options(merged)
    base = SynthConfig(seed=seed, arrivals=ArrivalConfig(rps=None), adapters=AdapterConfig(),
                       lengths=LengthConfig(dist="trace"), conversations=ConversationConfig())
    cfg = apply_options(base, {**synth_opts, "seed": seed})
    check_options_apply(cfg, given_synth, source, replay=True)
    check_conversation_options(fmt, given_synth, str(real_opts.get("turns", "all")), source)
    loader_kwargs = {k: v for k, v in real_opts.items() if k in _LOADER_KWARGS}
    if fmt in ("azure-functions-2019", "azure-functions-2021"):
        loader_kwargs["n_functions"] = cfg.adapters.n_adapters
        if fmt == "azure-functions-2019":
            loader_kwargs["rng"] = np.random.default_rng(np.random.SeedSequence(seed).spawn(5)[4])
    try:
        table = LOADERS[fmt](path, **loader_kwargs)
    except TypeError as e:
        if "keyword argument" in str(e):  # (an option the format's loader does not take)
            reads = sorted(k for k in inspect.signature(LOADERS[fmt]).parameters if k in _LOADER_KWARGS)
            unread = sorted(k for k in loader_kwargs if k not in reads) or sorted(loader_kwargs)
            raise OptionError(f"option(s) {unread} do not apply to {fmt} traces, whose loader reads "
                              f"{', '.join(reads) if reads else 'none of the real-trace options'} ("
                              f"{', '.join(sorted(_LOADER_KWARGS))} apply to other formats); leave "
                              f"{'it' if len(unread) == 1 else 'them'} out") from e
        raise WorkloadError(f"{path}: cannot read it as a {fmt} trace (a value of the wrong type: {e})") from None
    except (FileNotFoundError, OptionError):
        raise
    except (ValueError, KeyError, IndexError, UnicodeDecodeError, OSError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
        raise WorkloadError(msg if str(path) in str(msg) else f"{path}: cannot read it as a {fmt} trace ({msg})") from None
    if not len(table):
        raise WorkloadError(f"{path}: the trace holds no requests (a header but no rows?)")
    w, info = _table_to_workload(table, cfg, real_opts, merged, data_dir, fmt)
    w.meta.update(record, kind="real", name=spec.name if spec else None, format=fmt, loader=table.meta,
                  transform=_jsonable(info), config=cfg.to_dict())
    return w


def seed_acts(name_or_path: str, data_dir: str | os.PathLike | None = None,
              options: Collection[str] = ()) -> bool:
    """Whether a seed can change the workload of ``name_or_path`` built with ``options`` (the option names
    given): a saved workload file is replayed as written and its seed only draws new adapters
    (``adapters``, ``popularity``; see :func:`_from_saved`); every other source draws with it."""
    spec, path = resolve(name_or_path, data_dir)
    if spec is not None or path is None or _file_format(path) != "workload":
        return True
    return bool({"adapters", "popularity"} & set(options))


def _from_saved(path: Path, given: dict[str, Any], synth_opts: dict[str, Any], real_opts: dict[str, Any], seed: int,
                record: dict[str, Any]) -> Workload:
    """A saved workload, optionally rescaled / windowed / with adapters reassigned (one adapter per
    conversation, as :func:`_table_to_workload` assigns them)."""
    w = Workload.load(path)
    allowed = {"rps", "duration", "adapters", "ranks", "popularity", "window_start"}
    extra = set(given) - allowed
    if extra:
        src = w.meta.get("source") if w.meta.get("kind") not in (None, "file") else None  # (the twin wrote it)
        instead = (f"regenerate it from {src!r}, the trace its meta names, with them instead: twin traces synth "
                   f"--trace {src} ..." if src else "its requests are replayed as the file gives them: edit the file "
                                                    "instead")
        raise OptionError(f"{path}: a workload file can only be rescaled (--rps), windowed (--duration, window_start) "
                          f"or get new adapters (--adapters, --ranks, --popularity); options {sorted(extra)} do not "
                          f"apply ({instead})")
    if not given:
        return w
    df = w.df.copy()
    t = df["arrival_s"].to_numpy()
    if "rps" in given:
        try:
            t, _ = rescale_to_rps(t, float(given["rps"]))
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None
    start = float(given.get("window_start", 0.0))
    m = time_window(t, start, given.get("duration"))
    if len(df) and not m.any():  # (as for a raw trace: an empty window is an error, not an empty workload)
        raise ValueError(f"{path}: the time window holds no request (its arrivals run from {t.min():g} s to "
                         f"{t.max():g} s); widen duration or move window_start")
    df = df[m].reset_index(drop=True)
    df["arrival_s"] = t[m] - start
    if {"adapters", "popularity"} & set(given):  # new adapters: ids drawn again (ranks: the given or the default)
        cfg = apply_options(SynthConfig(seed=seed), {k: given[k] for k in ("adapters", "ranks", "popularity")
                                                     if k in given})
        r_ad = np.random.default_rng(np.random.SeedSequence(seed).spawn(4)[1])
        conv = df["conversation_id"].to_numpy() if "conversation_id" in df else np.full(len(df), -1)
        if (conv >= 0).any():
            # a conversation keeps one adapter, as a replayed dataset's and a synthetic one's do (its later turns
            # reuse the history KV of the earlier ones, twin/prefix_kv.py, which is only valid under one LoRA): one
            # draw per conversation in the order they first appear, one per request outside any (id -1)
            group = np.where(conv >= 0, conv, -1 - np.arange(len(df), dtype=np.int64))
            codes, uniq = pd.factorize(group)
            gid, grank = assign_adapters(len(uniq), cfg.adapters.n_adapters, r_ad, cfg.adapters.ranks,
                                         cfg.adapters.popularity)
            ids, ranks = gid[codes], grank[codes]
        else:  # single requests: one draw each, in the file's order
            ids, ranks = assign_adapters(len(df), cfg.adapters.n_adapters, r_ad, cfg.adapters.ranks,
                                         cfg.adapters.popularity)
        df["adapter_id"], df["adapter_rank"] = ids, ranks
    elif "ranks" in given:  # new ranks only: the file's adapters keep their requests (ranks cycled over the ids;
        # before stop 51 the ids were drawn again too, with the default popularity and 100 adapters)
        cfg = apply_options(SynthConfig(seed=seed), {"ranks": given["ranks"]})
        ids = df["adapter_id"].to_numpy()
        table = assign_ranks(int(ids.max()) + 1 if len(ids) and ids.max() >= 0 else 0, cfg.adapters.ranks)
        df["adapter_rank"] = np.where(ids >= 0, table[np.maximum(ids, 0)] if len(table) else 0, 0)
    # (the file's request ids are kept: the results join back to its rows; they stay unique in any window)
    meta = {**record, "kind": "derived", "derived_from": w.meta, "rows_kept": int(len(df)), "rows_in_file": int(len(w))}
    return Workload(df, meta)


def _jsonable(d: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in d.items():
        if isinstance(v, np.ndarray):
            v = v.tolist()
        elif isinstance(v, (np.integer, np.floating)):
            v = v.item()
        elif isinstance(v, tuple):
            v = list(v)
        elif isinstance(v, dict):
            v = _jsonable(v)
        out[k] = v
    return out


def regenerate(meta: dict[str, Any], data_dir: str | os.PathLike | None = None) -> Workload:
    """Rebuild a workload from its ``meta`` (``source``, ``seed``, ``options``)."""
    if "source" not in meta or "options" not in meta:
        raise ValueError("workload meta lacks 'source'/'options'; it was not made by traces.registry.get_workload")
    return get_workload(meta["source"], data_dir=data_dir, seed=int(meta.get("seed", 0)), **meta["options"])
