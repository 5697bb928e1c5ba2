"""Chameleon (Iliakopoulou et al., MICRO'25): ``chameleon-fig11``, ``chameleon-caches`` and ``chameleon-schedulers``.

**The paper's experiment** (``shared/refs/chameleon.md`` §4): one A40 (48 GB), Llama-7B,
100 adapters of ranks 8/16/32/64/128 (20 each), U-P popularity (uniform over ranks, power law
within a rank), Splitwise conversation lengths scaled down by a constant so that peak memory
matches the GPU, Poisson arrivals; TTFT SLO = 5x the mean low-load execution time, TBT SLO
150 ms; loads 6/8/9 RPS against S-LoRA's knee of 8.6 RPS; throughput = the highest load whose
P99 TTFT stays within the SLO.

**In the twin** (every value below is a name or a definition, none a paper result):

* queued-request prefetch on for every system (:data:`QUEUED_PREFETCH`, the paper's S-LoRA
  baseline and Chameleon both prefetch the adapters of queued requests), histogram prefetch off;
* workload :data:`WORKLOAD` (the registered ``chameleon`` synthetic workload: Splitwise-like
  lengths times its own ``length_scale``, see ``twin traces list``) with the paper's adapters
  and popularity set explicitly (:data:`ADAPTERS`, :data:`RANKS`, :data:`POPULARITY`);
* profile :data:`PROFILE` (A40-48GB, Llama-2-7B);
* TTFT SLO = :data:`SLO_X` x the mean E2E of S-LoRA at low load
  (:func:`twin.reproduce.base.low_load_reference`), TBT SLO :data:`TBT_SLO_S`;
* S-LoRA's knee: :func:`twin.reproduce.base.knee_search` on P99 TTFT <= SLO; the three loads
  are :data:`LOAD_FRACTIONS` of it (6, 8 and 9 RPS relative to 8.6 RPS: conditions of the
  paper's experiment, not results);
* throughput within the SLO: the same knee search for each system;
* lengths: the paper's rule, "Splitwise lengths scaled down by a constant factor so that peak
  memory equals GPU capacity", turned into a search (:func:`length_scale_search`).
  *How measured*: the largest share of the unified pool in use at any step of a run (KV plus
  resident adapter weights, :func:`twin.reproduce.base.Runner.point` ``mem_use_peak``); the
  peak "equals" the capacity when it reaches :data:`FULL_SHARE`. Admission by reservation
  (S-LoRA) or by quota (Chameleon) means a workload that needs more than the pool still peaks at
  the pool, so the rule's scale is the *smallest* scale-down at which the peak reaches the pool
  -- below it the peak falls short, above it the demand exceeds the pool and requests wait for
  memory. The search halves the scale from the workload's own (0.5) until the peak falls short,
  then bisects (geometric midpoints) :attr:`Effort.scale_bisections` times and keeps the
  smallest scale that reached the pool; every candidate re-measures the low-load E2E, the SLO
  and the knee. *Which system, at which load* (the paper does not say): :data:`LENGTH_RULE`,
  one of :data:`LENGTH_RULES`:

  - ``"peak-memory-top"`` (default): **Chameleon's** peak at **Chameleon's own knee**, the top
    of the paper's load range. *Why*: the one place the paper says its memory is full is "from
    about 12.5 RPS, memory is mostly full and nothing is cached" (§6.1; ``chameleon.md`` §5),
    under Chameleon, at the top of its sweep (~13 RPS, where Chameleon breaks its SLO at 12.9;
    S-LoRA breaks it at 8.6). Reading the rule's "peak memory equals GPU capacity" as that same
    event -- memory reaches capacity at the experiment's highest load, with the system run
    there -- is the reading under which the paper's set-up sentence and its observation agree;
    nothing in the paper places full memory at S-LoRA's knee. The peak counts cached adapters
    (they are GPU memory in use): the twin's Chameleon never fills the pool with requests alone
    (its quotas bound admission below the pool, so cached adapters keep 15-30 % of it at every
    load, ``benchmarks/chameleon_memory.py``), so "full with nothing cached" is reached at no
    scale tried (x0.1 to x0.5: the requests' own peak stays at or below 0.97 of the pool) and
    cannot be the measure.
  - ``"peak-memory"``: **S-LoRA's** peak at **S-LoRA's knee**, the load the experiment's three
    loads are placed around (the twin's earlier reading, kept as an option).
  - ``"workload"``: the registered workload's own 0.5 (the twin's first reading; at 0.5 the
    pool is full at either knee, but so it is at every scale from about 0.14 up: the rule then
    says nothing, so 0.5 departs from "equals").
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from policies.chameleon import ChameleonScheduler, weighted_request_size
from policies.common import kmeans_1d
from traces.registry import BUILTINS
from twin.config import ConfigError
from twin.reproduce.base import (Knee, Outcome, PaperNumber, RequestMetrics, Row, Runner, knee_search, refine_knee,
                                 low_load_reference, pct_change, pct_text, pick, ratio, row, system_of, yes_no)
from twin.reproduce.report import TOLERANCE
from twin.scenario import RunConfig

# ------------------------------------------------------------------ the paper's set-up (names and definitions)
#: the Chameleon workload (Splitwise-like lengths scaled down; U-P popularity)
WORKLOAD = "chameleon"
#: A40-48GB with Llama-2-7B (Chameleon §6's testbed)
PROFILE = "llama-2-7b_a40_vidur"
ADAPTERS = 100
RANKS = [8, 16, 32, 64, 128]
POPULARITY = "U-P"
#: presets by name (the systems of Chameleon §6)
BASELINE = "slora"
CHAMELEON = "chameleon"
ABLATIONS = {"ChameleonNoSched": "chameleon-nosched", "ChameleonNoCache": "chameleon-nocache"}
CACHE_POLICIES = {"LRU": "chameleon-lru", "FairShare": "chameleon-fairshare", "Chameleon": "chameleon"}
#: TTFT SLO = SLO_X x the mean low-load execution time (Chameleon §6's definition)
SLO_X = 5.0
#: TBT SLO (Chameleon §6's definition), seconds
TBT_SLO_S = 0.150
#: the paper's loads relative to S-LoRA's knee: 6, 8 and 9 RPS over 8.6 RPS (§6.1, conditions)
LOAD_FRACTIONS = {"low": 0.70, "medium": 0.93, "high": 1.05}
#: S-LoRA's asynchronous prefetch of queued requests' adapters (``EngineConfig.slora_prefetch``):
#: Chameleon's S-LoRA baseline has it and Chameleon keeps it (§1, §4.2 "queued-request prefetch";
#: ``chameleon.md`` checklist 1); S-LoRA's own paper scripts leave ``--prefetch`` off (``slora.md``
#: §4), which is the engine's default. Histogram prefetch stays off (the ``chameleon`` preset).
QUEUED_PREFETCH = True
#: how the length scale is set (module docstring): "peak-memory-top" (the paper's rule read at the
#: top of its load range: Chameleon's peak pool use at Chameleon's knee reaches the pool; the
#: deciding fact is §6.1's "from about 12.5 RPS memory is mostly full"), "peak-memory" (the rule
#: read at S-LoRA's knee, the twin's earlier reading) or "workload" (the workload's own scale)
LENGTH_RULES = ("peak-memory-top", "peak-memory", "workload")
LENGTH_RULE = "peak-memory-top"
#: the pool counts as full ("peak memory equals GPU capacity") when its peak use reaches this share
#: (a definition: S-LoRA's reservations stop admission just short of the last slots)
FULL_SHARE = 0.99

# ------------------------------------------------------------------ the paper's numbers (never inputs)
SRC_FIG11 = "Chameleon MICRO'25 §6.1, Fig. 11"
PAPER: dict[str, PaperNumber] = {
    "p99_low": PaperNumber("P99 TTFT vs S-LoRA", "Chameleon, low load (6 RPS)", "%", -14.7, SRC_FIG11),
    "p99_medium": PaperNumber("P99 TTFT vs S-LoRA", "Chameleon, medium load (8 RPS)", "%", -24.6, SRC_FIG11),
    "p99_high": PaperNumber("P99 TTFT vs S-LoRA", "Chameleon, high load (9 RPS)", "%", -80.7, SRC_FIG11),
    "p50_low": PaperNumber("P50 TTFT vs S-LoRA", "Chameleon, low load (6 RPS)", "%", -13.9, SRC_FIG11),
    "p50_medium": PaperNumber("P50 TTFT vs S-LoRA", "Chameleon, medium load (8 RPS)", "%", -20.9, SRC_FIG11),
    "p50_high": PaperNumber("P50 TTFT vs S-LoRA", "Chameleon, high load (9 RPS)", "%", -48.1, SRC_FIG11),
    "knee_slora": PaperNumber("throughput within the TTFT SLO", "S-LoRA", "req/s", 8.6, SRC_FIG11),
    "knee_chameleon": PaperNumber("throughput within the TTFT SLO", "Chameleon", "req/s", 12.9, SRC_FIG11),
    "thr_Chameleon": PaperNumber("throughput within the TTFT SLO vs S-LoRA", "Chameleon", "x", 1.5, SRC_FIG11),
    "thr_ChameleonNoSched": PaperNumber("throughput within the TTFT SLO vs S-LoRA", "ChameleonNoSched", "x", 1.2,
                                        "Chameleon MICRO'25 §6.2 (ablation)"),
    "thr_ChameleonNoCache": PaperNumber("throughput within the TTFT SLO vs S-LoRA", "ChameleonNoCache", "x", 1.05,
                                        "Chameleon MICRO'25 §6.2 (ablation)"),
    "tbt": PaperNumber("P99 TBT within 150 ms", "S-LoRA and Chameleon, high load", "", "yes", SRC_FIG11),
    "tbt_lower": PaperNumber("Chameleon's P99 TBT below S-LoRA's", "high load (9 RPS)", "", "yes", SRC_FIG11),
}
SRC_CACHE = "Chameleon MICRO'25 §6.4 (cache policies)"
PAPER_CACHES: dict[str, PaperNumber] = {
    "LRU": PaperNumber("P99 TTFT vs S-LoRA", "Chameleon-LRU, medium load (8 RPS)", "%", -18.0, SRC_CACHE),
    "FairShare": PaperNumber("P99 TTFT vs S-LoRA", "Chameleon-FairShare, medium load (8 RPS)", "%", -22.0, SRC_CACHE),
    "Chameleon": PaperNumber("P99 TTFT vs S-LoRA", "Chameleon, medium load (8 RPS)", "%", -26.0, SRC_CACHE),
    "rank128": PaperNumber("P99 TTFT of rank-128 requests vs FairShare", "Chameleon, medium load (8 RPS)", "%",
                           -12.0, SRC_CACHE),
    "hits": PaperNumber("requests that hit the adapter cache", "Chameleon (load unspecified; twin: medium)", "%",
                        75.0, "Chameleon MICRO'25 §6.3 (loading)"),
    "miss_ms": PaperNumber("longest adapter-load wait of a miss", "Chameleon (twin: medium load)", "ms", 6.0,
                           "Chameleon MICRO'25 §6.3 (loading)"),
    "slora_ms": PaperNumber("longest adapter-load wait", "S-LoRA (twin: medium load)", "ms", 30.0,
                            "Chameleon MICRO'25 §6.3 (loading)"),
}

#: the schedulers compared at the high load (§6, "schedulers at 9 RPS"): S-LoRA's FIFO, muServe's SJF on
#: S-LoRA (``S-LoRA+SJF``, the paper's baseline list) and Chameleon's
SCHEDULERS = {"FIFO (S-LoRA)": BASELINE, "SJF (S-LoRA+SJF)": "slora+sjf", "Chameleon": CHAMELEON}
#: Chameleon's queues are at most K_max = 4 (§4.3): the size classes of the comparison
SIZE_CLASSES = 4
#: "every class queues below this share of its E2E" (the paper's statement for Chameleon; a threshold it states)
QUEUED_SHARE_BOUND = 0.08
SRC_SCHED = "Chameleon MICRO'25 §6 (schedulers at the high load)"
PAPER_SCHEDULERS: dict[str, PaperNumber] = {
    "slo_FIFO (S-LoRA)": PaperNumber("P99 TTFT within the SLO", "S-LoRA (FIFO), high load (9 RPS)", "", "no",
                                     SRC_SCHED),
    "slo_SJF (S-LoRA+SJF)": PaperNumber("P99 TTFT within the SLO", "S-LoRA+SJF (muServe), high load (9 RPS)", "",
                                        "no", SRC_SCHED),
    "slo_Chameleon": PaperNumber("P99 TTFT within the SLO", "Chameleon, high load (9 RPS; its knee is 12.9 RPS)", "",
                                 "yes", SRC_FIG11),
    "fifo_small": PaperNumber("share of E2E spent queued", "S-LoRA (FIFO), smallest size class, high load", "%", 28.6,
                              SRC_SCHED),
    "chameleon_all": PaperNumber("every size class queued below 8 % of its E2E", "Chameleon, high load", "", "yes",
                                 SRC_SCHED),
}


def size_class_figures(requests) -> dict[str, Any]:
    """Per size class of Chameleon's (§4.3), the queueing of the requests of a point.

    *Classes*: the WRS of every request of the workload (:func:`policies.chameleon.weighted_request_size`
    of its true prompt and output lengths and its adapter's rank, over the workload's maxima) cut into
    :data:`SIZE_CLASSES` classes by Chameleon's own rule: 1-D K-means (:func:`policies.common.kmeans_1d`),
    cut-offs at the midpoints of the sorted centroids. The classes depend on the workload only (rejected
    requests count), so every system's point sorts the same requests into the same classes. Chameleon's
    scheduler forms its queues the same way from *predicted* outputs over recent arrivals; the paper's
    per-class figures are of request classes, which this measures with the true sizes.

    *Per class* (finished requests): ``queued_share_class{c}`` = total time queued (arrival to first
    scheduling, ``queue_s``) / total E2E of the class -- "small requests spend 28.6 % of their E2E time
    queued" read as the class's share of its E2E; ``requests_class{c}``, ``queue_ms_mean_class{c}`` and
    ``ttft_ms_p99_class{c}``; ``queued_share_class{c}_early`` / ``_late``, the same share over the requests
    that arrived before / from the workload's median arrival time on (a queue that grows for the whole
    run -- a load past the knee -- shows it as a rising share); ``size_class_cuts`` (the WRS cut-offs)."""
    rank = np.maximum(requests["adapter_rank"].to_numpy(float), 1.0)
    prompt = requests["prompt_tokens"].to_numpy(float)
    output = requests["output_tokens"].to_numpy(float)
    if not len(prompt):
        return {"size_class_cuts": []}
    wrs = weighted_request_size(prompt, output, rank, max(prompt.max(), 1.0), max(output.max(), 1.0), rank.max())
    centroids, _ = kmeans_1d(wrs, SIZE_CLASSES)
    cuts = (centroids[1:] + centroids[:-1]) / 2
    cls = np.searchsorted(cuts, wrs, side="right")
    done = (requests["outcome"] == "finished").to_numpy(bool)
    queue = requests["queue_s"].to_numpy(float)
    e2e = requests["e2e_s"].to_numpy(float)
    ttft = requests["ttft_s"].to_numpy(float)
    arrival = requests["arrival_s"].to_numpy(float)
    late = arrival >= np.median(arrival)

    def share(m: np.ndarray) -> float:
        total = float(e2e[m].sum())
        return float(queue[m].sum()) / total if total > 0 else float("nan")

    out: dict[str, Any] = {"size_class_cuts": [float(c) for c in cuts]}
    for j in range(len(centroids)):
        m = done & (cls == j)
        c = j + 1
        out[f"requests_class{c}"] = int(m.sum())
        out[f"queued_share_class{c}"] = share(m)
        out[f"queued_share_class{c}_early"] = share(m & ~late)
        out[f"queued_share_class{c}_late"] = share(m & late)
        out[f"queue_ms_mean_class{c}"] = float(queue[m].mean()) * 1000.0 if m.any() else float("nan")
        out[f"ttft_ms_p99_class{c}"] = float(np.percentile(ttft[m], 99)) * 1000.0 if m.any() else float("nan")
    return out


#: the per-class figures of a point (:meth:`Runner.point` ``request_metrics``; the name keys the cache)
CLASS_METRICS = RequestMetrics(f"chameleon-size-classes-k{SIZE_CLASSES}-v2", size_class_figures)


@dataclasses.dataclass(frozen=True)
class Effort:
    """How long and how finely a run measures: seconds of arrivals per point, knee bisections, low-load requests."""

    duration_s: float
    bisections: int
    low_load_requests: int
    #: geometric bisections of the length-scale search (:func:`length_scale_search`)
    scale_bisections: int = 4
    #: the knees of the throughput rows are bisected further, until each is bracketed within this share of
    #: itself (:func:`twin.reproduce.base.refine_knee`; None: not refined): after ``bisections`` the brackets
    #: are one grid step of ``start * 2**-bisections`` (1.9 % of the knee), as wide as the ratios' gaps
    ratio_resolution: float | None = None


FULL = Effort(duration_s=600.0, bisections=5, low_load_requests=200, scale_bisections=4, ratio_resolution=0.005)
QUICK = Effort(duration_s=120.0, bisections=2, low_load_requests=60, scale_bisections=2)


def workload_length_scale(trace: str) -> float:
    """The registered workload's own ``length_scale`` (1.0 when it has none)."""
    spec = BUILTINS.get(trace)
    return float(spec.defaults.get("length_scale", 1.0)) if spec is not None else 1.0


def at_scale(run: RunConfig, scale: float) -> RunConfig:
    """``run`` with its lengths scaled by ``scale`` (the workload option ``length_scale``)."""
    opts = [(k, v) for k, v in run.trace_options if k != "length_scale"]
    return dataclasses.replace(run, trace_options=[*opts, ("length_scale", float(scale))])


def slo_reference(runner: Runner, run: RunConfig, base: str, effort: Effort) -> dict[str, Any]:
    """At ``run``'s lengths: S-LoRA's low-load run, the TTFT SLO (``SLO_X`` x its mean E2E) and
    ``knee_of(preset)``, the knee search of any preset on P99 TTFT <= SLO."""
    low = low_load_reference(runner, run, base, effort.low_load_requests)
    slo_s = SLO_X * low["e2e_ms_mean"] / 1000.0
    start = 1000.0 / low["e2e_ms_mean"]  # one request in flight on average at low-load service time

    def met(s: dict[str, Any]) -> bool:
        return s["ttft_ms_p99"] is not None and s["ttft_ms_p99"] <= slo_s * 1000.0

    def knee_of(preset: str) -> Knee:
        return knee_search(lambda r: runner.point(run, preset, r, slo_s=slo_s), met, start, effort.bisections)

    def refined(preset: str, knee: Knee, resolution: float) -> Knee:
        return refine_knee(lambda r: runner.point(run, preset, r, slo_s=slo_s), met, knee, resolution)

    return {"low": low, "slo_s": slo_s, "knee_of": knee_of, "refined": refined}


def memory_at_knee(runner: Runner, run: RunConfig, preset: str, ref: dict[str, Any]) -> tuple[Knee, dict[str, Any]]:
    """``preset``'s knee (on ``ref``'s SLO) and its run at that knee with the pool's use recorded
    (:meth:`Runner.point` ``memory=True``; empty when even the lowest probe failed)."""
    knee = ref["knee_of"](preset)
    mem = runner.point(run, preset, knee.rate, slo_s=ref["slo_s"], memory=True) if knee.rate > 0 else {}
    return knee, mem


def reference(runner: Runner, run: RunConfig, base: str, effort: Effort) -> dict[str, Any]:
    """At ``run``'s lengths: S-LoRA's low-load run, the TTFT SLO (``SLO_X`` x its mean E2E),
    S-LoRA's knee on P99 TTFT <= SLO, and the peak pool use at that knee (KV, and KV plus adapters)."""
    ref = slo_reference(runner, run, base, effort)
    knee, mem = memory_at_knee(runner, run, base, ref)
    return {**ref, "knee": knee, "kv_use_peak_at_knee": mem.get("kv_use_peak"),
            "mem_use_peak_at_knee": mem.get("mem_use_peak")}


@dataclasses.dataclass(frozen=True)
class ScaleSearch:
    """The length scale a rule gives and every scale tried: ``(scale, peak pool use at the
    measured system's knee, that knee in req/s)``."""

    scale: float
    probes: list[tuple[float, float, float]]


def length_scale_search(runner: Runner, run: RunConfig, base: str, effort: Effort, start: float,
                        system: str | None = None) -> ScaleSearch:
    """The paper's set-up rule (§6.1): lengths "scaled down by a constant factor so that peak
    memory equals GPU capacity", read at a knee (module docstring, :data:`LENGTH_RULE`).
    ``full(s)``: the peak pool use (KV + resident adapters) of ``system`` (default ``base``,
    S-LoRA) at its own knee -- on the SLO defined from ``base``'s low-load run -- with lengths x
    ``s``, reaches :data:`FULL_SHARE`. From ``start``: halve while full (double while not, up to
    1: the trace unscaled), then ``effort.scale_bisections`` geometric bisections; the smallest
    scale found full (or 1.0 when even the unscaled trace leaves the pool short of full)."""
    probes: list[tuple[float, float, float]] = []
    measured = base if system is None else system

    def full(s: float) -> bool:
        r = at_scale(run, s)
        knee, mem = memory_at_knee(runner, r, measured, slo_reference(runner, r, base, effort))
        peak = mem.get("mem_use_peak")
        probes.append((s, float("nan") if peak is None else float(peak), knee.rate))
        return peak is not None and peak >= FULL_SHARE

    s = float(start)
    if full(s):
        hi, lo = s, None
        for _ in range(8):
            s /= 2.0
            if full(s):
                hi = s
            else:
                lo = s
                break
        if lo is None:
            return ScaleSearch(hi, probes)
    else:
        lo, hi = s, None
        while s < 1.0:
            s = min(2.0 * s, 1.0)
            if full(s):
                hi = s
                break
            lo = s
        if hi is None:
            return ScaleSearch(1.0, probes)
    for _ in range(effort.scale_bisections):
        mid = math.sqrt(lo * hi)
        if full(mid):
            hi = mid
        else:
            lo = mid
    return ScaleSearch(hi, probes)


def experiment(runner: Runner, quick: bool, length_rule: str | None = None) -> dict[str, Any]:
    """The shared set-up: scenario (with the length scale of ``length_rule``, default
    :data:`LENGTH_RULE`), SLO and S-LoRA's knee (the runner remembers the runs, so both
    reproductions of a process share them)."""
    rule = LENGTH_RULE if length_rule is None else length_rule
    if rule not in LENGTH_RULES:
        raise ConfigError(f"chameleon reproduction: unknown length rule {rule!r}; use one of {', '.join(LENGTH_RULES)}")
    effort = QUICK if quick else FULL
    subs: dict[str, str] = {}
    run = RunConfig(trace=pick("trace", WORKLOAD, WORKLOAD, subs), profile=pick("profile", PROFILE, PROFILE, subs),
                    adapters=ADAPTERS, ranks=list(RANKS), popularity=POPULARITY, duration=effort.duration_s, seed=0,
                    slora_prefetch=QUEUED_PREFETCH)
    base = pick("preset", BASELINE, BASELINE, subs)
    cham = pick("preset", CHAMELEON, CHAMELEON, subs)
    own = workload_length_scale(run.trace)
    measured = {"peak-memory": base, "peak-memory-top": cham}.get(rule)
    search = (length_scale_search(runner, run, base, effort, own, system=measured) if measured is not None
              else ScaleSearch(own, []))
    run = at_scale(run, search.scale)
    ref = reference(runner, run, base, effort)
    knee = ref["knee"]
    loads = {k: f * knee.rate for k, f in LOAD_FRACTIONS.items()}
    return {"run": run, "effort": effort, "baseline": base, "slo_s": ref["slo_s"], "low": ref["low"], "knee": knee,
            "kv_use_peak_at_knee": ref["kv_use_peak_at_knee"], "mem_use_peak_at_knee": ref["mem_use_peak_at_knee"],
            "length_rule": rule, "length_rule_system": measured, "length_scale": search.scale,
            "workload_length_scale": own,
            "scale_probes": search.probes,
            "knee_of": ref["knee_of"], "refined": ref["refined"], "loads": loads, "substitutions": subs}


def _setup(e: dict[str, Any], presets: list[str]) -> dict[str, Any]:
    run: RunConfig = e["run"]
    return {"workload": run.trace, "profile": run.profile, "adapters": run.adapters, "ranks": run.ranks,
            "popularity": run.popularity, "queued_prefetch": run.slora_prefetch, "duration_s": run.duration, "seed": run.seed,
            "presets": {p: system_of(p) for p in presets},
            "low_load_rps": e["low"]["rps"], "low_load_e2e_ms_mean": e["low"]["e2e_ms_mean"],
            "ttft_slo_s": e["slo_s"], "tbt_slo_s": TBT_SLO_S, "slora_knee_rps": e["knee"].rate,
            "slora_knee_bracket": [e["knee"].rate, e["knee"].failed], "loads_rps": e["loads"],
            "kv_use_peak_at_slora_knee": e["kv_use_peak_at_knee"],
            "mem_use_peak_at_slora_knee": e["mem_use_peak_at_knee"],
            "length_rule": e["length_rule"], "length_rule_system": e["length_rule_system"],
            "length_scale": e["length_scale"],
            "length_scale_probes": [list(p) for p in e["scale_probes"]],
            "substitutions": e["substitutions"]}


def _memory_note(e: dict[str, Any]) -> str:
    peaks = (f"at S-LoRA's knee the pool peaks at {pct_text(e['mem_use_peak_at_knee'])} of its slots with adapters, "
             f"{pct_text(e['kv_use_peak_at_knee'])} in KV alone")
    if e["length_rule"] == "workload":
        return (f"lengths: the {e['run'].trace} workload's own length scale {e['length_scale']:g} (Splitwise-like "
                f"lengths scaled down); {peaks}.")
    where = {"peak-memory": "S-LoRA's", "peak-memory-top": "Chameleon's"}[e["length_rule"]]
    tried = ", ".join(f"{s:.3g} ({'-' if not math.isfinite(p) else f'{100 * p:.1f} %'} at {k:.3g} req/s)"
                      for s, p, k in e["scale_probes"])
    return (f"lengths: Splitwise-like x {e['length_scale']:.3g}, the paper's rule (scaled down so that peak memory "
            f"equals GPU capacity, rule {e['length_rule']!r}) searched at {where} knee: the smallest length scale (the "
            f"lengths scaled down the furthest) at which {where} peak pool use (KV + adapters) at its own knee still "
            f"reaches {100 * FULL_SHARE:g} %; tried "
            f"(scale: peak at that knee): {tried}; {peaks}.")


def _pool_note(label: str, pts: dict[str, dict[str, Any]]) -> str:
    """How the pool is used at each load: mean use, the cached (idle) adapters' mean share, the
    requests' own peak (KV + running adapters) and the requests that found their adapter resident."""
    cells = [f"{ld} {pct_text(s.get('mem_use_mean'))} in use, {pct_text(s.get('cache_share_mean'))} cached, "
             f"requests' peak "
             f"{pct_text(s.get('mem_demand_peak'))}, hits {pct_text(s.get('adapter_hit_rate_requests'))}"
             for ld, s in pts.items()]
    return f"pool by load, {label}: " + "; ".join(cells)


def _rank_note(pair: tuple[dict[str, Any], dict[str, Any]]) -> str:
    """P99 TTFT by rank at the high load, S-LoRA then Chameleon (where the tail comes from)."""
    b, c = pair
    cells = [f"rank {r}: {b.get(f'ttft_ms_p99_rank{r}', float('nan')) / 1000:.1f} / "
             f"{c.get(f'ttft_ms_p99_rank{r}', float('nan')) / 1000:.1f} s" for r in RANKS]
    return "P99 TTFT by adapter rank at the high load, S-LoRA / Chameleon: " + ", ".join(cells) + "."


def _load_note(label: str, s: dict[str, Any]) -> str:
    return (f"{label}: {s['adapter_loads_from_disk']} adapter loads from disk and {s['adapter_loads_from_cpu']} from "
            f"host memory, host link {100 * (s.get('link_utilization') or 0):.1f} % busy")


def _tag(points: list[dict[str, Any]], what: str, s: dict[str, Any], **extra: Any) -> None:
    points.append({**s, "experiment": what, **extra})


def run_fig11(runner: Runner, quick: bool) -> Outcome:
    """P50/P99 TTFT vs S-LoRA at 0.70/0.93/1.05 of S-LoRA's knee; throughput within the SLO of
    Chameleon, ChameleonNoSched and ChameleonNoCache relative to S-LoRA's."""
    e = experiment(runner, quick)
    run, slo_s, base = e["run"], e["slo_s"], e["baseline"]
    subs = e["substitutions"]
    cham = pick("preset", CHAMELEON, CHAMELEON, subs)
    points: list[dict[str, Any]] = []
    rows: list[Row] = []
    got: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
    for load, rps in e["loads"].items():
        b = runner.point(run, base, rps, slo_s=slo_s, memory=True)
        c = runner.point(run, cham, rps, slo_s=slo_s, memory=True)
        _tag(points, "loads", b, load=load)
        _tag(points, "loads", c, load=load)
        got[load] = (b, c)
    for q in ("p99", "p50"):
        for load, (b, c) in got.items():
            rows.append(row(PAPER[f"{q}_{load}"], pct_change(c[f"ttft_ms_{q}"], b[f"ttft_ms_{q}"])))
    tbt_ok = all(x["itl_ms_p99"] is not None and x["itl_ms_p99"] <= TBT_SLO_S * 1000.0 for x in got["high"])
    knees = {"S-LoRA": e["knee"]}
    presets = {"Chameleon": cham, **{k: pick("preset", v, v, subs) for k, v in ABLATIONS.items()}}
    for label, preset in presets.items():
        knees[label] = e["knee_of"](preset)
    res = e["effort"].ratio_resolution
    if res is not None:  # the throughput rows' knees, bisected until they resolve the ratios (the loads stay)
        knees = {label: e["refined"](base if label == "S-LoRA" else presets[label], k, res)
                 for label, k in knees.items()}
    for label, k in knees.items():
        for r_, met in k.probes:
            points.append({"experiment": "knee", "system": label, "rps": r_, "met_slo": met})
    rows.append(row(PAPER["knee_slora"], knees["S-LoRA"].rate, 2))
    rows.append(row(PAPER["knee_chameleon"], knees["Chameleon"].rate, 2))
    for label in presets:
        rows.append(ratio_row(PAPER[f"thr_{label}"], knees[label], knees["S-LoRA"]))
    rows.append(row(PAPER["tbt"], yes_no(tbt_ok)))
    b_hi, c_hi = got["high"]
    rows.append(row(PAPER["tbt_lower"], yes_no(c_hi["itl_ms_p99"] is not None and b_hi["itl_ms_p99"] is not None
                                               and c_hi["itl_ms_p99"] < b_hi["itl_ms_p99"])))
    setup = _setup(e, [base, *presets.values()])
    setup["knees_rps"] = {k: v.rate for k, v in knees.items()}
    notes = [f"TTFT SLO {slo_s:.2f} s = {SLO_X:g} x the mean E2E of {base} at {e['low']['rps']:.3g} req/s "
             f"({e['low']['e2e_ms_mean'] / 1000:.2f} s); S-LoRA's knee {e['knee'].rate:.3g} req/s "
             f"(first failing probe {e['knee'].failed if e['knee'].failed is None else round(e['knee'].failed, 3)} "
             f"req/s); the rows' loads are the paper's fractions of its S-LoRA knee (6 / 8 / 9 of 8.6 RPS), run at "
             + " / ".join(f"{f:g} x {e['knee'].rate:.3g} = {f * e['knee'].rate:.3g}" for f in LOAD_FRACTIONS.values())
             + " req/s in the twin.",
             _memory_note(e), _rank_note(got["high"]),
             _pool_note("S-LoRA", {k: v[0] for k, v in got.items()}) + "; "
             + _pool_note("Chameleon", {k: v[1] for k, v in got.items()})[len("pool by load, "):] + "."]
    if res is not None:
        notes.append(f"throughput rows: each knee bisected until its passing and first failing rates are within "
                     f"{100 * res:g} % (the loads above keep the first bracket), passing-failing: "
                     + ", ".join(f"{k} {v.rate:.4g}-{v.failed:.4g}" if v.failed is not None else f"{k} >= {v.rate:.4g}"
                                 for k, v in knees.items())
                     + " req/s; so each ratio to S-LoRA lies within "
                     + ", ".join(f"{k} {lo:.3f}-{hi:.3f}" for k in presets
                                 for lo, hi in [ratio_bracket(knees[k], knees["S-LoRA"])])
                     + " (a row is 'unresolved' when the tolerance test differs across its range).")
    if quick:  # the knees share a coarse probe grid: their ratios are not resolved
        brackets = ", ".join(f"{k} {v.rate:.3g}-{v.failed:.3g}" if v.failed is not None else f"{k} >= {v.rate:.3g}"
                             for k, v in knees.items())
        notes.append(f"--quick: each knee is bracketed by {e['effort'].bisections} bisections only (passing-failing "
                     f"rate: {brackets} req/s), so knees within one bracket read the same rate and the throughput "
                     f"ratios are not resolved; run without --quick to compare them with the paper.")
    return Outcome("chameleon-fig11", "Chameleon vs S-LoRA: TTFT at three loads and throughput within the SLO "
                   "(Fig. 11)", rows, setup, points, notes)


def ratio_bracket(knee: Knee, base: Knee) -> tuple[float, float]:
    """The range of ``knee``'s true rate over ``base``'s that the two brackets allow: from the passing rate over
    ``base``'s first failing one to the first failing rate over ``base``'s passing one (inf without a failing
    rate; NaN when ``base`` never passed)."""
    if base.rate <= 0:
        return float("nan"), float("nan")
    lo = knee.rate / base.failed if base.failed is not None else 0.0
    hi = knee.failed / base.rate if knee.failed is not None else float("inf")
    return lo, hi


def ratio_row(paper: PaperNumber, knee: Knee, base: Knee) -> Row:
    """The row of a throughput ratio (the passing rates' ratio), graded ``unresolved`` when the tolerance test
    (:data:`twin.reproduce.report.TOLERANCE`) would answer differently at the two ends of
    :func:`ratio_bracket`: the knees' brackets then do not say whether the twin meets the paper's number."""
    r = row(paper, ratio(knee.rate, base.rate), 2)
    lo, hi = ratio_bracket(knee, base)
    if isinstance(paper.value, (int, float)) and math.isfinite(lo):
        tol = TOLERANCE[paper.unit]
        if (abs(lo - paper.value) <= tol) != (abs(hi - paper.value) <= tol) or (lo < paper.value - tol < hi and
                                                                               lo < paper.value + tol < hi):
            r.verdict_override = f"unresolved: the knees bracket the ratio within {lo:.3f}-{hi:.3f}"
    return r


def mark_unexercised_caches(rows: list[Row], got: dict[str, dict[str, Any]]) -> dict[str, int]:
    """The adapter evictions of each cache policy's run; when none of them evicted, the caches never
    chose a victim -- the runs are the same and their rows compare nothing -- so every row is graded
    ``n/a: no cache evicted`` whatever its value (the three rows read -17.5 against the paper's -18 / -22 /
    -26 and passed, with no eviction at all)."""
    evictions = {label: int(s.get("adapter_evictions", 0) or 0) for label, s in got.items()}
    if not any(evictions.values()):
        for r in rows:
            r.verdict_override = "n/a: no cache evicted"
    return evictions


def run_caches(runner: Runner, quick: bool) -> Outcome:
    """LRU, FairShare and Chameleon caches (with Chameleon's scheduler) at the medium load: P99
    TTFT vs S-LoRA; Chameleon's hit rate and longest miss wait, S-LoRA's longest load wait."""
    e = experiment(runner, quick)
    run, slo_s, base = e["run"], e["slo_s"], e["baseline"]
    subs = e["substitutions"]
    rps = e["loads"]["medium"]
    b = runner.point(run, base, rps, slo_s=slo_s, memory=True)
    points: list[dict[str, Any]] = []
    _tag(points, "medium", b, system="S-LoRA")
    rows: list[Row] = []
    got: dict[str, dict[str, Any]] = {}
    for label, preset in CACHE_POLICIES.items():
        s = runner.point(run, pick("preset", preset, preset, subs), rps, slo_s=slo_s, memory=True)
        got[label] = s
        _tag(points, "medium", s, system=label)
        rows.append(row(PAPER_CACHES[label], pct_change(s["ttft_ms_p99"], b["ttft_ms_p99"])))
    top = max(RANKS)
    rows.append(row(PAPER_CACHES["rank128"], pct_change(got["Chameleon"].get(f"ttft_ms_p99_rank{top}"),
                                                        got["FairShare"].get(f"ttft_ms_p99_rank{top}"))))
    evictions = mark_unexercised_caches(rows, got)
    hits = got["Chameleon"].get("adapter_hit_rate_requests")
    rows.append(row(PAPER_CACHES["hits"], None if hits is None else 100.0 * hits))
    rows.append(row(PAPER_CACHES["miss_ms"], got["Chameleon"]["miss_load_ms_max"]))
    rows.append(row(PAPER_CACHES["slora_ms"], b["miss_load_ms_max"]))
    setup = _setup(e, [base, *CACHE_POLICIES.values()])
    setup["medium_rps"] = rps
    notes = [f"medium load = {LOAD_FRACTIONS['medium']:g} x S-LoRA's knee {e['knee'].rate:.3g} req/s = {rps:.3g} "
             f"req/s; TTFT SLO {slo_s:.2f} s.",
             "; ".join([_load_note("S-LoRA", b), _load_note("Chameleon", got["Chameleon"])]) +
             " (a load from disk is an adapter's first use in the twin; the paper's adapters sit in host memory).",
             _pool_note("medium load", {"S-LoRA": b, **got}) + ".",
             "adapter evictions: " + ", ".join(f"{k} {v}" for k, v in evictions.items()) +
             (" -- the pool holds every adapter at this load, so the three caches never choose a victim and their "
              "rows are the same run; the cache policies are not compared here (n/a), whatever the tolerance "
              "says" if not any(evictions.values()) else "") + "."]
    return Outcome("chameleon-caches", "Chameleon's cache policies at the medium load (§6.3-6.4)", rows, setup,
                   points, notes)


def run_schedulers(runner: Runner, quick: bool) -> Outcome:
    """FIFO (S-LoRA), SJF (S-LoRA+SJF) and Chameleon's scheduler at the high load (1.05 x S-LoRA's knee):
    whether each keeps its P99 TTFT within the SLO, and how much of their E2E the requests of each of
    Chameleon's size classes spend queued (:func:`size_class_figures`). SJF predicts outputs with
    Chameleon's predictor accuracy (the preset's default), so both size-aware schedulers see the same
    predictions' quality."""
    e = experiment(runner, quick)
    run, slo_s = e["run"], e["slo_s"]
    subs = e["substitutions"]
    rps = e["loads"]["high"]
    accuracy = float(ChameleonScheduler().get_params()["accuracy"])
    got: dict[str, dict[str, Any]] = {}
    points: list[dict[str, Any]] = []
    for label, preset in SCHEDULERS.items():
        preset = pick("preset", preset, preset, subs)
        s = runner.point(run, preset, rps, slo_s=slo_s, request_metrics=CLASS_METRICS,
                         accuracy=accuracy if preset == "slora+sjf" else None)
        got[label] = s
        _tag(points, "high", s, system=label)
    # FIFO and Chameleon at the other loads: where their queueing comes from (the knee)
    by_load: dict[str, dict[str, dict[str, Any]]] = {"FIFO (S-LoRA)": {}, "Chameleon": {}}
    for label, loads in by_load.items():
        preset = pick("preset", SCHEDULERS[label], SCHEDULERS[label], subs)
        for load, r in e["loads"].items():
            loads[load] = got[label] if load == "high" else runner.point(run, preset, r, slo_s=slo_s,
                                                                          request_metrics=CLASS_METRICS)
            if load != "high":
                _tag(points, load, loads[load], system=label)
    rows: list[Row] = []
    for label, s in got.items():
        rows.append(row(PAPER_SCHEDULERS[f"slo_{label}"],
                        yes_no(s["ttft_ms_p99"] is not None and s["ttft_ms_p99"] <= slo_s * 1000.0)))
    k = len(got["Chameleon"]["size_class_cuts"]) + 1
    fifo = got["FIFO (S-LoRA)"]
    rows.append(row(PAPER_SCHEDULERS["fifo_small"], 100.0 * fifo["queued_share_class1"]))
    cham = [got["Chameleon"][f"queued_share_class{c}"] for c in range(1, k + 1)]
    rows.append(row(PAPER_SCHEDULERS["chameleon_all"],
                    yes_no(all(math.isfinite(x) and x < QUEUED_SHARE_BOUND for x in cham))))
    setup = _setup(e, [pick("preset", p, p, subs) for p in SCHEDULERS.values()])
    setup.update({"high_rps": rps, "size_classes": k, "size_class_cuts": got["Chameleon"]["size_class_cuts"],
                  "sjf_predictor_accuracy": accuracy})
    notes = [f"high load = {LOAD_FRACTIONS['high']:g} x S-LoRA's knee {e['knee'].rate:.3g} req/s = {rps:.3g} req/s; "
             f"TTFT SLO {slo_s:.2f} s; P99 TTFT " + ", ".join(f"{lb} {s['ttft_ms_p99'] / 1000:.1f} s"
                                                              for lb, s in got.items()) + ".",
             f"size classes: Chameleon's WRS of each request's true lengths and rank, cut by K-means into {k} "
             f"(cut-offs {', '.join(f'{c:.3g}' for c in setup['size_class_cuts'])}; requests per class "
             + "/".join(str(fifo[f"requests_class{c}"]) for c in range(1, k + 1)) + ").",
             "share of E2E queued by size class, small to large: " + "; ".join(
                 f"{lb} " + " / ".join(pct_text(s[f"queued_share_class{c}"]) for c in range(1, k + 1))
                 for lb, s in got.items()) + ".",
             "the same, requests that arrived in the first / second half of the run: " + "; ".join(
                 f"{lb} " + " / ".join(f"{pct_text(s[f'queued_share_class{c}_early'])} -> "
                                       f"{pct_text(s[f'queued_share_class{c}_late'])}" for c in range(1, k + 1))
                 for lb, s in got.items()) + " (a share that rises through the run: a queue that grows for the "
             "whole run, i.e. a load past that system's knee, where the share depends on the run's length).",
             "FIFO (S-LoRA)'s smallest class by load (x S-LoRA's knee): " + ", ".join(
                 f"{ld} ({LOAD_FRACTIONS[ld]:g}) {pct_text(s['queued_share_class1'])} queued, P99 TTFT "
                 f"{s['ttft_ms_p99'] / 1000:.1f} s" for ld, s in by_load["FIFO (S-LoRA)"].items())
             + "; Chameleon's largest share of any class by load: " + ", ".join(
                 f"{ld} {pct_text(max(s[f'queued_share_class{c}'] for c in range(1, k + 1)))}, P99 TTFT "
                 f"{s['ttft_ms_p99'] / 1000:.1f} s" for ld, s in by_load["Chameleon"].items()) + ".",
             "P99 TTFT by size class, small to large (s): " + "; ".join(
                 f"{lb} " + " / ".join(f"{s[f'ttft_ms_p99_class{c}'] / 1000:.1f}" for c in range(1, k + 1))
                 for lb, s in got.items()) + "."]
    if quick and e["knee"].failed is not None:  # the high load sits on a coarse bracket of the knee
        notes.append(f"--quick: S-LoRA's knee is bracketed by {e['effort'].bisections} bisections only "
                     f"({e['knee'].rate:.3g}-{e['knee'].failed:.3g} req/s), so the high load may still sit below it; "
                     f"run without --quick to compare with the paper.")
    return Outcome("chameleon-schedulers", "FIFO, SJF and Chameleon's scheduler at the high load: SLO and queueing "
                   "by size class (§6)", rows, setup, points, notes)


def figure_fig11(outcome: Outcome):
    """P50/P99 TTFT of S-LoRA and Chameleon at the three loads; throughput within the SLO per system."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4), layout="tight")
    (a, b) = fig.subplots(1, 2)
    pts = [p for p in outcome.points if p["experiment"] == "loads"]
    loads = list(LOAD_FRACTIONS)
    x = np.arange(len(loads))
    for i, (preset, q) in enumerate([(p, q) for p in dict.fromkeys(p["preset"] for p in pts) for q in ("p50", "p99")]):
        ys = [next(p[f"ttft_ms_{q}"] for p in pts if p["preset"] == preset and p["load"] == ld) / 1000 for ld in loads]
        a.bar(x + (i - 1.5) * 0.2, ys, 0.2, label=f"{preset} {q.upper()}")
    a.axhline(outcome.setup["ttft_slo_s"], color="k", ls="--", lw=1, label="TTFT SLO")
    a.set_xticks(x, [f"{ld}\n{outcome.setup['loads_rps'][ld]:.2f} req/s" for ld in loads])
    a.set_ylabel("TTFT (s)")
    a.set_title("TTFT at 0.70 / 0.93 / 1.05 of S-LoRA's knee")
    a.legend(fontsize=8)
    knees = outcome.setup["knees_rps"]
    b.bar(list(knees), list(knees.values()), color="tab:green")
    b.set_ylabel("req/s")
    b.set_title("throughput within the TTFT SLO (P99)")
    b.tick_params(axis="x", labelsize=8)
    fig.suptitle(f"{outcome.name}: {outcome.setup['workload']} on {outcome.setup['profile']}")
    return fig


def figure_caches(outcome: Outcome):
    """P99 TTFT and request hit rate per cache policy at the medium load."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4), layout="tight")
    (a, b) = fig.subplots(1, 2)
    pts = outcome.points
    names = [p["system"] for p in pts]
    a.bar(names, [p["ttft_ms_p99"] / 1000 for p in pts], color="tab:blue")
    a.set_ylabel("P99 TTFT (s)")
    a.set_title(f"medium load ({outcome.setup['medium_rps']:.2f} req/s)")
    b.bar(names, [100 * (p.get("adapter_hit_rate_requests") or 0) for p in pts], color="tab:orange")
    b.set_ylabel("requests hitting a resident adapter (%)")
    fig.suptitle(f"{outcome.name}: {outcome.setup['workload']} on {outcome.setup['profile']}")
    return fig


def figure_schedulers(outcome: Outcome):
    """Share of E2E queued and P99 TTFT per size class, per scheduler, at the high load."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4), layout="tight")
    (a, b) = fig.subplots(1, 2)
    pts = [p for p in outcome.points if p["experiment"] == "high"]
    k = outcome.setup["size_classes"]
    x = np.arange(1, k + 1)
    w = 0.8 / max(len(pts), 1)
    for i, p in enumerate(pts):
        a.bar(x + (i - (len(pts) - 1) / 2) * w, [100 * p[f"queued_share_class{c}"] for c in x], w, label=p["system"])
        b.bar(x + (i - (len(pts) - 1) / 2) * w, [p[f"ttft_ms_p99_class{c}"] / 1000 for c in x], w, label=p["system"])
    a.axhline(100 * QUEUED_SHARE_BOUND, color="k", ls=":", lw=1, label="8 %")
    a.set_ylabel("share of E2E queued (%)")
    b.axhline(outcome.setup["ttft_slo_s"], color="k", ls="--", lw=1, label="TTFT SLO")
    b.set_ylabel("P99 TTFT (s)")
    for ax in (a, b):
        ax.set_xticks(x, [f"class {c}" for c in x])
        ax.set_xlabel("Chameleon size class (small to large)")
        ax.legend(fontsize=8)
    fig.suptitle(f"{outcome.name}: {outcome.setup['high_rps']:.2f} req/s (1.05 x S-LoRA's knee), "
                 f"{outcome.setup['workload']} on {outcome.setup['profile']}")
    return fig
