"""The named reproductions (``twin reproduce --list``) and how to run one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from twin.config import ConfigError
from twin.reproduce import adaptive_caching, chameleon, fastlibra
from twin.reproduce.base import Outcome, Runner


@dataclass(frozen=True)
class Reproduction:
    """A paper experiment by name: what it runs (``run(runner, quick)``) and its figure."""

    name: str
    paper: str
    description: str
    run: Callable[[Runner, bool], Outcome]
    figure: Callable[[Outcome], Any]


REPRODUCTIONS: dict[str, Reproduction] = {r.name: r for r in [
    Reproduction("chameleon-fig11", "Chameleon (MICRO'25)",
                 "P50/P99 TTFT vs S-LoRA at 0.70/0.93/1.05 of S-LoRA's knee; throughput within the TTFT SLO of "
                 "Chameleon, ChameleonNoSched, ChameleonNoCache vs S-LoRA", chameleon.run_fig11,
                 chameleon.figure_fig11),
    Reproduction("chameleon-caches", "Chameleon (MICRO'25)",
                 "LRU, FairShare and Chameleon caches at the middle load: P99 TTFT vs S-LoRA, hit rate, load waits",
                 chameleon.run_caches, chameleon.figure_caches),
    Reproduction("chameleon-schedulers", "Chameleon (MICRO'25)",
                 "FIFO (S-LoRA), SJF (S-LoRA+SJF) and Chameleon's scheduler at the high load: P99 TTFT within the "
                 "SLO and the share of E2E queued per size class", chameleon.run_schedulers,
                 chameleon.figure_schedulers),
    Reproduction("fastlibra-ttft", "FastLibra (2025)",
                 "mean TTFT and TPOT vs vLLM and S-LoRA on chatbot / translation / agent, averaged over rates up to "
                 "FastLibra's peak; peak throughput with TTFT < 500 ms", fastlibra.run_ttft, fastlibra.figure),
    Reproduction("fastlibra-ablation", "FastLibra (2025)",
                 "WOM / WOS / WOL: TTFT, TPOT and peak throughput normalised to FastLibra", fastlibra.run_ablation,
                 fastlibra.figure),
    Reproduction("adaptive-caching", "Adaptive LoRA caching",
                 "LRU / LFU / EMA (synchronous prefetch) hit rates and P99 under uniform, Zipf and bursty popularity",
                 adaptive_caching.run, adaptive_caching.figure),
]}

#: the name that runs every reproduction
ALL = "all"


def resolve_names(name: str) -> list[str]:
    """``[name]``, or every name for :data:`ALL`; a ConfigError listing the names for an unknown one."""
    if name == ALL:
        return list(REPRODUCTIONS)
    if name not in REPRODUCTIONS:
        raise ConfigError(f"unknown reproduction {name!r}; available: {', '.join(REPRODUCTIONS)} (or {ALL}); "
                          f"`twin reproduce --list` describes them")
    return [name]


def run_reproduction(name: str, quick: bool = False, runner: Runner | None = None, progress: bool = False,
                     ) -> Outcome:
    """Run the reproduction ``name`` (``quick``: the short variant CI runs). A shared ``runner``
    reuses the simulations of earlier reproductions (e.g. the Chameleon knee)."""
    [name] = resolve_names(name)
    runner = runner or Runner(progress=progress)
    runner.start(name)
    try:
        outcome = REPRODUCTIONS[name].run(runner, quick)
    finally:
        runner.close()
    outcome.setup["variant"] = "quick" if quick else "full"
    return outcome
