"""Sweep grids: scenario axes x configuration axes, named or read from a TOML / YAML file.

A grid file (TOML shown; YAML has the same keys)::

    name = "my-grid"
    profile = "llama-3.1-8b_h100_vllm085"   # profile name or JSON path
    window_s = 3600
    seeds = [0]

    [scenarios]
    rate_values = [3.2, 1.6, 0.8, 0.4, 0.1]   # every 3-combination (descending) ...
    # rates = [[0.4, 0.05, 0.00625]]          # ... or explicit triples
    rank_values = [8, 16, 32]                 # every 3-multiset with at most `max_largest` of the largest
    max_largest = 1
    # ranks = [[8, 16, 32]]
    lengths = [[222, 197]]                    # mean input / output tokens (ShareGPT-like)
    # length_corr = -0.37                     # prompt-output length coupling (default 0: independent)
    arrival = ["poisson"]                     # per-adapter streams: poisson, or gamma:CV (bursty when CV > 1)
    policy = ["fcfs+client-cap"]              # or any vLLM-engine preset of `twin policies`
    # workload = ["my-trace.parquet"]         # instead of rates ... arrival: replay a workload file, served
                                              # walking nested subsets of its adapters (twin/sweep/workload_scenario.py)

    [configs]
    served = [16, 32, 64]
    slots = [16, 32, 64]                      # only slots <= served are run
    max_lora_rank = "max"                     # the scenario's largest rank, or a list of ranks
    engine = { max_num_seqs = 2048 }          # any EngineConfig field, fixed for every run

    [early_stop]
    walk = true       # a slot value's walk over served adapters stops at the first starving run
    run = true        # a run stops as soon as it is decided starving (bounds always correct)
    ratio = 0.9

    [slo]
    ttft_s = 10.0
    tbt_s = 0.2

Rates and ranks are two axes, not (rate, rank) pairs: a run's ``served`` adapters take the ranks of
its rank tuple round-robin (adapter ``i`` has ``ranks[i % len(ranks)]``) and the rates of its rate
tuple round-robin, then shuffled independently of the ranks, as the real client assigned them
(:mod:`twin.validation.recreate`). So a rate tuple and a rank tuple need not be as long as each other:
``rates = [[0.4, 0.1]]`` with ``ranks = [[8, 16, 32]]`` is a scenario of half the adapters at each
rate and a third at each rank, every rate spread over every rank. (``twin configure search`` takes
one rate and one rank per adapter class, as many of each; the shipped configurators were trained on
triples of both.)
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from traces.arguments import did_you_mean, first_repeat
from traces.arrivals import ArrivalError, parse_arrival
from traces.registry import MAX_REQUESTS
from twin.registry import PRESETS, load_entry_points, resolve_system
from twin.sweep.scenario import (DEFAULT_POLICY, POLICY_KEY_PART, check_length_corr, check_lengths, get_profile,
                                 profile_hash, scenario_profile, unloaded_request_s)
from twin.sweep.workload_scenario import FILE_ARRIVAL, grace_note, load_workload_scenario, served_values
from twin.sweep.workload_scenario import scenario_key as workload_scenario_key
from twin.config import SLORA_ONLY_FIELDS, ConfigError, EngineConfig
from twin.model_spec import get_model
from twin.perf.profile import DEFAULT_FITTED, parse_lora_targets
from twin.scenario import VLLM_MAX_LORA_RANKS, check_host_term, rank_limit, read_mapping_file, rebase_path
from twin.tensor_parallel import TensorParallelError, calibrated_degree, tp_profile
from twin.validation.specs import RANK_TILE_COST, SERVING_S_PER_RUNNING

#: The published per-adapter rates (req/s) and ranks.
PUBLISHED_RATES = (3.2, 1.6, 0.8, 0.4, 0.1, 0.05, 0.025, 0.0125, 0.00625, 0.003125)
PUBLISHED_RANKS = (8, 16, 32)
#: The published grid of served adapters and GPU adapter slots.
PUBLISHED_GRID = (16, 32, 64, 96, 128, 160, 192, 256, 320, 384)


@dataclass
class GridSpec:
    name: str = "grid"
    profile: str | None = None
    window_s: float = 3600.0
    seeds: list[int] = field(default_factory=lambda: [0])
    rates: list[list[float]] = field(default_factory=list)
    ranks: list[list[int]] = field(default_factory=list)
    lengths: list[list[float]] = field(default_factory=lambda: [[222.0, 197.0]])
    #: Gaussian-copula prompt-output length coupling of every scenario's request pool
    #: (:func:`twin.validation.recreate.sharegpt_model`); 0 draws the lengths independently, as the
    #: published sweeps did. ``twin validate`` re-creates the real runs with
    #: :data:`twin.validation.specs.PROMPT_OUTPUT_CORR`; results/configurator/README.md says why the
    #: shipped sweeps keep 0.
    length_corr: float = 0.0
    #: the serving path's host time per running request and engine step, in microseconds
    #: (:meth:`twin.perf.profile.Profile.with_serving_host`); 0, the shipped sweeps' value, is the calibrated
    #: engine alone. ``twin validate`` re-creates the real runs with
    #: :data:`twin.validation.specs.SERVING_S_PER_RUNNING`.
    serving_us: float = 0.0
    #: the working-block cost of a LoRA shrink rank tile beyond the first, relative to the first
    #: (:meth:`twin.perf.profile.Profile.with_rank_tile_cost`); None, the shipped sweeps' value, is the
    #: profile's own. ``twin validate`` re-creates the real runs with
    #: :data:`twin.validation.specs.RANK_TILE_COST`.
    rank_tile_cost: float | None = None
    arrival: list[str] = field(default_factory=lambda: ["poisson"])
    policy: list[str] = field(default_factory=lambda: ["fcfs+client-cap"])
    served: list[int] = field(default_factory=lambda: list(PUBLISHED_GRID))
    slots: list[int] = field(default_factory=lambda: list(PUBLISHED_GRID))
    max_lora_rank: Any = "max"
    engine: dict[str, Any] = field(default_factory=dict)
    early_stop_walk: bool = True
    early_stop_run: bool = True
    ratio: float = 0.9
    ttft_slo_s: float | None = None
    tbt_slo_s: float | None = None
    model: str = ""
    #: workload files replayed as scenarios instead of the rates x ranks x lengths x arrival product
    #: (:mod:`twin.sweep.workload_scenario`; resolved paths)
    workloads: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if not d["length_corr"]:
            del d["length_corr"]  # independent lengths: the digest of every grid from before the key
        if not d["serving_us"]:
            del d["serving_us"]  # likewise
        if d["rank_tile_cost"] is None:
            del d["rank_tile_cost"]  # likewise
        if not d["workloads"]:
            del d["workloads"]  # likewise
        return d

    def digest(self) -> str:
        """Hash of everything that changes results (the resume check)."""
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True, default=str).encode()).hexdigest()[:16]

    # ------------------------------------------------------------------ enumeration
    def scenarios(self) -> list[dict[str, Any]]:
        """Every scenario (rates x ranks x lengths x arrival x policy, or workload file x policy) with its key."""
        check_policies(self.policy)
        if self.workloads:
            return self._workload_scenarios()
        check_lengths(self.lengths, self.length_corr)
        out = []
        for rates, ranks, lengths, arrival, policy in itertools.product(self.rates, self.ranks, self.lengths,
                                                                        self.arrival, self.policy):
            try:
                arrival = parse_arrival(arrival).name
            except ArrivalError as e:
                raise ValueError(f"grid arrival: {e}") from None
            key = scenario_key(rates, ranks, lengths, policy, arrival)
            sc = {"key": key, "rates": [float(r) for r in rates], "ranks": [int(r) for r in ranks],
                  "lengths": [float(x) for x in lengths], "arrival": arrival, "policy": policy, "model": self.model}
            if self.length_corr:  # absent at 0: the task hashes (shard names) of every earlier sweep hold
                sc["length_corr"] = float(self.length_corr)
            if self.serving_us:  # likewise
                sc["serving_us"] = float(self.serving_us)
            if self.rank_tile_cost is not None:  # likewise
                sc["rank_tile_cost"] = float(self.rank_tile_cost)
            out.append(sc)
        return out

    def _workload_scenarios(self) -> list[dict[str, Any]]:
        """One scenario per workload file and policy (:mod:`twin.sweep.workload_scenario`)."""
        out = []
        for path, policy in itertools.product(self.workloads, self.policy):
            info = load_workload_scenario(path, self.window_s)
            key = workload_scenario_key(path, info["sha256"])
            if policy not in (None, "", DEFAULT_POLICY):
                key += f"{POLICY_KEY_PART}{policy}"
            f = info["features"]
            sc = {"key": key, "workload": info["path"], "workload_sha256": info["sha256"], "rates": [],
                  "ranks": info["ranks"], "adapters": info["adapters"],
                  "lengths": [f["mean_input_tokens"], f["mean_output_tokens"]], "arrival": FILE_ARRIVAL,
                  "policy": policy, "model": self.model, "features": f}
            if self.serving_us:
                sc["serving_us"] = float(self.serving_us)
            if self.rank_tile_cost is not None:
                sc["rank_tile_cost"] = float(self.rank_tile_cost)
            out.append(sc)
        return out

    def max_rank_for(self, ranks: list[int]) -> list[int]:
        if self.max_lora_rank in (None, "max"):
            return [int(max(ranks))]
        v = self.max_lora_rank if isinstance(self.max_lora_rank, (list, tuple)) else [self.max_lora_rank]
        return [int(x) for x in v if int(x) >= max(ranks)]

    def configs(self) -> list[tuple[int, int]]:
        """(slots, served) pairs with slots <= served, slot-major, served ascending."""
        return [(g, n) for g in sorted(self.slots) for n in sorted(self.served) if g <= n]

    def check_configs(self) -> None:
        """At least one configuration (slots <= served), else an error before any run."""
        if not self.configs():
            raise ValueError(f"no configuration has slots <= served adapters (slots {sorted(self.slots)}, served "
                             f"{sorted(self.served)}); give slot values at most the served adapters")

    def tasks(self) -> list[dict[str, Any]]:
        """One task per scenario x seed x max rank: its walk over the configurations."""
        self.check_configs()
        out = []
        for sc in self.scenarios():
            served = sorted(int(x) for x in self.served)
            if "workload" in sc:  # (a file's walk stops at its own adapters)
                check_workload_served(self, sc["workload"], sc["adapters"])
                served = served_values(served, sc["adapters"])
            for seed in self.seeds:
                for mr in self.max_rank_for(sc["ranks"]):
                    tid = f"{sc['key']}|seed={seed}|maxrank={mr}"
                    out.append({"task_id": tid, "scenario": sc, "seed": int(seed), "max_rank": int(mr),
                                "slots": sorted(int(x) for x in self.slots), "served": served,
                                "window_s": float(self.window_s), "profile": self.profile, "engine": dict(self.engine),
                                "early_stop_walk": self.early_stop_walk, "early_stop_run": self.early_stop_run,
                                "ratio": float(self.ratio), "ttft_slo_s": self.ttft_slo_s, "tbt_slo_s": self.tbt_slo_s})
        for t in out:
            t["task_hash"] = task_hash(t)
        return out

    def n_runs_max(self) -> int:
        """Runs of every task's walk with nothing stopped early (a workload file's walk stops at its adapters)."""
        return sum(sum(1 for g in t["slots"] for n in t["served"] if g <= n) for t in self.tasks())


def check_known_policies(names: list[str]) -> None:
    """Every name is the published policy (``fcfs+client-cap``, also as None or empty), ``validation``
    or a preset of ``twin policies`` (plugins' included); otherwise an error naming the presets."""
    load_entry_points()
    known = {DEFAULT_POLICY, "validation", *PRESETS}
    bad = [str(n) for n in names if n not in known and n not in (None, "")]
    if bad:
        raise ValueError(f"unknown policy {bad[0]!r}{did_you_mean(bad[0], known)}; use {DEFAULT_POLICY!r} (the "
                         f"published runs) or a preset of "
                         f"`twin policies`: {', '.join(sorted(PRESETS))}")


def check_policies(names: list[str]) -> None:
    """Every name is the published policy (``fcfs+client-cap``) or a preset of ``twin policies`` that
    runs on the vLLM engine; otherwise an error naming the presets, before any run (the walk would
    record every run of the scenario as an error, or run an S-LoRA preset on the wrong engine)."""
    check_known_policies(names)
    slora = [str(n) for n in names if n in PRESETS and resolve_system(n, None) == "slora"]
    if slora:
        vllm = sorted(n for n in PRESETS if resolve_system(n, None) == "vllm")
        raise ValueError(f"policy {slora[0]!r} runs on the S-LoRA engine, but a sweep runs every configuration on the "
                         f"vLLM engine (its axes are vLLM's adapter slots and start-up check), which would run the "
                         f"preset's scheduler and cache without S-LoRA's unified pool; compare S-LoRA presets with "
                         f"`twin compare`, or sweep a preset on vLLM: {', '.join(vllm)}")


def task_hash(task: dict[str, Any]) -> str:
    """Hash of everything that changes a task's rows (its scenario, configurations, window, profile
    name and content, seed, options): the shard name, so a shard is reused only for the same task."""

    d = {k: v for k, v in task.items() if k != "task_hash"}
    d["profile_hash"] = profile_hash(task.get("profile"))
    return hashlib.sha1(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _fmt(x: float) -> str:
    s = repr(float(x))
    return s[:-2] if s.endswith(".0") else s


def scenario_key(rates, ranks, lengths=None, policy: str | None = None, arrival: str | None = None) -> str:
    """``rate_0.4-0.05-0.00625_size_8-16-32`` (the real runs' folder names), with the lengths, the arrival
    process (``_arrival_gamma-2``) and the policy appended when they are not the published ones (the
    policy last: :func:`twin.sweep.scenario.workload_key` cuts it off, keeping what decides the workload)."""
    key = "rate_" + "-".join(_fmt(r) for r in rates) + "_size_" + "-".join(str(int(r)) for r in ranks)
    if lengths is not None and [round(float(x), 3) for x in lengths] != [222.0, 197.0]:
        key += "_len_" + "-".join(_fmt(x) for x in lengths)
    if arrival not in (None, "", "poisson"):
        key += "_arrival_" + parse_arrival(arrival).name.replace(":", "-")
    if policy not in (None, "", "fcfs+client-cap"):
        key += f"{POLICY_KEY_PART}{policy}"
    return key


def rate_triples(values=PUBLISHED_RATES, k: int = 3) -> list[list[float]]:
    """Every k-combination of distinct rates, each in descending order (120 for the published ten)."""
    vals = sorted({float(v) for v in values}, reverse=True)
    return [list(c) for c in itertools.combinations(vals, k)]


def rank_multisets(values=PUBLISHED_RANKS, k: int = 3, max_largest: int = 1) -> list[list[int]]:
    """Every k-multiset of ranks with at most ``max_largest`` copies of the largest (7 for 8/16/32)."""
    vals = sorted(int(v) for v in values)
    top = vals[-1]
    return [list(c) for c in itertools.combinations_with_replacement(vals, k) if c.count(top) <= max_largest]


# --------------------------------------------------------------------------- named grids
def _published(name: str, profile: str, model: str, **engine: Any) -> GridSpec:
    return GridSpec(name=name, profile=profile, model=model, rates=rate_triples(), ranks=rank_multisets(), **engine)


#: The engine constants ``twin validate`` fits on the real Llama runs' fit split (``dt_modelling``, never
#: ``ml_test``): the serving path's host time per running request and step (microseconds) and the LoRA
#: shrink's rank-tile cost; the ``adapter-twin-llama-validated`` grid sweeps with them.
VALIDATED_ENGINE = {"serving_us": round(SERVING_S_PER_RUNNING * 1e6, 6), "rank_tile_cost": RANK_TILE_COST}


NAMED_GRIDS = {
    "adapter-twin-llama": lambda: _published("adapter-twin-llama", "llama-3.1-8b_h100_vllm085", "llama-3.1-8b"),
    "adapter-twin-qwen": lambda: _published("adapter-twin-qwen", "qwen-2.5-7b_h100_vllm085", "qwen-2.5-7b"),
    # the published Llama grid on the validated engine (VALIDATED_ENGINE: the calibrated profile plus the
    # serving path's host time and the rank-tile cost fitted on the real runs' fit split; results/configurator/
    # README.md, "The validated engine's sweep")
    "adapter-twin-llama-validated": lambda: _published("adapter-twin-llama-validated", "llama-3.1-8b_h100_vllm085",
                                                       "llama-3.1-8b", **VALIDATED_ENGINE),
    # the published Llama grid on the validated engine with vLLM's per-step adapter check (the profile variant
    # ``adaptercheck``, fitted on the calibration tables: results/configurator/README.md, "The adapter-check
    # engine's sweep")
    "adapter-twin-llama-adaptercheck": lambda: _published(
        "adapter-twin-llama-adaptercheck", "llama-3.1-8b_h100_vllm085_adaptercheck", "llama-3.1-8b",
        **VALIDATED_ENGINE),
    # the published grid plus the slot values it could not reach (8; 160-224 where vLLM starts)
    "adapter-twin-llama-ext": lambda: GridSpec(
        name="adapter-twin-llama-ext", profile="llama-3.1-8b_h100_vllm085", model="llama-3.1-8b",
        rates=rate_triples(), ranks=rank_multisets(), slots=sorted(set(PUBLISHED_GRID) | {8, 176, 208, 224})),
    # two scenarios, served 8-32 x slots 8-16, a 120 s window: seconds, for CI; on the twin's default profile
    "smoke": lambda: GridSpec(name="smoke", profile=DEFAULT_FITTED, model="llama-3.1-8b",
                              window_s=120.0, rates=[[3.2, 1.6, 0.8], [0.8, 0.4, 0.1]],
                              ranks=[[8, 16, 32]], served=[8, 16, 32], slots=[8, 16], ttft_slo_s=5.0, tbt_slo_s=0.2),
    # the policy as a scenario axis (one configurator per policy, results/configurator/README.md): 8
    # scenarios x 3 vLLM-engine policies (the published one, an EMA-popularity prefetching cache, a static
    # LoRA/KV partition), served 8-96 x slots 8-16, a 120 s window: about 30 CPU-s
    "policy-demo": lambda: GridSpec(
        name="policy-demo", profile="llama-3.1-8b_h100_vllm085", model="llama-3.1-8b", window_s=120.0,
        rates=[[3.2, 1.6, 0.8], [1.6, 0.8, 0.4], [0.8, 0.4, 0.1], [0.4, 0.1, 0.05]], ranks=[[8, 16, 32], [8, 8, 16]],
        policy=["fcfs+client-cap", "ema-prefetch", "vllm-partition"], served=[8, 12, 16, 24, 32, 48, 64, 96],
        slots=[8, 16]),
    # the arrival process as a scenario axis (results/configurator/README.md, "Bursty arrivals"): four rate
    # triples from the published set, each adapter's stream Poisson or gamma of CV 2 or 4, the published
    # served x slots grid over the published hour
    "arrival-demo": lambda: GridSpec(
        name="arrival-demo", profile="llama-3.1-8b_h100_vllm085", model="llama-3.1-8b",
        rates=[[1.6, 0.8, 0.4], [0.4, 0.1, 0.05], [0.1, 0.05, 0.025], [0.025, 0.0125, 0.00625]], ranks=[[8, 16, 32]],
        arrival=["poisson", "gamma:2", "gamma:4"]),
}


_SCEN_KEYS = {"rates", "rate_values", "rate_arity", "ranks", "rank_values", "rank_arity", "max_largest", "lengths",
              "length_corr", "serving_us", "rank_tile_cost", "arrival", "policy", "workload"}
#: the [scenarios] keys a workload file gives itself (refused beside ``workload``)
_FILE_GIVES = ("rates", "rate_values", "rate_arity", "ranks", "rank_values", "rank_arity", "max_largest", "lengths",
               "length_corr", "arrival")


def check_workload_served(g: GridSpec, path: str, adapters: int) -> None:
    """A workload file of ``adapters`` adapters keeps a configuration of the grid: a served value of at most
    its adapters, with a slot value at most that; else an error naming the file and the bound."""
    served = served_values(sorted(g.served), adapters)
    if not served or not any(s <= max(served) for s in g.slots):
        raise ValueError(f"grid [configs] served {sorted(g.served)} / slots {sorted(g.slots)}: the workload file "
                         f"{path} has {adapters} adapters, fewer than every served value (or every slot value above "
                         f"the served ones it can take), so its walk would run nothing; give served and slots values "
                         f"of at most {adapters}")


def add_workload(g: GridSpec, sc: dict[str, Any], base: Any) -> None:
    """``[scenarios] workload``: the files (relative to the grid file's directory ``base``), read and checked
    (:func:`twin.sweep.workload_scenario.load_workload_scenario`); the grid's ranks and lengths become the
    files' (for the rank and window checks)."""
    both = [k for k in _FILE_GIVES if k in sc]
    if both:
        raise ValueError(f"grid [scenarios] workload and {', '.join(both)}: a workload file gives its requests' "
                         f"rates, ranks, lengths and arrival times itself; leave out {', '.join(both)} (or sweep "
                         f"synthetic scenarios in another grid)")
    names = _names(sc["workload"], "[scenarios] workload", 'workload = ["my-trace.parquet"]')
    paths = [str(Path(str(rebase_path("workload", n, Path(base)) if base is not None else n)).expanduser())
             for n in names]
    for n, p in zip(names, paths):
        if not Path(p).is_file():
            raise ValueError(f"grid [scenarios] workload {n!r}: {'a directory' if Path(p).is_dir() else 'no such file'}"
                             f" ({Path(p).resolve()}); give a workload file (.parquet, .csv, .jsonl) as `twin run "
                             f"--trace FILE` takes it (a relative path is read from the grid file's directory)")
    g.workloads = _unique([str(Path(p).resolve()) for p in paths], "[scenarios] workload",
                          'workload = ["a.parquet", "b.parquet"]')
    infos = [load_workload_scenario(p, g.window_s) for p in g.workloads]
    g.ranks = [list(i["ranks"]) for i in infos]
    g.lengths = [[i["features"]["mean_input_tokens"], i["features"]["mean_output_tokens"]] for i in infos]
    g.arrival = [FILE_ARRIVAL]
_CONF_KEYS = {"served", "slots", "max_lora_rank", "engine"}
_TOP_KEYS = {"name", "profile", "window_s", "seeds", "model", "scenarios", "configs", "early_stop", "slo"}
#: the EngineConfig fields each run takes from a grid axis ([configs] key), not from [configs.engine]
_AXIS_FIELDS = {"max_loras": "slots", "served_adapters": "served", "max_lora_rank": "max_lora_rank"}


def _number(v: Any, where: str, kind: type = float, lo: float = 0.0, lo_ok: bool = False, example: str = "") -> Any:
    """``v`` as a finite ``kind`` above ``lo`` (at or above with ``lo_ok``), else an error naming
    the grid key ``where``, what it must be, and an example."""
    bad = (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
           or (kind is int and float(v) != int(v)))
    x = None if bad else kind(v)
    if x is None or not math.isfinite(x) or x < lo or (x == lo and not lo_ok):
        what = ("an integer" if kind is int else "a number") + (f" >= {lo:g}" if lo_ok else f" > {lo:g}")
        raise ValueError(f"grid {where}: {v!r} is not {what}" + (f"; e.g. {example}" if example else ""))
    return x


def _host_term(name: str, v: float, example: str) -> float:
    """A ``[scenarios]`` engine constant (``serving_us``, ``rank_tile_cost``) at most its bound
    (:data:`twin.scenario.HOST_TERM_MAXIMA`, as ``twin run`` takes it), else an error naming the key
    (a :class:`~twin.config.ConfigError`, which is a ``ValueError``)."""
    check_host_term(name, v, f"grid [scenarios] {name}", f"e.g. {example}")
    return v


def _numbers(v: Any, where: str, kind: type = float, lo: float = 0.0, lo_ok: bool = False,
             example: str = "") -> list[Any]:
    """A non-empty list of :func:`_number` values (a single value is a list of one)."""
    items = v if isinstance(v, (list, tuple)) else [v]
    if not items:
        raise ValueError(f"grid {where}: an empty list; give at least one value" + (f", e.g. {example}" if example else ""))
    return [_number(x, where, kind, lo, lo_ok, example) for x in items]


def _tuples(v: Any, where: str, kind: type, example: str) -> list[list[Any]]:
    """A non-empty list of non-empty lists of positive numbers (per-adapter rate or rank tuples)."""
    if not isinstance(v, (list, tuple)) or not v or not all(isinstance(t, (list, tuple)) and t for t in v):
        raise ValueError(f"grid {where}: {v!r} is not a list of non-empty lists; e.g. {example}")
    return [_numbers(t, where, kind, example=example) for t in v]


def _check_engine_value(name: str, v: Any) -> None:
    """An ``[configs.engine]`` value of the type its :class:`~twin.config.EngineConfig` field
    declares (``int``, ``float``, ``bool``, ``str``, optionally ``None``); a wrong type would make
    every run of the sweep end in an error."""
    decl = str(EngineConfig.__dataclass_fields__[name].type).replace(" ", "")
    optional = decl.endswith("|None")
    base = decl.removesuffix("|None")
    if v is None and optional:
        return
    ok = {"int": isinstance(v, int) and not isinstance(v, bool), "bool": isinstance(v, bool),
          "str": isinstance(v, str),
          "float": isinstance(v, (int, float)) and not isinstance(v, bool)}.get(base, True)
    if not ok:
        raise ValueError(f"grid [configs.engine] {name}: {v!r} is not {'an' if base == 'int' else 'a'} {base}"
                         f"{' (or absent)' if optional else ''}; `twin run --help` describes the field")


def _check_engine_settings(engine: dict[str, Any]) -> None:
    """``[configs.engine]`` as one set of settings, before any run: what :meth:`EngineConfig.validate` refuses
    (e.g. ``max_num_seqs`` above the token budget), an unknown ``lora_targets``, LoRA disabled (a sweep of adapter
    slots with LoRA off would reject every request and record each run as ok), a tensor-parallel degree the model
    does not split into. Each used to end every run of the sweep in an error, or be ignored, with exit 0."""
    if engine.get("enable_lora") is False:
        raise ValueError("grid [configs.engine] enable_lora = false: a sweep walks adapter slots and served adapters, "
                         "and with LoRA off every adapter request is rejected; leave enable_lora out")
    try:
        EngineConfig(**{**engine, "max_loras": 1}).validate()
    except ConfigError as e:
        raise ValueError(f"grid [configs.engine]: {e}") from None
    if engine.get("lora_targets") is not None:
        try:
            parse_lora_targets(engine["lora_targets"])
        except ValueError as e:
            raise ValueError(f"grid [configs.engine] lora_targets: {str(e).removeprefix('--lora-targets: ')}") from None


def grid_from_dict(d: dict[str, Any], default_name: str = "grid") -> GridSpec:
    """A :class:`GridSpec` from a grid file's table; every key is checked (type and range) and an
    error names the key, the value and what to give, before any run."""
    if not isinstance(d, dict):
        raise TypeError(f"grid: got {type(d).__name__}; give a dict of the grid file's keys, e.g. "
                        f"{{'name': 'my-grid', 'scenarios': {{...}}, 'configs': {{...}}}} (a named grid or a file: "
                        f"load_grid(name_or_path))")
    unknown = set(d) - _TOP_KEYS - {"_grid_dir"}
    if unknown:
        raise ValueError(f"grid: unknown keys {sorted(unknown)}; allowed: {sorted(_TOP_KEYS)}")
    for k in ("scenarios", "configs", "early_stop", "slo"):
        if d.get(k) is not None and not isinstance(d[k], dict):
            raise ValueError(f"grid [{k}]: expected a table of keys, got {type(d[k]).__name__}")
    sc = dict(d.get("scenarios") or {})
    cf = dict(d.get("configs") or {})
    for k in set(sc) - _SCEN_KEYS:
        raise ValueError(f"grid [scenarios]: unknown key {k!r}; allowed: {sorted(_SCEN_KEYS)}")
    for k in set(cf) - _CONF_KEYS:
        raise ValueError(f"grid [configs]: unknown key {k!r}; allowed: {sorted(_CONF_KEYS)}")
    g = GridSpec(name=_grid_name(d.get("name", default_name), "name" in d), profile=_profile(d.get("profile")),
                 window_s=_number(d.get("window_s", 3600.0), "window_s", example="window_s = 3600"),
                 seeds=_unique(_numbers(d.get("seeds", [0]), "seeds", int, lo_ok=True, example="seeds = [0, 1]"),
                               "seeds", "seeds = [0, 1]"),
                 model=_model(d.get("model", "")))
    if "workload" in sc:
        add_workload(g, sc, d.get("_grid_dir"))
    for given, generators in (("rates", ("rate_values", "rate_arity")), ("ranks", ("rank_values", "rank_arity",
                                                                                    "max_largest"))):
        both = [k for k in generators if k in sc]
        if given in sc and both:  # (the generators were ignored silently)
            raise ValueError(f"grid [scenarios] {given} and {', '.join(both)}: {given} lists the tuples themselves, "
                             f"{' / '.join(generators[:2])} generate them, so {', '.join(both)} would be ignored; give "
                             f"one of the two forms")
    _check_model(g)
    if g.workloads:
        pass  # (rates, ranks, lengths and arrivals are the files')
    elif "rates" in sc:
        g.rates = _unique(_tuples(sc["rates"], "[scenarios] rates", float, "rates = [[0.4, 0.05, 0.00625]]"),
                          "[scenarios] rates", "rates = [[0.4, 0.05, 0.00625], [3.2, 1.6, 0.8]]")
    else:
        vals = _numbers(sc.get("rate_values", PUBLISHED_RATES), "[scenarios] rate_values",
                        example="rate_values = [3.2, 1.6, 0.8]")
        k = _number(sc.get("rate_arity", 3), "[scenarios] rate_arity", int, example="rate_arity = 3")
        if k > len(set(vals)):
            raise ValueError(f"grid [scenarios] rate_arity = {k}: more than the {len(set(vals))} distinct rate_values; "
                             f"give at least {k} rates or a smaller arity")
        _check_count(math.comb(len(set(vals)), k), "rate tuples", "rate_values / rate_arity")
        g.rates = rate_triples(vals, k)
    if g.workloads:
        pass
    elif "ranks" in sc:
        g.ranks = _unique(_tuples(sc["ranks"], "[scenarios] ranks", int, "ranks = [[8, 16, 32]]"),
                          "[scenarios] ranks", "ranks = [[8, 16, 32], [8, 8, 16]]")
    else:  # (a repeated rank value would repeat every multiset holding it)
        rv = _unique(_numbers(sc.get("rank_values", PUBLISHED_RANKS), "[scenarios] rank_values", int,
                              example="rank_values = [8, 16, 32]"), "[scenarios] rank_values",
                     "rank_values = [8, 16, 32]")
        rk = _number(sc.get("rank_arity", 3), "[scenarios] rank_arity", int, example="rank_arity = 3")
        _check_count(math.comb(len(set(rv)) + rk - 1, rk), "rank multisets", "rank_values / rank_arity")
        g.ranks = rank_multisets(rv, rk, _number(sc.get("max_largest", 1), "[scenarios] max_largest", int, lo_ok=True,
                                                 example="max_largest = 1"))
    if "lengths" in sc:
        g.lengths = _unique(_tuples(sc["lengths"], "[scenarios] lengths", float, "lengths = [[222, 197]]"),
                            "[scenarios] lengths", "lengths = [[222, 197], [400, 300]]")
    if "length_corr" in sc:
        g.length_corr = check_length_corr(sc["length_corr"], "grid [scenarios] length_corr")
    if "serving_us" in sc:
        g.serving_us = _host_term("serving_us", _number(sc["serving_us"], "[scenarios] serving_us", lo_ok=True,
                                                        example="serving_us = 18"), "serving_us = 18")
    if "rank_tile_cost" in sc:
        g.rank_tile_cost = _host_term("rank_tile_cost", _number(sc["rank_tile_cost"], "[scenarios] rank_tile_cost",
                                                                lo_ok=True, example="rank_tile_cost = 0.7091"),
                                      "rank_tile_cost = 0.7091")
    if "arrival" in sc:
        names = _names(sc["arrival"], "[scenarios] arrival", 'arrival = ["poisson", "gamma:2"]')
        try:  # (the canonical names: gamma:2.0 and gamma:2 are one process, one scenario)
            g.arrival = _unique([parse_arrival(x).name for x in names], "[scenarios] arrival",
                                'arrival = ["poisson", "gamma:2"]')
        except ArrivalError as e:
            raise ValueError(f"grid [scenarios] arrival: {e}") from None
    if "policy" in sc:
        g.policy = _names(sc["policy"], "[scenarios] policy", f'policy = ["{DEFAULT_POLICY}", "vllm-partition"]',
                          none_ok=True)
    if "served" in cf:
        g.served = _unique(_numbers(cf["served"], "[configs] served", int, example="served = [16, 32, 64]"),
                           "[configs] served", "served = [16, 32, 64]")
    if "slots" in cf:
        g.slots = _unique(_numbers(cf["slots"], "[configs] slots", int, example="slots = [16, 32]"),
                          "[configs] slots", "slots = [16, 32]")
    if "max_lora_rank" in cf:
        g.max_lora_rank = cf["max_lora_rank"]
        if g.max_lora_rank not in (None, "max"):
            _unique(_numbers(g.max_lora_rank, "[configs] max_lora_rank", int,
                             example='max_lora_rank = "max" or [16, 32]'), "[configs] max_lora_rank",
                    'max_lora_rank = "max" or [16, 32]')
    if "engine" in cf:
        if not isinstance(cf["engine"], dict):
            raise ValueError("grid [configs] engine: expected a table of EngineConfig fields, e.g. "
                             "engine = { max_num_seqs = 2048 }")
        fields = set(EngineConfig.__dataclass_fields__)
        bad = set(cf["engine"]) - fields
        if bad:
            raise ValueError(f"grid [configs.engine]: {sorted(bad)} are not EngineConfig fields")
        for k, axis in _AXIS_FIELDS.items():  # the walk sets them per run; an override would run another grid
            if k in cf["engine"]:            # than the rows record
                raise ValueError(f"grid [configs.engine] {k}: set by the grid's {axis} axis for every run (the "
                                 f"rows record that value); give it as [configs] {axis} = [...] instead")
        for k in SLORA_ONLY_FIELDS:  # (the sweep simulates every run on the vLLM engine, twin.engine.Engine)
            if k in cf["engine"]:
                raise ValueError(f"grid [configs.engine] {k}: an option of the S-LoRA engine (twin run --system slora), "
                                 f"but a sweep runs every configuration on the vLLM engine, which does not read it; "
                                 f"leave it out")
        for k, v in cf["engine"].items():
            _check_engine_value(k, v)
        _check_engine_settings(cf["engine"])
        g.engine = dict(cf["engine"])
    es = d.get("early_stop") or {}
    for k in set(es) - {"walk", "run", "ratio"}:
        raise ValueError(f"grid [early_stop]: unknown key {k!r}; allowed: ['ratio', 'run', 'walk']")
    for k in ("walk", "run"):
        if not isinstance(es.get(k, True), bool):
            raise ValueError(f"grid [early_stop] {k}: {es[k]!r} is not true or false")
    g.early_stop_walk = es.get("walk", True)
    g.early_stop_run = es.get("run", True)
    g.ratio = _number(es.get("ratio", 0.9), "[early_stop] ratio", example="ratio = 0.9")
    if g.ratio > 1:
        raise ValueError(f"grid [early_stop] ratio: {g.ratio:g} is above 1 (a share of the offered tokens); e.g. ratio = 0.9")
    slo = d.get("slo") or {}
    for k in set(slo) - {"ttft_s", "tbt_s"}:
        raise ValueError(f"grid [slo]: unknown key {k!r}; allowed: ['tbt_s', 'ttft_s']")
    for k, example in (("ttft_s", "ttft_s = 10"), ("tbt_s", "tbt_s = 0.2")):
        if slo.get(k) is not None:
            _number(slo[k], f"[slo] {k}", example=example)
    g.ttft_slo_s = slo.get("ttft_s")  # (as written: the value is part of the resume digest)
    g.tbt_slo_s = slo.get("tbt_s")
    if not g.workloads and (not g.rates or not g.ranks):
        raise ValueError("grid: no scenario (empty rates or ranks)")
    _check_rank_limit(g, "workload" if g.workloads else "ranks" if "ranks" in sc else "rank_values")
    g.check_configs()
    for path in g.workloads:
        check_workload_served(g, path, load_workload_scenario(path, g.window_s)["adapters"])
    n_scen = len(g.workloads) if g.workloads else len(g.rates) * len(g.ranks) * len(g.lengths) * len(g.arrival)
    _check_count(n_scen * len(g.policy) * len(g.seeds), "tasks (scenarios x seeds)", "the scenario axes or seeds")
    _check_max_rank(g)
    if not g.workloads:  # (a file's requests are its own: read and capped when the grid is read)
        _check_requests(g)
    tp = g.engine.get("tensor_parallel", 1)
    prof = get_profile(g.profile)
    if tp != 1 or calibrated_degree(prof) != 1:  # (every run ended in an error)
        try:
            tp_profile(prof, tp)  # (a degree the model takes; a profile calibrated at TP > 1 runs at that degree only)
        except TensorParallelError as e:
            raise ValueError(f"grid [configs.engine] tensor_parallel: {e}") from None
    g.defaulted = _defaulted(d)
    return g


def _grid_name(v: Any, given: bool) -> str:
    """The grid's name: the default output directory is ``sweeps/<name>``, so one non-empty
    directory name (no path separator, not ``.`` or ``..``)."""
    where = "grid name" if given else "grid name (the file's name, as the grid sets no `name`)"
    if not isinstance(v, str):
        raise ValueError(f"{where}: {v!r} is not a string; give one directory name, e.g. name = \"my-grid\"")
    bad = ("is empty" if not v.strip() else "holds a path separator" if "/" in v or "\\" in v or os.sep in v
           else "is not a directory name" if v in (".", "..") or "\0" in v else "")
    if bad:
        raise ValueError(f"{where} {v!r} {bad}; the default output directory is sweeps/<name>: give one directory "
                         f"name, e.g. name = \"my-grid\" (or choose the directory with --out)")
    return v


def _profile(v: Any) -> str | None:
    """The grid's ``profile``: absent (the default profile), a profile name or a JSON path."""
    if v is not None and not isinstance(v, str):
        raise ValueError(f"grid profile: {v!r} is not a profile name or a JSON path (a string); e.g. profile = "
                         f"\"llama-3.1-8b_h100_vllm085\" (`twin calibrate list` shows the shipped ones)")
    return v


def _model(v: Any) -> str:
    if not isinstance(v, str):
        raise ValueError(f"grid model: {v!r} is not a model name (a string); e.g. model = \"llama-3.1-8b\"")
    return v


def _check_model(g: GridSpec) -> None:
    """The grid's ``model`` (a label its run rows carry): a model the twin knows, and the one its profile
    describes (a grid for another model recorded the profile's runs under that model's name)."""
    if not g.model:
        return
    try:
        model = get_model(g.model)
    except KeyError as e:
        raise ValueError(f"grid model: {e.args[0]}") from None
    try:
        prof = get_profile(g.profile)
    except (KeyError, ValueError, OSError):
        return  # (the profile's own error comes when the sweep loads it)
    if prof.model.name != model.name:
        raise ValueError(f"grid model {g.model!r}: the grid's profile {prof.name!r} describes {prof.model.name}, so "
                         f"its runs would be recorded as {model.name}'s; give model = \"{prof.model.name}\" (or leave "
                         f"it out), or a profile of {model.name} (`twin calibrate list`)")


def _names(v: Any, where: str, example: str, none_ok: bool = False) -> list[Any]:
    """A non-empty list of distinct names (a single name is a list of one); with ``none_ok`` a
    null or empty name is the published policy, as :func:`check_policies` takes it."""
    items = list(v) if isinstance(v, (list, tuple)) else [v]
    if not items:
        raise ValueError(f"grid {where}: an empty list (the grid would run nothing); give at least one value, "
                         f"e.g. {example}")
    for x in items:
        if not isinstance(x, str) and not (none_ok and x is None):
            raise ValueError(f"grid {where}: {x!r} is not a name (a string); e.g. {example}")
    norm = [DEFAULT_POLICY if none_ok and x in (None, "") else x for x in items]
    _unique(norm, where, example)
    return items


def _unique(values: list[Any], where: str, example: str) -> list[Any]:
    """``values`` when no value repeats; a repeated value would run the same tasks twice."""
    i = first_repeat(values)
    if i >= 0:
        raise ValueError(f"grid {where}: {values[i]!r} is listed twice (its runs would be done twice); give each value "
                         f"once, e.g. {example}")
    return values


#: the axes a grid file may leave out, and the key(s) that set each
_DEFAULTED_AXES = (("rates", "scenarios", ("rates", "rate_values")), ("ranks", "scenarios", ("ranks", "rank_values")),
                   ("served", "configs", ("served",)), ("slots", "configs", ("slots",)))


def _defaulted(d: dict[str, Any]) -> list[str]:
    """The axes a grid file leaves at the published grid's values (and ``profile`` at the default)."""
    out = [axis for axis, table, keys in _DEFAULTED_AXES if not any(k in (d.get(table) or {}) for k in keys)]
    if "workload" in (d.get("scenarios") or {}):  # (a file gives its rates and ranks)
        out = [a for a in out if a not in ("rates", "ranks")]
    if d.get("profile") in (None, ""):
        out.append("profile")
    return out


def defaults_note(g: GridSpec, n_tasks: int) -> str:
    """A line naming the axes a grid file left at the published grid's values and the profile it left
    at the default (empty when it sets them all, and for the named grids): a grid file with only a
    ``name`` is the whole published grid (840 tasks)."""
    axes = getattr(g, "defaulted", None)
    if not axes:
        return ""
    pub = [a for a in axes if a != "profile"]
    parts = [f"{', '.join(pub)} at the published grid's values"] if pub else []
    if "profile" in axes:
        parts.append(f"profile at the default ({get_profile(None).name})")
    return (f"grid {g.name!r} leaves {' and '.join(parts)}: {n_tasks} tasks x {len(g.configs())} configurations; "
            f"set them in the grid file for another grid ([scenarios] rates or rate_values, ranks or rank_values, "
            f"[configs] served, slots; profile)")


#: the most tasks a grid file may hold (the published grid has 840)
MAX_TASKS = 100_000


def _check_count(n: int, what: str, keys: str) -> None:
    if n > MAX_TASKS:
        raise ValueError(f"grid: {n:,} {what}, more than {MAX_TASKS:,}; reduce {keys} (the published grid has 840 "
                         f"scenarios)")


def _check_rank_limit(g: GridSpec, key: str = "ranks") -> None:
    """Every adapter rank and explicit ``max_lora_rank`` of the grid is one vLLM can serve: at most the
    largest ``max_lora_rank`` it accepts (:func:`twin.scenario.rank_limit`, as ``twin run --ranks`` takes it);
    ``key``: the ``[scenarios]`` key that gave the ranks."""
    limit, why = rank_limit("vllm")
    top = max(max(r) for r in g.ranks)
    if top > limit:
        raise ValueError(f"grid [scenarios] {key}: rank {top} is above {limit}, {why}: vLLM cannot serve such an "
                         f"adapter; give ranks of at most {limit}, e.g. ranks = [[8, 16, 32]]")
    if g.max_lora_rank not in (None, "max"):
        values = g.max_lora_rank if isinstance(g.max_lora_rank, (list, tuple)) else [g.max_lora_rank]
        high = max(int(v) for v in values)
        if high > limit:
            raise ValueError(f"grid [configs] max_lora_rank: {high} is above {limit}, {why}; give values of at most "
                             f"{limit}, or \"max\"")


def _check_max_rank(g: GridSpec) -> None:
    """An explicit ``max_lora_rank`` list keeps a scenario only at values >= its largest rank: refuse
    a grid where that leaves no task (it would run nothing and report success)."""
    if g.max_lora_rank in (None, "max"):
        return
    vals = g.max_lora_rank if isinstance(g.max_lora_rank, (list, tuple)) else [g.max_lora_rank]
    odd = [r for r in vals if r not in VLLM_MAX_LORA_RANKS]
    if odd:  # (twin run --max-lora-rank refuses them: vLLM's LoRAConfig does)
        raise ValueError(f"grid [configs] max_lora_rank {odd[0]}: vLLM accepts only "
                         f"{', '.join(map(str, VLLM_MAX_LORA_RANKS))} (LoRAConfig's possible_max_ranks)")
    top = max(max(r) for r in g.ranks)
    low = min(max(r) for r in g.ranks)
    if not any(g.max_rank_for(r) for r in g.ranks):
        raise ValueError(f"grid [configs] max_lora_rank = {g.max_lora_rank!r}: below every scenario's largest rank "
                         f"({low}-{top}); vLLM pads every slot to max_lora_rank and refuses a larger adapter: give "
                         f"values >= {top}, or \"max\"")


def _check_requests(g: GridSpec) -> None:
    """The busiest run of the grid (the largest served count at the largest rates, over the window)
    stays within ``twin run``'s request cap (:data:`traces.registry.MAX_REQUESTS`)."""
    mean_rate = max(sum(r) / len(r) for r in g.rates)
    n = mean_rate * max(g.served) * g.window_s
    if n > MAX_REQUESTS:
        count = f"{n:,.0f}" if n < 1e15 else f"{n:.3g}"  # (1e300 req/s printed 301 digits)
        raise ValueError(f"grid: its busiest run expects ~{count} requests ({max(g.served)} adapters at a mean "
                         f"{mean_rate:g} req/s each over window_s = {g.window_s:g}), more than the twin's "
                         f"{MAX_REQUESTS:,}; lower the rates, the served adapters or window_s")
    if n < 1:  # every run would offer nothing and be recorded as a run that kept up
        raise ValueError(f"grid: its busiest run expects ~{n:.2g} requests ({max(g.served)} adapters at a mean "
                         f"{mean_rate:g} req/s each over window_s = {g.window_s:g}), so every run would hold no "
                         f"request; lengthen window_s (e.g. window_s = 3600) or raise the rates")


#: the share of the starvation line's margin (1 - ratio: 10 % of the offered tokens at the published 0.9) that the
#: tokens still in flight at a window's end may take before :func:`window_note` warns: past it, more than a tenth of
#: the runs that keep up with margin to spare (throughput between the line and the offered load) read as starving
WINDOW_MARGIN_SHARE = 0.1


def window_cut(g: GridSpec) -> dict[str, float]:
    """How much of the offered tokens a run of ``g`` loses at its window's end, at the least.

    A run counts the tokens of the requests finished within ``window_s``; those still running when it ends are
    cancelled. Requests arrive at a steady rate, so the requests in flight at the end are those that arrived in the
    last request time ``L``: about ``L / window_s`` of the offered tokens (``cut``) go uncounted even when the server
    keeps up, and a run reads ``ratio`` below what it serves. ``L`` is :func:`twin.sweep.scenario.unloaded_request_s`
    (a request with the engine to itself, token-weighted: a lower bound, queueing under load only lengthens it) at
    the grid's lightest configuration (fewest slots and served adapters, smallest maximum rank) for its longest
    request mix. The starvation line leaves a ``margin`` of ``1 - ratio``: a ``cut`` of the whole margin makes even
    an unloaded run read as starving, and a ``cut`` above :data:`WINDOW_MARGIN_SHARE` of it misreads a run that
    keeps up with that much to spare. ``min_window_s``: the window whose ``cut`` is that share of the margin."""
    tasks = g.tasks()
    slots, served = min(g.slots), min(g.served)
    rank = min(t["max_rank"] for t in tasks)
    longest = 0.0
    for pair in {tuple(t["scenario"]["lengths"]) for t in tasks}:
        sc = next(t["scenario"] for t in tasks if tuple(t["scenario"]["lengths"]) == pair)
        prof = scenario_profile(g.profile, sc)
        longest = max(longest, unloaded_request_s(prof, pair, g.length_corr, slots, rank, served))
    margin = 1.0 - float(g.ratio)
    return {"request_s": longest, "cut": longest / float(g.window_s), "margin": margin,
            "min_window_s": longest / (WINDOW_MARGIN_SHARE * margin) if margin > 0 else math.inf}


def window_note(g: GridSpec, what: str, flag: str) -> str:
    """A warning for a window too short for the starvation line (:func:`window_cut`; empty when it is long
    enough); ``what`` names the runs (``grid 'g2'``), ``flag`` the setting to lengthen (``window_s``, ``--window``).
    A workload file's window is checked the other way: one that outlasts the file's requests
    (:func:`twin.sweep.workload_scenario.grace_note`)."""
    if g.workloads:
        return "; ".join(n for n in (grace_note(p, g.window_s, flag) for p in g.workloads) if n)
    c = window_cut(g)
    if c["margin"] <= 0 or c["cut"] <= WINDOW_MARGIN_SHARE * c["margin"]:
        return ""
    reads = ("even a run offered next to nothing is expected to read as starving" if c["cut"] >= c["margin"]
             else f"a run that keeps up with less than {100 * c['cut']:.1f} % to spare is expected to read as starving")
    lo = math.ceil(c["min_window_s"] / 10.0) * 10
    return (f"{flag} {g.window_s:g} is short for the starvation line (throughput >= {g.ratio:g} of the offered "
            f"tokens): a request of {what} takes ~{c['request_s']:.1f} s even with the engine to itself, so "
            f"~{100 * c['cut']:.1f} % or more of the offered tokens are expected to be still in flight when the window "
            f"ends, uncounted, against the line's margin of {100 * c['margin']:g} %: {reads}; give {flag} >= {lo:g} "
            f"(in flight at most a tenth of the margin; the published runs use 3600)")


def load_grid(name_or_path: str | os.PathLike) -> GridSpec:
    """A named grid (:data:`NAMED_GRIDS`) or a ``.toml`` / ``.yaml`` / ``.yml`` / ``.json`` file (a relative
    ``profile`` path in it is read relative to the file, :func:`twin.scenario.rebase_path`)."""
    s = str(name_or_path)
    if s in NAMED_GRIDS:
        return NAMED_GRIDS[s]()
    p = Path(s)
    if not p.exists():
        raise ValueError(f"unknown grid {s!r}: not a named grid ({', '.join(NAMED_GRIDS)}) nor a file")
    d = read_mapping_file(p, label="grid file", what="grid", yaml_extra="sweep",
                          example="`twin sweep --list` names the built-in grids", also="")
    if isinstance(d, dict) and "profile" in d:  # a relative profile path is read relative to the grid file
        d["profile"] = rebase_path("profile", d["profile"], p.parent)
    if isinstance(d, dict):  # (and a relative workload file)
        d["_grid_dir"] = str(p.parent)
    return grid_from_dict(d or {}, default_name=p.stem)
