"""Workload synthesis: arrivals x adapters x lengths (x conversations) -> :class:`Workload`.

A :class:`SynthConfig` holds everything a synthetic workload depends on; :func:`synthesize`
turns it into a workload whose ``meta`` records the config and seed, so the same call
regenerates it exactly. Each component draws from its own child stream of
``numpy.random.SeedSequence(seed)`` (arrivals, adapters, lengths, conversations), so changing
one option (e.g. the popularity) leaves the others' draws unchanged.

:data:`OPTIONS` maps the flat option names used by ``get_workload(**options)`` and the CLI
flags (``--rps``, ``--popularity``, ...) to config fields; :func:`apply_options` applies them.

Set-ups of the seed papers (see :mod:`traces.registry` for the named presets):

* S-LoRA / Chameleon: Poisson or gamma arrivals, N adapters over ranks 8..128 (N/5 each),
  power-law popularity (U-U, U-P, P-P), Splitwise lengths optionally scaled down.
* FastLibra: Uniform, Distinct (round-robin) or Skewed-x popularity over thousands of adapters.
* The published adapter twin: per-adapter Poisson rates from a list such as
  {0.1, 0.05, 0.025} req/s assigned round-robin, ShareGPT-like lengths (means 222/196) or fixed
  Small/Medium/Large sizes, one-hour windows.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import numbers
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any, Callable

import numpy as np

from traces import arrivals as arr
from traces.adapters import DEFAULT_RANKS, assign_adapters, assign_ranks, parse_popularity
from traces.arguments import is_flag, is_whole_number, parse_bool, parse_list
from traces.conversations import ConversationConfig, synthesize_conversations
from traces.lengths import LengthConfig, build_length_model, load_fitted, sample_lengths
from traces.workload import Workload

GENERATOR = "lora-twin traces.synth/1"
ARRIVAL_PROCESSES = ("poisson", "gamma", "onoff", "per-adapter", "fitted")
DEFAULT_RATES = (0.1, 0.05, 0.025)


@dataclass
class ArrivalConfig:
    """Arrival process (see :mod:`traces.arrivals`).

    ``process``: ``poisson`` | ``gamma`` (``cv``, default 2) | ``onoff`` (``on_s``, ``off_s``,
    ``off_frac``) | ``per-adapter`` (``rates`` cycled over the adapters; with ``rps`` set, the
    list is scaled so that the adapters' rates sum to ``rps``)
    | ``fitted`` (rate profile and renewal CV of a committed fit ``fit``, e.g.
    ``splitwise_conv_fit``; ``rps`` defaults to the fitted mean rate).
    ``n_requests`` (poisson/gamma only) generates exactly that many arrivals instead of a time
    window: that many requests, or, with conversations (:class:`ConversationConfig`), that many
    conversation starts, each bringing its turns (about ``n_requests x expected_turns()``
    requests; the size check, ``traces.registry.expected_requests``, counts them so).
    """

    process: str = "poisson"
    rps: float | None = 4.0
    duration_s: float = 300.0
    n_requests: int | None = None
    cv: float | None = None
    on_s: float = 10.0
    off_s: float = 30.0
    off_frac: float = 0.0
    rates: list[float] | None = None
    shuffle_rates: bool = True
    fit: str | None = None


@dataclass
class AdapterConfig:
    """``n_adapters`` adapters over ``ranks`` (cycled), requests drawn by ``popularity``."""

    n_adapters: int = 100
    ranks: list[int] = field(default_factory=lambda: list(DEFAULT_RANKS))
    popularity: str = "powerlaw"


@dataclass
class SynthConfig:
    """Everything a synthetic workload depends on."""

    arrivals: ArrivalConfig = field(default_factory=ArrivalConfig)
    adapters: AdapterConfig = field(default_factory=AdapterConfig)
    lengths: LengthConfig = field(default_factory=LengthConfig)
    conversations: ConversationConfig = field(default_factory=ConversationConfig)
    seed: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "SynthConfig":
        return cls(ArrivalConfig(**d.get("arrivals", {})), AdapterConfig(**d.get("adapters", {})),
                   LengthConfig(**d.get("lengths", {})), ConversationConfig(**d.get("conversations", {})),
                   int(d.get("seed", 0)))


def parse_rates(value: Any) -> list[float]:
    """Per-adapter rates such as ``0.1,0.05,0.025``."""
    return parse_list(value, float, "rates")


def parse_ranks(value: Any) -> list[int]:
    """Adapter ranks such as ``8,16,32`` (or ``8-16-32``)."""
    return parse_list(value, int, "ranks")


def whole_number(v: Any) -> int:
    """A whole number from an int, an integral float or a command line's text; refuses 2.5 and True
    (``int()`` truncated ``adapters=2.5`` to 2 and took ``True`` as 1)."""
    if is_flag(v):
        raise ValueError(f"{v!r} is a flag, not a whole number")
    if isinstance(v, str):
        try:
            return int(v.strip())
        except ValueError:
            pass
    x = v if isinstance(v, numbers.Integral) else float(v)  # (text that is no number raises here)
    if not is_whole_number(x):
        raise ValueError(f"{v!r} is not a whole number")
    return int(x)


def _float(v: Any) -> float:
    """A number from a number or a command line's text; refuses True (``float()`` took it as 1.0)."""
    if is_flag(v):
        raise ValueError(f"{v!r} is a flag, not a number")
    return float(v)


def _opt_int(v: Any) -> int | None:
    return None if v is None else whole_number(v)


def _opt_float(v: Any) -> float | None:
    return None if v is None else _float(v)


#: flat option name -> (config section, field, converter, help)
OPTIONS: dict[str, tuple[str, str, Callable[[Any], Any], str]] = {
    "arrival": ("arrivals", "process", str, f"arrival process: {' | '.join(ARRIVAL_PROCESSES)}"),
    "rps": ("arrivals", "rps", _opt_float, "mean request rate (req/s); for a replayed trace: rescale to it"),
    "duration": ("arrivals", "duration_s", _float, "seconds to generate; for a replayed trace: keep the first seconds"),
    "n_requests": ("arrivals", "n_requests", _opt_int, "exact request count (poisson/gamma) instead of a window; "
                   "with conversations: the number of conversations (each with its turns)"),
    "cv": ("arrivals", "cv", _opt_float, "inter-arrival coefficient of variation (gamma; default 2)"),
    "on_s": ("arrivals", "on_s", _float, "mean on-period of on/off bursts (s)"),
    "off_s": ("arrivals", "off_s", _float, "mean off-period of on/off bursts (s)"),
    "off_frac": ("arrivals", "off_frac", _float, "rate while off as a fraction of the on-rate"),
    "rates": ("arrivals", "rates", parse_rates, "per-adapter rates cycled round-robin, e.g. 0.1,0.05,0.025"),
    "shuffle_rates": ("arrivals", "shuffle_rates", partial(parse_bool, name="shuffle_rates"),
                      "shuffle per-adapter rates after the round-robin"),
    "fit": ("arrivals", "fit", str, "fitted arrival statistics for arrival=fitted (e.g. splitwise_conv_fit)"),
    "adapters": ("adapters", "n_adapters", whole_number, "number of adapters (0: base model only)"),
    "ranks": ("adapters", "ranks", parse_ranks, "adapter ranks cycled over adapter ids, e.g. 8,16,32,64,128"),
    "popularity": ("adapters", "popularity", str, "adapter popularity: uniform | powerlaw[:a] | zipf[:s] | "
                   "skewed[:x] | distinct | bursty[:B] | U-U | U-P | P-P ..."),
    "lengths": ("lengths", "dist", str, "length model: splitwise | splitwise-code | sharegpt | lognormal[:SRC] | "
                "fixed:small|medium|large|P/O | empirical:NAME|PATH"),
    "mean_in": ("lengths", "mean_in", _opt_float, "target mean prompt tokens (sharegpt, lognormal)"),
    "mean_out": ("lengths", "mean_out", _opt_float, "target mean output tokens (sharegpt, lognormal)"),
    "length_method": ("lengths", "method", str, "mean matching for sharegpt: scale | tilt"),
    "length_scale": ("lengths", "scale", _float, "multiply all lengths by this factor"),
    "min_prompt": ("lengths", "min_prompt", whole_number, "drop/redraw requests with fewer prompt tokens"),
    "min_output": ("lengths", "min_output", whole_number, "drop/redraw requests with fewer output tokens"),
    "max_prompt": ("lengths", "max_prompt", _opt_int, "drop/redraw requests with more prompt tokens"),
    "max_output": ("lengths", "max_output", _opt_int, "drop/redraw requests with more output tokens"),
    "max_total": ("lengths", "max_total", _opt_int, "drop/redraw requests with prompt+output above this"),
    "conversations": ("conversations", "enabled", partial(parse_bool, name="conversations"),
                      "multi-turn conversations with shared prefixes"),
    "mean_turns": ("conversations", "mean_turns", _float, "mean turns per conversation (geometric)"),
    "max_turns": ("conversations", "max_turns", whole_number, "maximum turns per conversation"),
    "think_s": ("conversations", "think_s", _float, "mean user think time between turns (s)"),
    "tpot_s": ("conversations", "tpot_s", _float, "assumed seconds per output token to estimate reply end"),
}


#: options that must be > 0 when given (the others: >= 0)
POSITIVE_OPTIONS = frozenset({"rps", "duration", "n_requests", "length_scale", "mean_in", "mean_out", "cv", "on_s",
                              "off_s", "tpot_s", "mean_turns", "max_turns", "max_total", "max_prompt", "max_output"})
#: the largest inter-arrival coefficient of variation of ``arrival=gamma`` (shape 1e-4)
MAX_CV = 100.0
#: most adapters a workload may have (per-adapter tables, e.g. the popularity weights, are allocated for each)
MAX_ADAPTERS = 1_000_000
#: most turns a conversation may have (``max_turns``)
MAX_TURNS = 10_000
#: the largest ``length_scale``: beyond it every length of any trace exceeds any model's context (1e30 overflowed
#: the token counts, and drew 80 M lengths before the filter said none fits)
MAX_LENGTH_SCALE = 10_000.0
#: the smallest ``length_scale``: below it every length under 10,000 tokens rounds to the one-token floor (1e-9 ran a
#: workload of 1-token prompts and outputs without a word)
MIN_LENGTH_SCALE = 1.0 / MAX_LENGTH_SCALE
#: the mean matchings of ``lengths=sharegpt`` (``length_method``)
LENGTH_METHODS = ("scale", "tilt")


def option_value_problem(key: str, v: Any) -> str | None:
    """What is wrong with the number ``v`` of workload option ``key`` (``"must be a finite number"``,
    ``"must be >= 0"``, ``"must be > 0"``, more adapters than :data:`MAX_ADAPTERS`; for the list of per-adapter
    ``rates``, an item that is not a finite number > 0), or None (also for a non-number: its converter checks it)."""
    if key == "rates" and isinstance(v, (list, tuple)):
        if all(isinstance(r, (int, float)) and not isinstance(r, bool) and math.isfinite(r) and r > 0 for r in v):
            return None
        return "every per-adapter rate must be a finite number > 0 (req/s)"
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    if not math.isfinite(v):
        return "must be a finite number"
    if v < 0:
        return "must be >= 0"
    if v == 0 and key in POSITIVE_OPTIONS:
        return "must be > 0"
    if key == "max_turns" and v > MAX_TURNS:  # (the expected turns sum over 0..max_turns: 1e9 exhausted the memory)
        return f"more than the {MAX_TURNS:,} turns a conversation may have; give fewer, e.g. max_turns = 16"
    if key == "length_scale" and 0 < v < MIN_LENGTH_SCALE:
        return (f"less than {MIN_LENGTH_SCALE:g}: every length under {MAX_LENGTH_SCALE:,.0f} tokens would round to "
                f"the one-token floor; give a factor such as 0.5 or 0.1")
    if key == "length_scale" and v > MAX_LENGTH_SCALE:
        return (f"more than {MAX_LENGTH_SCALE:g}: every length would exceed any model's context; give a factor such "
                f"as 0.5 or 2")
    if key == "mean_turns" and 0 < v < 1:
        return "must be >= 1 (a conversation has at least one turn)"
    if key == "adapters" and v > MAX_ADAPTERS:
        return (f"more than the {MAX_ADAPTERS:,} adapters a workload may have (the popularity tables hold one entry "
                f"per adapter); give fewer")
    return None


def apply_options(cfg: SynthConfig, options: dict[str, Any]) -> SynthConfig:
    """A copy of ``cfg`` with the flat ``options`` applied (``None`` values are skipped).

    Raises ``TypeError`` naming unknown options and listing the valid ones.
    """
    out = copy.deepcopy(cfg)
    unknown = [k for k in options if k not in OPTIONS and k != "seed"]
    if unknown:
        raise TypeError(f"unknown workload option(s) {unknown}; valid: {', '.join(sorted(OPTIONS))}, seed")
    for k, v in options.items():
        if v is None:
            continue
        if k == "seed":
            try:
                out.seed = whole_number(v)
            except (TypeError, ValueError) as e:
                raise ValueError(f"seed = {v!r}: {e}; give a whole number") from None
            continue
        section, name, conv, help_text = OPTIONS[k]
        try:
            value = conv(v)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{k} = {v!r}: {e} ({help_text})") from None
        setattr(getattr(out, section), name, value)
    return out


def validate_config(cfg: SynthConfig) -> None:
    """Clear errors for inconsistent settings, before any drawing."""
    a = cfg.arrivals
    if a.process not in ARRIVAL_PROCESSES:
        raise ValueError(f"unknown arrival process {a.process!r}; use one of {', '.join(ARRIVAL_PROCESSES)}")
    if a.process == "fitted" and not a.fit:
        raise ValueError("arrival=fitted needs fit=NAME of a committed fit (e.g. splitwise_conv_fit)")
    if a.process == "fitted":
        fitted_arrivals(a.fit)  # (a fit without arrivals, e.g. sharegpt_lengths: said before any drawing)
    if a.process != "per-adapter" and a.process != "fitted" and (a.rps is None or a.rps <= 0):
        raise ValueError(f"arrival process {a.process} needs rps > 0 (got {a.rps})")
    if a.n_requests is not None and a.process not in ("poisson", "gamma"):
        raise ValueError("n_requests works with arrival=poisson or gamma; use duration for the others")
    if a.process == "per-adapter" and cfg.adapters.n_adapters < 1:
        raise ValueError("arrival=per-adapter needs adapters >= 1")
    if cfg.adapters.n_adapters < 0:
        raise ValueError(f"adapters must be >= 0, got {cfg.adapters.n_adapters}")
    if cfg.lengths.method not in LENGTH_METHODS:
        raise ValueError(f"length_method = {cfg.lengths.method!r}: unknown mean matching; use "
                         f"{' or '.join(LENGTH_METHODS)}")
    parse_popularity(cfg.adapters.popularity)
    assign_ranks(1, cfg.adapters.ranks)
    for key, (section, name, _, help_text) in OPTIONS.items():
        v = getattr(getattr(cfg, section), name)
        problem = option_value_problem(key, v)
        if problem:
            if problem.startswith("must be a finite") or problem in ("must be >= 0", "must be > 0"):  # (kind's range)
                problem = f"must be a finite number {'> 0' if key in POSITIVE_OPTIONS else '>= 0'}"
            shown = ",".join(f"{r:g}" for r in v) if isinstance(v, (list, tuple)) else repr(v)
            raise ValueError(f"{key} = {shown}: {problem} ({help_text})")
    if a.cv is not None and a.cv > MAX_CV:
        raise ValueError(f"cv = {a.cv:g}: at most {MAX_CV:g} (a gamma renewal process this bursty has gaps that "
                         f"underflow to 0); give e.g. cv = 2")


#: workload options that only some settings read: option -> (the setting, its values that read the option, what
#: the option does). Given with another value of the setting they would change nothing, so they are refused
#: (:func:`check_options_apply`).
SETTING_OPTIONS: dict[str, tuple[str, tuple[str, ...], str]] = {
    "cv": ("arrival", ("gamma", "fitted"), "the inter-arrival coefficient of variation of the gamma renewal process"),
    "on_s": ("arrival", ("onoff",), "the mean on-period of on/off bursts"),
    "off_s": ("arrival", ("onoff",), "the mean off-period of on/off bursts"),
    "off_frac": ("arrival", ("onoff",), "the rate while off of on/off bursts"),
    "rates": ("arrival", ("per-adapter",), "the per-adapter Poisson rates"),
    "shuffle_rates": ("arrival", ("per-adapter",), "the shuffling of the per-adapter rates"),
    "fit": ("arrival", ("fitted",), "the committed fit of arrival=fitted"),
    "length_method": ("lengths", ("sharegpt",), "the mean matching of the sharegpt length model"),
    "mean_turns": ("conversations", ("true",), "the mean turns of a synthetic conversation"),
    "max_turns": ("conversations", ("true",), "the most turns of a synthetic conversation"),
    "think_s": ("conversations", ("true",), "the user think time between synthetic turns"),
    "tpot_s": ("conversations", ("true",), "the reply time per output token between synthetic turns"),
}


def _shown(v: Any) -> str:
    return ",".join(f"{x:g}" if isinstance(x, float) else str(x) for x in v) if isinstance(v, (list, tuple)) else \
        (f"{v:g}" if isinstance(v, float) else str(v))


def check_options_apply(cfg: SynthConfig, given: dict[str, Any], source: str = "",
                        replay: bool = False) -> None:
    """Refuse a workload option of ``given`` (the options the caller gave, not a preset's) that the
    arrival process, length model or conversation mode of ``cfg`` does not read (e.g. ``cv`` with
    ``arrival=poisson``): a ``ValueError`` naming the option, the setting in force and the one that
    reads it. ``source``: where ``cfg``'s settings not given come from (e.g. "synthetic preset
    'chameleon'"); ``replay``: a real trace, which keeps its own arrivals unless ``arrival`` is given
    and has no synthetic conversations."""
    for key, (setting, values, what) in SETTING_OPTIONS.items():
        if key not in given or given[key] is None:
            continue
        if setting == "arrival":
            if replay and "arrival" not in given:
                raise ValueError(f"workload option {key}={_shown(given[key])} has no effect: it sets {what}, and "
                                 f"{source or 'the trace'} is replayed with its own arrival times (Poisson starts when "
                                 f"it has none); re-time it with arrival={values[0]}, or leave {key} out")
            current = cfg.arrivals.process
        elif setting == "lengths":
            current = "trace" if replay and cfg.lengths.dist == "trace" else cfg.lengths.dist.partition(":")[0].strip()
        else:
            if replay:
                continue  # (checked against the trace's format: traces.registry.check_conversation_options)
            current = "true" if cfg.conversations.enabled else "false"
        if current in values:
            continue
        chosen = setting in given
        where = "" if chosen else (f" (the default of {source})" if source else " (the default)")
        fix = f"{setting}={values[0]}" + (f" (or {' or '.join(values[1:])})" if values[1:] else "")
        raise ValueError(f"workload option {key}={_shown(given[key])} has no effect with {setting}={current}{where}: "
                         f"it sets {what}; give {fix}, or leave {key} out")
    if not replay and given.get("n_requests") is not None and given.get("duration") is not None:
        # (n_requests=5 with duration=1000 drew 5 requests over 2.5 s: the count replaces the window)
        raise ValueError(f"workload options n_requests={_shown(given['n_requests'])} and "
                         f"duration={_shown(given['duration'])}: n_requests draws exactly that many requests instead "
                         f"of those of a window of duration seconds, so duration would have no effect; give one of "
                         f"them")


def align_warmup(a: ArrivalConfig, warmup_s: float) -> float:
    """The warm-up to draw before the window's time 0 for the arrival process of ``a``: ``warmup_s`` as is,
    for every process. (It used to round a warm-up of ``arrival=fitted`` up to whole bins of the fit, as
    :func:`generate_arrivals` put the profile's time 0 at the window's by rotating the profile by whole bins;
    it now starts the periodic profile at an offset, :func:`traces.arrivals.cumulative_intensity`'s
    ``start_s``, which holds for any warm-up and for a fit whose last bin is partial. Kept for its callers.)"""
    return float(warmup_s)


def fitted_arrivals(name: str) -> Any:
    """The ``arrivals`` section of the committed fit ``name`` (:func:`traces.lengths.load_fitted`): a
    :class:`traces.lengths.FitSectionError` naming the fit and the fits that have the section when it has none,
    and an error naming a missing entry of the section (``mean_rps``, ``renewal_cv``, ``bin_s``, ``profile``)."""
    fa = load_fitted(name)["arrivals"]
    for key in ("mean_rps", "renewal_cv", "bin_s", "profile"):
        fa[key]  # (a missing entry: FitSectionError naming it)
    return fa


def generate_arrivals(a: ArrivalConfig, n_adapters: int, rng: np.random.Generator, rate_divisor: float = 1.0,
                      lead_s: float = 0.0) -> tuple[np.ndarray, np.ndarray | None, dict[str, Any]]:
    """Arrival times (and adapter ids for ``per-adapter``) of an :class:`ArrivalConfig`.

    ``rate_divisor`` divides the rate (conversation starts = request rate / expected turns).
    ``lead_s``: the first seconds of ``a.duration_s`` that come before the window's time 0 (the
    conversations' warm-up; the caller shifts the times by it). Only ``arrival=fitted`` reads it: its
    rate profile (periodic, :func:`traces.arrivals.cumulative_intensity`) starts ``lead_s`` before its
    own time 0, so that the profile's time 0 falls at the window's time 0 (before, the profile began at
    -warm-up, 750 s early with the default conversation settings). The profile's period is the fit's span
    (``duration_s``), its last bin lasting its real width, so the mean rate is the fitted one.
    """
    info: dict[str, Any] = {}
    rps = None if a.rps is None else a.rps / rate_divisor
    n = a.n_requests
    dur = None if n is not None else a.duration_s
    if a.process == "poisson":
        return arr.poisson(rps, rng, duration_s=dur, n=n), None, info
    if a.process == "gamma":
        cv = 2.0 if a.cv is None else a.cv
        info["cv"] = cv
        return arr.gamma_renewal(rps, cv, rng, duration_s=dur, n=n), None, info
    if a.process == "onoff":
        return arr.onoff(rps, rng, a.duration_s, a.on_s, a.off_s, a.off_frac), None, info
    if a.process == "per-adapter":
        rates = np.asarray(a.rates if a.rates else DEFAULT_RATES, float) / rate_divisor
        if a.rps is not None:  # scale the list so that the offered total is rps
            rates = rates * (rps / arr.assign_rates_round_robin(rates, n_adapters, None, False).sum())
        t, ids, ar = arr.per_adapter_poisson(rates, n_adapters, a.duration_s, rng, a.shuffle_rates)
        info["adapter_rates"] = [round(float(r), 9) for r in ar * rate_divisor]
        info["offered_rps"] = float(ar.sum() * rate_divisor)
        return t, ids, info
    if a.process == "fitted":
        fa = fitted_arrivals(a.fit)
        rps = (fa["mean_rps"] if a.rps is None else a.rps) / rate_divisor
        cv = fa["renewal_cv"] if a.cv is None else a.cv
        bin_s = float(fa["bin_s"])
        profile = np.asarray(fa["profile"], dtype=float)
        # the profile's period: the fit's span (its last bin partial, normalised by its real width); a fit without
        # one (written before the span was recorded) is taken as whole bins
        period = float(fa["duration_s"]) if fa.get("duration_s") is not None else profile.size * bin_s
        info.update(fit=a.fit, rps=rps * rate_divisor, cv=cv, bin_s=fa["bin_s"], period_s=period)
        if lead_s:
            info["profile_starts_at_s"] = float(lead_s)
        return arr.profiled_renewal(rps, cv, profile, bin_s, a.duration_s, rng, period_s=period,
                                    start_s=-float(lead_s)), None, info
    raise ValueError(f"unknown arrival process {a.process!r}")


def synthesize(cfg: SynthConfig, trace_lengths: Callable[[str], tuple[np.ndarray, np.ndarray]] | None = None,
               meta: dict[str, Any] | None = None) -> Workload:
    """Generate the workload ``cfg`` describes (deterministic in ``cfg.seed``).

    ``trace_lengths(name_or_path)`` loads a trace's lengths for ``lengths=empirical:...``.
    """
    validate_config(cfg)
    r_arr, r_ad, r_len, r_conv = (np.random.default_rng(s) for s in np.random.SeedSequence(cfg.seed).spawn(4))
    ad, lc, cc = cfg.adapters, cfg.lengths, cfg.conversations
    model = build_length_model(lc, trace_lengths)
    filt = lc.filter()
    draw = lambda m: sample_lengths(model, m, r_len, lc.scale, filt)  # noqa: E731
    divisor = cc.expected_turns() if cc.enabled else 1.0
    warm = align_warmup(cfg.arrivals, cc.warmup_s()) if cc.enabled and cfg.arrivals.n_requests is None else 0.0
    a_cfg = dataclasses.replace(cfg.arrivals, duration_s=cfg.arrivals.duration_s + warm) if warm else cfg.arrivals
    t, ids, info = generate_arrivals(a_cfg, ad.n_adapters, r_arr, divisor, lead_s=warm)
    extra: dict[str, np.ndarray] = {}
    if cc.enabled:
        conv = synthesize_conversations(t - warm, cc, r_conv, draw, lc.max_prompt, lc.max_total)
        start_idx = conv.pop("start_index")
        if ids is None:
            cid, crank = assign_adapters(t.size, ad.n_adapters, r_ad, ad.ranks, ad.popularity)
        else:
            cid, crank = ids, assign_ranks(ad.n_adapters, ad.ranks)[ids]
        a_s = conv["arrival_s"]
        keep = (a_s >= 0) & (a_s < cfg.arrivals.duration_s) if cfg.arrivals.n_requests is None else slice(None)
        conv = {k: v[keep] for k, v in conv.items()}
        start_idx = start_idx[keep]
        t, p, o = conv["arrival_s"], conv["prompt_tokens"], conv["output_tokens"]
        a_id, a_rank = cid[start_idx], crank[start_idx]
        extra = {k: conv[k] for k in ("conversation_id", "turn", "prefix_tokens")}
    else:
        p, o = draw(t.size)
        if ids is None:
            a_id, a_rank = assign_adapters(t.size, ad.n_adapters, r_ad, ad.ranks, ad.popularity)
        else:
            a_id, a_rank = ids, assign_ranks(ad.n_adapters, ad.ranks)[ids]
    m = {"source": "synthetic", "kind": "synthetic", "generator": GENERATOR, "seed": cfg.seed,
         "config": cfg.to_dict(), "lengths_model": model.describe(), "arrivals_info": info}
    if meta:
        m.update(meta)
    return Workload.from_arrays(t, p, o, a_id, a_rank, meta=m, **extra)
