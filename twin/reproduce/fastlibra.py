"""FastLibra (Zhang et al., 2025): ``fastlibra-ttft`` and ``fastlibra-ablation``.

**The paper's experiment** (``shared/refs/fastlibra.md`` §7-9): Llama-7B on one 64 GB NPU,
20/50/100 LoRAs of rank 32 or 64, three workloads (chatbot: LMSYS-like multi-turn; translation
and personal agent: Azure Functions arrivals); baselines vLLM (static 20/80 LoRA/KV split,
prefix caching, LRU swapping to host, block 32) and S-LoRA (unified pool, no history-KV reuse).
Average TTFT and TPOT are averaged over 10 sending rates from 0 up to FastLibra's peak
throughput; peak throughput is the largest rate with TTFT < 500 ms (the mean, the likely
reading).

**In the twin** (names and definitions only; none is a paper result):

* workloads :data:`WORKLOADS` by name; where the paper's named workload is not registered, the
  stand-in of :data:`STAND_INS` is used (recorded in ``setup["substitutions"]``) with the
  options of :data:`STAND_IN_OPTIONS`;
* profile :data:`PROFILE` with :data:`GPU_MEM_GB` (the paper's NPU is not modelled: the A100, the
  closest in FP16 compute, with the NPU's 64 GB of memory);
* presets :data:`FASTLIBRA`, :data:`VLLM`, :data:`SLORA` and the ablations :data:`ABLATIONS`;
* peak throughput: :func:`twin.reproduce.base.knee_search` on mean TTFT < :data:`TTFT_LIMIT_S`;
* the rates: ``k/RATES x`` FastLibra's peak, ``k = 1..RATES`` (10 in the full run, as the paper);
* every point simulates :data:`WARMUP_S` of arrivals first and measures the requests that arrive
  after it (the paper's server runs ~1,800 s, §7; a twin run starts with empty HBM).

**Why the ablations differ little** (measured; the notes of ``fastlibra-ablation`` print the
counters of :meth:`policies.fastlibra.FastLibraCache.stats` per workload): translation has no
history KV and its 50 LoRAs fit in HBM, so the swapper never swaps out and the four variants run
the same; WoL's ``LoRA_Eval`` multiplies LoRA nodes only (fastlibra.md §4), so it can change a
swap-out only when a LoRA and a KV node are both candidates with the LoRA valued lower -- but a
LoRA's probability is at least the sum of its KV nodes' and it was used at least as recently, so
KV nodes leave first, and when ``LoRA_Eval > 1`` (too few LoRAs in HBM) the KV nodes are already
gone; WoM swaps out LoRAs whose KV stays (invalid KVs) where the tree would not, and WoS's LRU
changes many choices, but each changed choice costs one asynchronous swap-in of ~10 ms later, a
small share of the TTFT. The exceptions are on the agent workload, where conversations are long: WoM's
peak is 15.9 % lower and WoS's 4.5 %, so FastLibra's top rates are past their peaks, where their queues
grow (WoM's collapses) and the TTFT rows are set by those points (README.md, "Why the FastLibra
ablations stay close...").
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from twin.reproduce.base import (Outcome, PaperNumber, Row, Runner, knee_search, pct_change, pct_text, pick, ratio,
                                 row, system_of, yes_no)
from twin.scenario import RunConfig

# ------------------------------------------------------------------ the paper's set-up (names and definitions)
#: scenario -> the paper's workload name
WORKLOADS = {"chatbot": "fastlibra-chatbot", "translation": "fastlibra-translation", "agent": "fastlibra-agent"}
#: >>> STAND-INS until the paper's named workloads are registered (switch by registering them) <<<
STAND_INS = {"fastlibra-chatbot": "multiturn-synth", "fastlibra-translation": "sharegpt-synth",
             "fastlibra-agent": "multiturn-synth"}
#: options given to a stand-in only: 50 LoRAs of ranks 32/64 (the paper's middle count), the
#: agent's conversations longer than the chatbot's (the paper: "the longest conversations")
STAND_IN_OPTIONS: dict[str, dict[str, Any]] = {
    "fastlibra-chatbot": {"adapters": 50, "ranks": [32, 64]},
    "fastlibra-translation": {"adapters": 50, "ranks": [32, 64]},
    "fastlibra-agent": {"adapters": 50, "ranks": [32, 64], "trace_options": [("mean_turns", 6.0)]},
}
#: the paper's NPU (256 TFLOPS FP16, 64 GB HBM) is not modelled: the closest profile is an A100 (312 TFLOPS
#: FP16) with Llama-2-7B, given the NPU's 64 GB of memory (``--gpu-mem-gb``: the KV capacity follows)
PROFILE = "llama-2-7b_a100-80gb_vidur"
GPU_MEM_GB = 64.0
#: the adapters' target modules, the same on every system: the paper serves the same LoRAs on FastLibra,
#: vLLM and S-LoRA (its targets are unspecified, fastlibra.md §7), and S-LoRA adapts q, k, v and o only
#: (slora.md, "Adapted projections"; the S-LoRA engine's default) -- with vLLM's default (all seven
#: projections) FastLibra and vLLM would move adapters 2.4x the size of S-LoRA's, and FastLibra's paged
#: kernels compute them. (vLLM's own kernels run on every linear layer whatever the targets: its baseline's
#: LoRA compute does not follow them, twin.perf.forms.KernelGridLora._layer_slices)
LORA_TARGETS = "qkvo"
FASTLIBRA = "fastlibra"
#: FastLibra's vLLM baseline (static LoRA/KV partition with prefix caching, LRU) and S-LoRA
VLLM = "vllm-partition"
SLORA = "slora"
ABLATIONS = {"WOM": "fastlibra-wom", "WOS": "fastlibra-wos", "WOL": "fastlibra-wol"}
#: peak throughput: the largest rate with mean TTFT below this (FastLibra §8's definition), s
TTFT_LIMIT_S = 0.5

# ------------------------------------------------------------------ the paper's numbers (never inputs)
SRC = "FastLibra §6.3 (main comparison)"
SRC_ABL = "FastLibra §6 ablation table"
PAPER: dict[str, PaperNumber] = {
    "ttft_vllm": PaperNumber("mean TTFT vs vLLM", "FastLibra, mean of the three workloads", "%", -60.3, SRC),
    "ttft_slora": PaperNumber("mean TTFT vs S-LoRA", "FastLibra, mean of the three workloads", "%", -50.1, SRC),
    "tpot_vllm": PaperNumber("mean TPOT vs vLLM", "FastLibra, mean of the three workloads", "%", -33.9, SRC),
    "tpot_slora": PaperNumber("mean TPOT vs S-LoRA", "FastLibra, mean of the three workloads", "%", -28.6, SRC),
    "peak_vllm": PaperNumber("peak throughput (TTFT < 500 ms) vs vLLM", "FastLibra, mean of the workloads", "x", 1.7,
                             SRC),
    "peak_slora": PaperNumber("peak throughput (TTFT < 500 ms) vs S-LoRA", "FastLibra, mean of the workloads", "x",
                              1.6, SRC),
    "ttft_vllm_translation": PaperNumber("mean TTFT vs vLLM", "FastLibra, translation", "%", -68.9, SRC),
    "ttft_vllm_others": PaperNumber("mean TTFT vs vLLM", "FastLibra, chatbot and agent (mean)", "%", -52.5, SRC),
    "ttft_slora_agent": PaperNumber("mean TTFT vs S-LoRA", "FastLibra, agent", "%", -81.1, SRC),
    "ttft_slora_others": PaperNumber("mean TTFT vs S-LoRA", "FastLibra, chatbot and translation (mean)", "%", -34.6,
                                     SRC),
    "slora_beats_chatbot": PaperNumber("S-LoRA's mean TTFT below vLLM's", "chatbot", "", "yes", SRC),
    "slora_beats_translation": PaperNumber("S-LoRA's mean TTFT below vLLM's", "translation", "", "yes", SRC),
    "slora_beats_agent": PaperNumber("S-LoRA's mean TTFT below vLLM's", "agent", "", "no", SRC),
    "hbm_vllm": PaperNumber("HBM utilisation vs vLLM", "FastLibra, mean of the three workloads", "x", 1.2, SRC),
    "hbm_slora": PaperNumber("HBM utilisation vs S-LoRA", "FastLibra, mean of the three workloads", "x", 2.6, SRC),
}
#: HBM utilisation (§10): the server's KV and adapter memory in use (``EngineState.memory_in_use``), read
#: every this many simulated seconds from the warm-up's end to the last arrival and averaged
#: (``Runner.point(memory_gauge_s=...)``); a point's mean, then the mean over the rates, as TTFT
MEMORY_GAUGE_S = 1.0
PAPER_ABLATION: dict[str, PaperNumber] = {
    **{f"ttft_{k}": PaperNumber("mean TTFT normalised to FastLibra", f"{k}, mean of the workloads", "x", v, SRC_ABL)
       for k, v in (("WOM", 1.27), ("WOS", 1.24), ("WOL", 1.13))},
    **{f"tpot_{k}": PaperNumber("mean TPOT normalised to FastLibra", f"{k}, mean of the workloads", "x", v, SRC_ABL)
       for k, v in (("WOM", 1.18), ("WOS", 1.15), ("WOL", 1.11))},
    **{f"peak_{k}": PaperNumber("peak throughput vs FastLibra", f"{k}, mean of the workloads", "%", v, SRC_ABL)
       for k, v in (("WOM", -19.8), ("WOS", -17.2), ("WOL", -13.1))},
    "invalid_WOM": PaperNumber("invalid KVs (HBM history KV whose LoRA is not in HBM)", "WOM, mean of the workloads",
                               "%", 48.6, SRC_ABL),
}


@dataclasses.dataclass(frozen=True)
class Effort:
    """Simulated seconds of arrivals measured per point, rates averaged over, and the peak search's
    resolution: it bisects until the last failing rate is within ``peak_resolution`` x the peak
    (:func:`twin.reproduce.base.knee_search`), so a peak is known to that share of itself.
    ``warmup_s``: seconds of arrivals simulated before them and not measured (see :data:`WARMUP_S`)."""

    duration_s: float
    rates: int
    peak_resolution: float
    warmup_s: float = 0.0


#: Warm-up before the measured arrivals (FastLibra §7: the paper's timelines span ~1,800 s, so its
#: averages come from a server whose HBM is full of history KV and adapters; run length otherwise
#: unspecified). A twin run starts with empty HBM, and the turns of a synthesized conversation
#: that fall before t = 0 are not simulated, so a later turn early in the run finds no history.
#: Measured on ``fastlibra-chatbot`` under ``fastlibra`` (points of :func:`scenario`, no warm-up):
#: over the first 60 s the prefix hit rate is 19.5 % at 7.25 req/s, over 300 s 35 %, and at
#: 3.6 req/s 41.5 %; the rate that met the 500 ms limit over 60 s from empty HBM gave a 12.6 s
#: mean TTFT over 300 s (HBM then full in 84 % of the swapper's ticks, 44 % in the first 60 s).
#: 180 s is six mean think times of the conversation synthesis (30 s: a later turn's previous
#: turn was simulated with probability 1 - e^-6 > 99.7 %) and more than the time FastLibra's
#: HBM took to first exceed the busy threshold on ``fastlibra-chatbot`` from 1.45 req/s up (86 s
#: at 1.45, 32 s at 3.6; 234 s at 0.7) and on ``fastlibra-agent`` from 5 req/s up (106 s at 5,
#: 7 s at 25). A set-up choice with its reasons, not fitted to any result.
WARMUP_S = 180.0
#: 60 s of measured arrivals per point after the warm-up (the peaks reach tens of req/s: thousands of
#: requests per point, and the peak search probes up to twice the peak). Peaks to within 5 % (at most five
#: bisections of the doubling bracket), fine enough to show the ablations' -13 to -20 % peak
#: changes (FastLibra §6); two bisections (25 %, the earlier default) moved the peaks in 17-25 % steps
FULL = Effort(duration_s=60.0, rates=10, peak_resolution=0.05, warmup_s=WARMUP_S)
#: the --quick variant CI and the notebook run: a smoke-scale version of the same experiment
#: (peaks to within 50 %: one bisection; a 30 s warm-up fills HBM only at the upper rates)
QUICK = Effort(duration_s=15.0, rates=3, peak_resolution=0.5, warmup_s=30.0)
#: first rate of the peak search (req/s); the search doubles or halves from it
PEAK_SEARCH_START = 1.0
#: A rate point is simulated until its last request finishes, or for at most this many simulated
#: seconds after its last arrival (ten measured windows of :data:`FULL`). A point past its system's
#: own peak builds a backlog that can take hours to drain: WOM past its peak on ``fastlibra-agent``
#: (75.6 and 84 req/s, 240 s of arrivals) was still draining after 13,576 and 14,515 simulated
#: seconds (51 min of wall time each). Such a point is cut (``Runner.point(stop_at_s=...)``) and
#: reports an exact lower bound on its mean TTFT (the waiting requests' waits so far), not a mean;
#: its TPOT is unknown. Every point of the ``fastlibra-ttft`` run of stop 24 ended by 528 s, within
#: the cap. A bound on the cost, not fitted to any result.
DRAIN_CAP_S = 600.0


def scenario(name: str, effort: Effort, subs: dict[str, str]) -> RunConfig:
    """The run of one of :data:`WORKLOADS` (a stand-in with its options when the name is missing)."""
    trace = pick("trace", name, STAND_INS[name], subs)
    opts = STAND_IN_OPTIONS[name] if trace != name else {}
    return RunConfig(trace=trace, profile=pick("profile", PROFILE, PROFILE, subs), gpu_mem_gb=GPU_MEM_GB,
                     duration=effort.warmup_s + effort.duration_s, seed=0, lora_targets=LORA_TARGETS, **opts)


def measure(runner: Runner, quick: bool, presets: dict[str, str], memory_gauge: bool = False) -> dict[str, Any]:
    """Per workload: FastLibra's peak, the rates ``k/R`` of it, and for every preset of
    ``presets`` (label -> preset name) its own peak and its TTFT/TPOT at each rate (with
    ``memory_gauge``, also its mean memory in use at each rate, :data:`MEMORY_GAUGE_S`)."""
    effort = QUICK if quick else FULL
    subs: dict[str, str] = {}
    fl = pick("preset", FASTLIBRA, FASTLIBRA, subs)
    names = {label: pick("preset", p, p, subs) for label, p in presets.items()}
    # every point is measured over the arrivals after the warm-up (``measured_*``, base.window_metrics)
    ok = lambda s: (not s.get("stopped_early") and s["measured_ttft_ms_mean"] is not None  # noqa: E731
                    and s["measured_ttft_ms_mean"] < TTFT_LIMIT_S * 1000.0)
    cap = effort.warmup_s + effort.duration_s + DRAIN_CAP_S  # the last arrival is before warm-up + duration
    gauge_s = MEMORY_GAUGE_S if memory_gauge else None
    point = lambda run, preset, r: runner.point(run, preset, r, measure_from_s=effort.warmup_s,  # noqa: E731
                                                stop_at_s=cap, memory_gauge_s=gauge_s)
    # a peak-search probe stops once its mean TTFT is known to reach the limit (an exact bound:
    # past the peak the queue would otherwise be simulated until it drains)
    probe = lambda run, preset, r: runner.point(run, preset, r, measure_from_s=effort.warmup_s,  # noqa: E731
                                                fail_above_ttft_s=TTFT_LIMIT_S)
    out: dict[str, Any] = {"effort": effort, "substitutions": subs, "workloads": {}, "points": [], "presets": names}
    for scen, wname in WORKLOADS.items():
        run = scenario(wname, effort, subs)
        peaks = {}
        for label, preset in {"FastLibra": fl, **names}.items():
            k = knee_search(lambda r: probe(run, preset, r), ok, PEAK_SEARCH_START, 0,
                            resolution=effort.peak_resolution)
            peaks[label] = k.rate
        rates = [peaks["FastLibra"] * (i + 1) / effort.rates for i in range(effort.rates)]
        pts: dict[str, list[dict[str, Any]]] = {}
        for label, preset in {"FastLibra": fl, **names}.items():
            pts[label] = [point(run, preset, r) for r in rates] if rates[-1] > 0 else []
            for r_, p in zip(rates, pts[label]):
                out["points"].append({**p, "experiment": "rates", "scenario": scen, "system": label, "rps": r_})
        out["workloads"][scen] = {"trace": run.trace, "peaks_rps": peaks, "rates_rps": rates,
                                  "means": means_over_rates(pts)}
    return out


def means_over_rates(pts: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per system (label -> its points at the same rates): the mean over the rates of the measured
    mean TTFT and TPOT (ms). A point cut at the drain cap (:data:`DRAIN_CAP_S`) enters the TTFT mean
    with its lower bound, and the mean is then a lower bound (``ttft_lower: True``); TPOT is
    averaged over the rates at which no system was cut, the same rates for every system
    (``tpot_rates``: how many)."""
    cut = [any(ps[i].get("stopped_early") for ps in pts.values()) for i in range(len(next(iter(pts.values()), [])))]
    out: dict[str, dict[str, Any]] = {}
    for label, ps in pts.items():
        ttft = [p["measured_ttft_ms_mean_lower"] if p.get("stopped_early") else p["measured_ttft_ms_mean"]
                for p in ps]
        ttft = ttft if all(x is not None for x in ttft) else []  # a cut point without a bound
        tpot = [p["measured_tpot_ms_mean"] for p, c in zip(ps, cut) if not c and p["measured_tpot_ms_mean"] is not None]
        out[label] = {"ttft_ms_mean": float(np.mean(ttft)) if ttft else float("nan"),
                      "tpot_ms_mean": float(np.mean(tpot)) if tpot else float("nan"),
                      "ttft_lower": any(p.get("stopped_early") for p in ps), "tpot_rates": len(tpot),
                      "memory_in_use_mean": _mean([_num(p.get("memory_in_use_mean")) for p in ps]),
                      "adapter_hit_rate": _mean([_num(p.get("adapter_hit_rate_requests")) for p in ps]),
                      "history_hbm_hit_rate": _mean([_hbm_hits(p) for p in ps])}
    return out


# ------------------------------------------------------------------ values that may be bounds
#: a value's direction: exact, a lower bound (the full run's value is at least it) or an upper bound
EXACT, LOWER, UPPER = 0, 1, -1


def bounded_mean(values: list[tuple[float, int]]) -> tuple[float, int]:
    """The mean of ``(value, direction)`` pairs, NaNs left out: exact when all are, a lower (upper)
    bound when the others are exact, NaN when lower and upper bounds mix (nothing follows)."""
    values = [(v, d) for v, d in values if v == v]
    kinds = {d for _, d in values} - {EXACT}
    if not values or len(kinds) > 1:
        return float("nan"), EXACT
    return float(np.mean([v for v, _ in values])), kinds.pop() if kinds else EXACT


def bounded_ratio(value: tuple[float, int], base: tuple[float, int]) -> tuple[float, int]:
    """``value / base`` (positive values): a lower bound over an exact base stays a lower bound, an
    exact value over a lower-bound base gives an upper bound; two bounds give NaN."""
    (v, dv), (b, db) = value, base
    if dv != EXACT and db != EXACT:
        return float("nan"), EXACT
    return ratio(v, b), dv if dv != EXACT else -db


def bounded_change(value: tuple[float, int], base: tuple[float, int]) -> tuple[float, int]:
    """``100 * (value / base - 1)`` with the direction of :func:`bounded_ratio`."""
    r, d = bounded_ratio(value, base)
    return (100.0 * (r - 1.0) if r == r else float("nan")), d


def bounded_value(v: tuple[float, int], digits: int) -> float | str:
    """A row's twin value: the number, or ``">= x"`` / ``"<= x"`` for a bound."""
    x, d = v
    if d == EXACT or x != x:
        return x
    return f"{'>=' if d == LOWER else '<='} {round(x, digits):g}"


def _ttft(W: dict[str, Any], s: str, label: str) -> tuple[float, int]:
    m = W[s]["means"][label]
    return m["ttft_ms_mean"], LOWER if m.get("ttft_lower") else EXACT


def _num(x: Any) -> float:
    """A summary value as a float (NaN when missing)."""
    return float(x) if x is not None else float("nan")


def _mean(xs: list[float]) -> float:
    xs = [x for x in xs if x == x]
    return float(np.mean(xs)) if xs else float("nan")


def _hbm_hits(p: dict[str, Any]) -> float:
    """A point's history lookups served from HBM, over its lookups (NaN without history KV reuse)."""
    n = p.get("prefix_lookups")
    return (_num(p.get("prefix_hits")) - _num(p.get("prefix_host_hits"))) / n if n else float("nan")


def _setup(m: dict[str, Any], presets: list[str]) -> dict[str, Any]:
    effort = m["effort"]
    return {"workloads": {k: v["trace"] for k, v in m["workloads"].items()}, "profile": PROFILE,
            "gpu_mem_gb": GPU_MEM_GB, "lora_targets": LORA_TARGETS,
            "presets": {p: system_of(p) for p in presets}, "duration_s": effort.duration_s,
            "warmup_s": effort.warmup_s, "rates": effort.rates,
            "ttft_limit_s": TTFT_LIMIT_S, "peak_resolution": effort.peak_resolution,
            "peaks_rps": {k: v["peaks_rps"] for k, v in m["workloads"].items()},
            "rates_rps": {k: v["rates_rps"] for k, v in m["workloads"].items()},
            "substitutions": m["substitutions"]}


def mixed_sign_verdict(r: Row, parts: dict[str, float]) -> Row:
    """A mean of per-workload changes whose signs differ from the paper's is graded ``no``: the paper's
    mean averages changes of one sign (FastLibra better on every workload), so a mean that lands near it
    only because one workload's gain cancels another's loss does not reproduce it (the per-workload
    rows show which)."""
    finite = {k: v for k, v in parts.items() if v == v}
    if isinstance(r.paper, (int, float)) and r.paper and any(v * r.paper < 0 for v in finite.values()):
        shown = " / ".join(f"{k} {v:+.1f}" for k, v in finite.items())
        r.verdict_override = f"no: the workloads' changes differ in sign ({shown} %)"
    return r


def run_ttft(runner: Runner, quick: bool) -> Outcome:
    """Mean TTFT and TPOT (averaged over the rates) and peak throughput of FastLibra vs vLLM and S-LoRA."""
    m = measure(runner, quick, {"vLLM": VLLM, "S-LoRA": SLORA}, memory_gauge=True)
    W = m["workloads"]
    rows: list[Row] = []
    # a TTFT mean may be a lower bound (a point cut at the drain cap, DRAIN_CAP_S); TPOT never is
    change = {("ttft_ms_mean", base, s): bounded_change(_ttft(W, s, "FastLibra"), _ttft(W, s, base))
              for base in ("vLLM", "S-LoRA") for s in W}
    change.update({("tpot_ms_mean", base, s): (pct_change(W[s]["means"]["FastLibra"]["tpot_ms_mean"],
                                                          W[s]["means"][base]["tpot_ms_mean"]), EXACT)
                   for base in ("vLLM", "S-LoRA") for s in W})
    for key, q, base in (("ttft_vllm", "ttft_ms_mean", "vLLM"), ("ttft_slora", "ttft_ms_mean", "S-LoRA"),
                         ("tpot_vllm", "tpot_ms_mean", "vLLM"), ("tpot_slora", "tpot_ms_mean", "S-LoRA")):
        r = row(PAPER[key], bounded_value(bounded_mean([change[(q, base, s)] for s in W]), 1))
        rows.append(mixed_sign_verdict(r, {s: change[(q, base, s)][0] for s in W}))
    for key, base in (("peak_vllm", "vLLM"), ("peak_slora", "S-LoRA")):
        rows.append(row(PAPER[key], _mean([ratio(W[s]["peaks_rps"]["FastLibra"], W[s]["peaks_rps"][base])
                                           for s in W]), 2))
    rows.append(row(PAPER["ttft_vllm_translation"], bounded_value(change[("ttft_ms_mean", "vLLM", "translation")], 1)))
    rows.append(mixed_sign_verdict(row(PAPER["ttft_vllm_others"], bounded_value(bounded_mean(
        [change[("ttft_ms_mean", "vLLM", s)] for s in ("chatbot", "agent")]), 1)),
        {s: change[("ttft_ms_mean", "vLLM", s)][0] for s in ("chatbot", "agent")}))
    rows.append(row(PAPER["ttft_slora_agent"], bounded_value(change[("ttft_ms_mean", "S-LoRA", "agent")], 1)))
    rows.append(mixed_sign_verdict(row(PAPER["ttft_slora_others"], bounded_value(bounded_mean(
        [change[("ttft_ms_mean", "S-LoRA", s)] for s in ("chatbot", "translation")]), 1)),
        {s: change[("ttft_ms_mean", "S-LoRA", s)][0] for s in ("chatbot", "translation")}))
    for s in W:
        (sl, dsl), (vl, dvl) = _ttft(W, s, "S-LoRA"), _ttft(W, s, "vLLM")
        # S-LoRA below vLLM is known when both are exact, or when the lower one is exact
        known = sl == sl and vl == vl and (dsl == dvl == EXACT or (sl < vl and dsl == EXACT and dvl == LOWER)
                                           or (vl < sl and dvl == EXACT and dsl == LOWER))
        rows.append(row(PAPER[f"slora_beats_{s}"], yes_no(sl < vl) if known else None))
    use = {s: {k: v["memory_in_use_mean"] for k, v in W[s]["means"].items()} for s in W}
    for key, base in (("hbm_vllm", "vLLM"), ("hbm_slora", "S-LoRA")):
        rows.append(row(PAPER[key], _mean([ratio(use[s]["FastLibra"], use[s][base]) for s in W]), 2))
    setup = _setup(m, [FASTLIBRA, VLLM, SLORA])
    setup["memory_gauge_s"] = MEMORY_GAUGE_S
    notes = [f"{s}: FastLibra's peak {W[s]['peaks_rps']['FastLibra']:.3g} req/s (vLLM {W[s]['peaks_rps']['vLLM']:.3g}, "
             f"S-LoRA {W[s]['peaks_rps']['S-LoRA']:.3g}) on {W[s]['trace']}" for s in W]
    notes.append("HBM utilisation (KV of running requests, history KV and resident adapters over the KV pool plus the "
                 f"adapters' memory; read every {MEMORY_GAUGE_S:g} s from the warm-up's end to the last arrival, mean "
                 "over the rates), FastLibra / vLLM / S-LoRA: " + "; ".join(
                     f"{s} " + " / ".join(f"{100 * use[s][k]:.0f} %" for k in ("FastLibra", "vLLM", "S-LoRA"))
                     for s in W) + ".")
    notes.append("the paper's cache hit rate (LoRA + KV: 1.3x vLLM, 3.2x S-LoRA) is not a row: it does not say how "
                 "LoRA and KV lookups combine, and S-LoRA keeps no history KV to look up. Requests finding their "
                 "adapter in HBM, FastLibra / vLLM / S-LoRA: " + "; ".join(
                     f"{s} " + " / ".join(pct_text(W[s]["means"][k]["adapter_hit_rate"])
                                          for k in ("FastLibra", "vLLM", "S-LoRA"))
                     for s in W) + "; history lookups served from HBM, FastLibra / vLLM: " + "; ".join(
                     f"{s} " + " / ".join(pct_text(W[s]["means"][k]["history_hbm_hit_rate"])
                                          for k in ("FastLibra", "vLLM"))
                     for s in W) + " (mean over the rates).")
    notes += _cut_notes(m)
    return Outcome("fastlibra-ttft", "FastLibra vs vLLM and S-LoRA: TTFT, TPOT and peak throughput (§6.3)", rows,
                   setup, m["points"], notes)


def run_ablation(runner: Runner, quick: bool) -> Outcome:
    """WOM/WOS/WOL: mean TTFT and TPOT normalised to FastLibra's, peak throughput change."""
    m = measure(runner, quick, dict(ABLATIONS))
    W = m["workloads"]
    rows: list[Row] = []
    for v in ABLATIONS:  # a TTFT mean with a point cut at the drain cap is a lower bound (DRAIN_CAP_S)
        rows.append(row(PAPER_ABLATION[f"ttft_{v}"], bounded_value(bounded_mean(
            [bounded_ratio(_ttft(W, s, v), _ttft(W, s, "FastLibra")) for s in W]), 3), 3))
    for v in ABLATIONS:  # TPOT over the rates at which no system was cut (means_over_rates)
        rows.append(row(PAPER_ABLATION[f"tpot_{v}"], _mean([ratio(W[s]["means"][v]["tpot_ms_mean"],
                                                                  W[s]["means"]["FastLibra"]["tpot_ms_mean"])
                                                            for s in W]), 3))
    for v in ABLATIONS:
        rows.append(row(PAPER_ABLATION[f"peak_{v}"],
                        _mean([pct_change(W[s]["peaks_rps"][v], W[s]["peaks_rps"]["FastLibra"]) for s in W])))
    # invalid KVs: the share of HBM history-KV blocks whose adapter is not in HBM (sampled every
    # swapper tick), over the rates, for workloads with history KV
    rows.append(row(PAPER_ABLATION["invalid_WOM"], _mean(
        [100 * _mean([_num(p.get("fastlibra_invalid_kv_share")) for p in m["points"]
                      if p["scenario"] == s and p["system"] == "WOM"]) for s in W])))
    setup = _setup(m, [FASTLIBRA, *ABLATIONS.values()])
    notes = _cut_notes(m)
    for scen in W:
        pts = [p for p in m["points"] if p["scenario"] == scen]
        cells = []
        for system in ("FastLibra", *ABLATIONS):
            mine = [p for p in pts if p["system"] == system]
            swaps = sum(int(p.get("fastlibra_swaps_out") or 0) for p in mine)
            hits = _mean([_num(p.get("prefix_hit_rate")) for p in mine])
            what = f"prefix hits {100 * hits:.1f} % (any tier)" if hits == hits else "no prefix lookups"
            cold = (f"cold starts LoRA {sum(int(p.get('lora_cold_starts') or 0) for p in mine)} "
                    f"({sum(float(p.get('lora_cold_start_s') or 0.0) for p in mine):.1f} s) / "
                    f"KV {sum(int(p.get('kv_cold_starts') or 0) for p in mine)} "
                    f"({sum(float(p.get('kv_cold_start_s') or 0.0) for p in mine):.1f} s)")
            use = _mean([_num(p.get("fastlibra_hbm_usage_mean")) for p in mine])
            busy = _mean([_num(p.get("fastlibra_busy_tick_share")) for p in mine])
            tot = lambda k: sum(int(p.get(k) or 0) for p in mine)  # noqa: E731
            above = _mean([_num(p.get("fastlibra_lora_eval_above_1_share")) for p in mine])
            term = f"LoRA_Eval > 1 in {100 * above:.0f} % of ticks" if above == above else "no LoRA_Eval (LRU)"
            cells.append(f"{system} {swaps} swap-outs ({tot('fastlibra_swaps_out_lora')} LoRAs, "
                         f"{tot('fastlibra_lora_swaps_out_with_kv')} of them leaving their KV in HBM), decisions "
                         f"changed by the tree {tot('fastlibra_dependency_decisions')} / by LoRA_Eval "
                         f"{tot('fastlibra_lora_eval_decisions')}, {term}, {what}, {cold}, HBM use {100 * use:.0f} % "
                         f"(> 95 % in {100 * busy:.0f} % of ticks)")
        notes.append(f"{scen} (over its rates, warm-up included): " + "; ".join(cells))
    return Outcome("fastlibra-ablation", "FastLibra ablations WOM / WOS / WOL (§6 ablation)", rows, setup,
                   m["points"], notes)


def _cut_notes(m: dict[str, Any]) -> list[str]:
    """One note per system and workload with points cut at the drain cap: where, what was known."""
    notes = []
    cap = m["effort"].warmup_s + m["effort"].duration_s + DRAIN_CAP_S
    for s, w in m["workloads"].items():
        for label in w["means"]:
            mine = [p for p in m["points"] if p["scenario"] == s and p["system"] == label and p.get("stopped_early")]
            if not mine:
                continue
            cells = [f"{p['rps']:.3g} req/s: {p['measured_finished']} of {p['measured_arrived']} measured requests "
                     f"finished, mean TTFT >= {_num(p['measured_ttft_ms_mean_lower']) / 1000:.3g} s, "
                     f"{p['throughput_rps']:.3g} req/s served over the run" for p in mine]
            tp = w["means"][label]["tpot_rates"]
            notes.append(f"{s}: {label}'s backlog had not drained {DRAIN_CAP_S:.0f} s after the last arrival "
                         f"(cut at {cap:.0f} s simulated) at {len(mine)} of {len(w['rates_rps'])} rates "
                         f"({'; '.join(cells)}); its mean TTFT over the rates is a lower bound, and every "
                         f"system's TPOT on {s} is averaged over the {tp} rates where none was cut")
    return notes


def figure(outcome: Outcome):
    """Mean TTFT against the rate, one panel per workload, one line per system."""
    from matplotlib.figure import Figure

    scen = list(dict.fromkeys(p["scenario"] for p in outcome.points))
    fig = Figure(figsize=(4.2 * len(scen), 3.6), layout="tight")
    axes = fig.subplots(1, len(scen), squeeze=False)
    for ax, s in zip(axes[0], scen):
        pts = [p for p in outcome.points if p["scenario"] == s]
        for system in dict.fromkeys(p["system"] for p in pts):
            mine = [p for p in pts if p["system"] == system]
            xs = [p["rps"] for p in mine]
            ys = [p["measured_ttft_ms_mean_lower"] if p.get("stopped_early") else p["measured_ttft_ms_mean"]
                  for p in mine]
            line = ax.plot(xs, ys, marker="o", label=system)[0]
            cut = [(x, y) for x, y, p in zip(xs, ys, mine) if p.get("stopped_early")]
            if cut:  # cut at the drain cap: the mean TTFT is at least this (an open triangle pointing up)
                ax.plot(*zip(*cut), ls="none", marker="^", ms=10, mfc="none", color=line.get_color(),
                        label=f"{system}: lower bound (cut)")
        ax.axhline(TTFT_LIMIT_S * 1000, color="k", ls="--", lw=1)
        ax.set_yscale("log")
        ax.set_xlabel("request rate (req/s)")
        ax.set_ylabel("mean TTFT (ms)")
        ax.set_title(f"{s} ({outcome.setup['workloads'][s]})", fontsize=9)
        ax.legend(fontsize=8)
    fig.suptitle(f"{outcome.name} ({outcome.setup['profile']})")
    return fig
