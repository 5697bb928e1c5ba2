"""Arrival processes: when requests reach the server.

Every generator is vectorised numpy (no per-request Python loop) and takes an explicit
``numpy.random.Generator`` so a seed regenerates the same times.

* :func:`poisson` -- homogeneous Poisson process at a target rate (S-LoRA, Chameleon,
  FastLibra's synthetic set-ups). With a fixed window the count is ``Poisson(rps * T)`` and,
  given the count, the times are i.i.d. uniform on ``[0, T)`` (the order-statistics property
  of the Poisson process), which is what :func:`per_adapter_poisson` exploits.
* :func:`gamma_renewal` -- renewal process with gamma inter-arrivals of mean ``1/rps`` and
  coefficient of variation ``cv`` (shape ``k = 1/cv**2``, scale ``cv**2/rps``); ``cv = 1`` is
  Poisson, ``cv > 1`` bursty (the bursty set-ups of AlpaServe / S-LoRA's "gamma arrivals"); with
  ``stationary`` observed from a random moment (the equilibrium renewal process).
* :func:`parse_arrival` -- an arrival-process name (``poisson``, ``gamma:CV``) as the sweep's
  ``arrival`` axis takes it, and :func:`per_adapter_arrivals`, one such stream per adapter.
* :func:`onoff` -- a two-state Markov-modulated Poisson process (on/off bursts): exponential
  on and off periods of means ``on_s``/``off_s``; rate ``r_on`` while on and
  ``off_frac * r_on`` while off, with ``r_on`` chosen so that the long-run mean rate is
  ``rps``: ``rps = r_on * (on_s + off_frac * off_s) / (on_s + off_s)``. Started in its
  stationary state, so the expected count in any window is ``rps`` x its length.
* :func:`per_adapter_poisson` -- the published adapter twin's set-up (Agullo et al. 2025,
  ``benchmark_serving_by_time.py``): the rates of a list such as ``{0.1, 0.05, 0.025}`` req/s
  are assigned round-robin to the adapters and shuffled, and every adapter sends an
  independent Poisson stream at its rate.
* :func:`profiled_renewal` -- a gamma renewal process in *operational time* mapped through
  the inverse of a piecewise-linear cumulative intensity ``Lambda(t)`` (time change of a
  point process); it keeps a fitted rate-over-time profile and a fitted burstiness at once.
  Used by the ``splitwise-synth`` generator (see :mod:`traces.fit`).
* :func:`rescale_to_rps` / :func:`time_window` -- trace replay: multiply all times by one
  factor so the mean rate becomes the target (the relative shape -- rate profile, CV of the
  inter-arrivals -- is unchanged), and cut a time window.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from traces.arguments import is_real_number, is_whole_number


class ArrivalError(ValueError):
    """Invalid arrival-process parameters."""


#: most arrivals one call may generate (expected count, or ``n``): 8 bytes each, so 2e9 is 16 GB;
#: a rate x window beyond it is almost surely a unit mistake (ms for s, a total for a rate)
MAX_ARRIVALS = 2_000_000_000


def check_rng(rng: Any, name: str = "rng") -> None:
    """``TypeError`` unless ``rng`` is a ``numpy.random.Generator`` (a seed or the legacy
    ``RandomState`` would fail deep inside numpy, or draw another stream)."""
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"{name}: got {type(rng).__name__}; give a numpy.random.Generator, e.g. "
                        f"numpy.random.default_rng(0)")


def check_count(v: Any, name: str, low: int = 0) -> int:
    """``v`` as an int when it is a whole number >= ``low`` (numpy's too); else :class:`ArrivalError`
    (a fraction would be truncated silently)."""
    if not is_whole_number(v) or v < low:
        raise ArrivalError(f"{name} must be a whole number >= {low}, got {v!r}")
    return int(v)


def _check_expected(count: float, what: str, noun: str = "arrivals") -> None:
    if count > MAX_ARRIVALS:
        raise ArrivalError(f"{what} gives about {count:.3g} {noun}, beyond the {MAX_ARRIVALS:.0e} one call may "
                           f"generate; check the units (req/s, seconds) or generate the trace in windows")


def _check_window(rps: float, duration_s: float | None, n: int | None) -> None:
    if not (is_real_number(rps) and np.isfinite(rps) and rps > 0):
        raise ArrivalError(f"arrival rate must be > 0 req/s, got {rps!r}")
    if (duration_s is None) == (n is None):
        raise ArrivalError("give exactly one of duration_s (a time window) or n (a request count)")
    if duration_s is not None and not (is_real_number(duration_s) and np.isfinite(duration_s) and duration_s > 0):
        raise ArrivalError(f"duration_s must be > 0 seconds, got {duration_s!r}")
    if n is not None:
        _check_expected(check_count(n, "request count n"), f"n={n!r}")
    else:
        _check_expected(rps * duration_s, f"rate {rps!r} req/s over duration_s={duration_s!r}")


def poisson(rps: float, rng: np.random.Generator, duration_s: float | None = None,
            n: int | None = None) -> np.ndarray:
    """Sorted arrival times (s) of a homogeneous Poisson process at ``rps`` req/s.

    With ``duration_s``: ``N ~ Poisson(rps * duration_s)`` uniform times on ``[0, duration_s)``.
    With ``n``: exactly ``n`` arrivals, the cumulative sum of ``Exp(1/rps)`` gaps.
    """
    _check_window(rps, duration_s, n)
    check_rng(rng)
    if n is not None:
        return np.cumsum(rng.exponential(1.0 / rps, size=int(n)))
    count = int(rng.poisson(rps * duration_s))
    return np.sort(rng.uniform(0.0, duration_s, size=count))


def _renewal(gap_sampler, mean_gap: float, rng: np.random.Generator, duration_s: float | None,
             n: int | None, first: float = 0.0) -> np.ndarray:
    """Cumulative sum of i.i.d. gaps until ``n`` arrivals or the end of ``duration_s``; with ``first`` > 0 the
    first arrival is at ``first`` and the gaps follow it (a stationary start, :func:`gamma_renewal`)."""
    if n is not None:
        if first > 0.0:
            return first + np.concatenate(([0.0], np.cumsum(gap_sampler(int(n) - 1)))) if n else np.zeros(0)
        return np.cumsum(gap_sampler(int(n)))
    if first >= duration_s:
        return np.zeros(0)
    expected = duration_s / mean_gap
    chunks: list[np.ndarray] = [np.array([first])] if first > 0.0 else []
    t0 = first
    while True:
        m = int(expected * 1.1 + 10.0 * np.sqrt(expected) + 64)
        t = t0 + np.cumsum(gap_sampler(m))
        chunks.append(t)
        if t[-1] >= duration_s:
            break
        t0 = float(t[-1])
        expected = max((duration_s - t0) / mean_gap, 1.0)
    out = np.concatenate(chunks)
    return out[out < duration_s]


#: the coefficients of variation a gamma renewal process takes: its gaps have shape ``1/cv**2``;
#: beyond these the gaps underflow to 0 (cv large: the window is never filled, a hang) or the
#: shape overflows (cv small: use a fixed spacing instead)
MIN_CV, MAX_CV = 1e-3, 100.0


def gamma_renewal(rps: float, cv: float, rng: np.random.Generator, duration_s: float | None = None,
                  n: int | None = None, stationary: bool = False) -> np.ndarray:
    """Arrival times of a gamma renewal process: mean rate ``rps``, inter-arrival CV ``cv``.

    Gamma gaps with shape ``k = 1/cv**2`` and scale ``theta = cv**2 / rps`` (mean ``1/rps``,
    CV ``cv``); ``cv = 1`` reduces to :func:`poisson`.

    By default the process starts with a gap at 0 (an *ordinary* renewal process: time 0 is an arrival
    epoch). With ``stationary`` it is observed from a random moment of a process running since long before
    (the *equilibrium* renewal process, whose arrivals have rate ``rps`` at every ``t``, also at the window's
    start): the first arrival is at ``U * L`` with ``U`` uniform on ``[0, 1)`` and ``L`` the length-biased
    gap, gamma of shape ``k + 1`` and the same scale (the gap that covers a random moment; its residual is
    uniform along it). The difference matters when a window holds few gaps, e.g. an adapter at 0.003125
    req/s in a one-hour window: with ``cv = 4`` half of the gaps are below ``1.4e-4 / rps``, so an ordinary
    start sends half of such adapters' first requests in the window's first 0.05 s, all at once; the
    equilibrium start spreads them as a server that has been running sees them.
    """
    _check_window(rps, duration_s, n)
    check_rng(rng)
    if not (is_real_number(cv) and MIN_CV <= cv <= MAX_CV):
        raise ArrivalError(f"coefficient of variation cv must be in [{MIN_CV:g}, {MAX_CV:g}] (1: Poisson, > 1: "
                           f"bursty), got {cv!r}")
    shape, scale = 1.0 / cv**2, cv**2 / rps
    first = 0.0
    if stationary:
        first = float(rng.uniform()) * float(rng.gamma(shape + 1.0, scale))
        if first <= 0.0:  # (a zero draw: the start is an arrival epoch after all)
            first = float(np.nextafter(0.0, 1.0))
    return _renewal(lambda m: rng.gamma(shape, scale, size=m), 1.0 / rps, rng, duration_s, n, first)


def onoff(rps: float, rng: np.random.Generator, duration_s: float, on_s: float = 10.0, off_s: float = 30.0,
          off_frac: float = 0.0) -> np.ndarray:
    """On/off bursts: a two-state MMPP whose mean rate is ``rps`` in every window.

    Periods alternate with exponential lengths of means ``on_s`` and ``off_s``. The on-rate is
    ``r_on = rps * (on_s + off_s) / (on_s + off_frac * off_s)`` and the off-rate ``off_frac * r_on``;
    given the periods, arrivals are Poisson (thinning of one homogeneous stream at ``r_on``: points in
    off periods are kept with probability ``off_frac``).

    The process is observed from a random moment of its steady state (the stationary alternating
    renewal process; Ross, *Stochastic Processes*, 2nd ed., ch. 3: alternating and equilibrium renewal
    processes): time 0 is in an on period with probability ``on_s / (on_s + off_s)``, and the rest of that
    period has the equilibrium (residual-life) law of its length, ``F_e(x) = (1/mu) int_0^x (1 - F(y)) dy``,
    which for an exponential length is the same exponential (memorylessness), so the first period is drawn
    like any other of its state. The expected count in ``[0, T)`` is then exactly ``rps * T`` for every
    ``T``. (The process used to start at the beginning of an on period, so short windows overshot ``rps``:
    ``rps=2, on_s=10, off_s=30`` gave 2.15 req/s over 300 s and 3.46 over 30 s.) Without off periods
    (``off_s = 0``) it is a Poisson process at ``rps`` and draws as before.
    """
    _check_window(rps, duration_s, None)
    check_rng(rng)
    if not (is_real_number(on_s) and is_real_number(off_s) and is_real_number(off_frac) and 0 < on_s < math.inf and 0 <= off_s < math.inf
            and 0.0 <= off_frac <= 1.0):
        raise ArrivalError(f"onoff needs finite on_s > 0, off_s >= 0 and 0 <= off_frac <= 1 "
                           f"(got on_s={on_s!r}, off_s={off_s!r}, off_frac={off_frac!r})")
    _check_expected(2 * duration_s / (on_s + off_s), f"on/off periods of on_s={on_s!r} + off_s={off_s!r} s over "
                                                     f"duration_s={duration_s!r}", "periods")
    if off_frac == 0 and off_s > 0:
        _check_expected(rps * duration_s * (on_s + off_s) / on_s, f"rate {rps!r} req/s in on periods")
    r_on = rps * (on_s + off_s) / (on_s + off_frac * off_s)
    # the state at time 0: on with the stationary probability on_s / (on_s + off_s) (always on without off periods)
    start_on = off_s == 0 or bool(rng.random() < on_s / (on_s + off_s))
    first_mean, second_mean = (on_s, off_s) if start_on else (off_s, on_s)
    # alternating period boundaries from the starting state: on, off, on, ... or off, on, off, ...
    n_cycles = int(duration_s / (on_s + off_s) * 1.5 + 10 * np.sqrt(duration_s / (on_s + off_s)) + 8)
    bounds = [np.zeros(1)]
    t_end = 0.0
    while t_end < duration_s:
        lengths = np.empty(2 * n_cycles)
        lengths[0::2] = rng.exponential(first_mean, n_cycles)
        lengths[1::2] = rng.exponential(second_mean, n_cycles) if second_mean > 0 else 0.0
        b = t_end + np.cumsum(lengths)
        bounds.append(b)
        t_end = float(b[-1])
    edges = np.concatenate(bounds)  # edges[i]..edges[i+1] is in the starting state when i is even
    count = int(rng.poisson(r_on * duration_s))
    t = np.sort(rng.uniform(0.0, duration_s, size=count))
    state_on = ((np.searchsorted(edges, t, side="right") - 1) % 2 == 0) == start_on
    keep = state_on | (rng.random(count) < off_frac)
    return t[keep]


def assign_rates_round_robin(rates: Sequence[float], n_adapters: int, rng: np.random.Generator | None,
                             shuffle: bool = True) -> np.ndarray:
    """Per-adapter rates: ``rates`` assigned round-robin to ``n_adapters``, then shuffled.

    This is the published adapter twin's client (rates list cycled over the adapters, then a
    random permutation, independent of the adapters' ranks).
    """
    given = rates
    try:
        rates = np.asarray(list(rates), dtype=float)
    except (TypeError, ValueError):
        rates = np.zeros(0)
    if isinstance(given, str) or rates.size == 0 or (rates <= 0).any() or not np.isfinite(rates).all():
        raise ArrivalError(f"per-adapter rates must be a non-empty list of positive req/s, e.g. [0.1, 0.05], got "
                           f"{given!r}")
    n_adapters = check_count(n_adapters, "per-adapter rates: n_adapters", low=1)
    out = rates[np.arange(n_adapters) % rates.size]
    if shuffle:
        if rng is None:
            raise ArrivalError("shuffling the per-adapter rates needs a random generator")
        check_rng(rng)
        out = rng.permutation(out)
    return out


def per_adapter_poisson(rates: Sequence[float], n_adapters: int, duration_s: float, rng: np.random.Generator,
                        shuffle: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Independent Poisson streams, one per adapter, with rates cycled from ``rates``.

    Returns ``(times, adapter_ids, adapter_rates)`` sorted by time; ``adapter_rates[a]`` is the
    rate of adapter ``a``. Vectorised and exact: ``N_a ~ Poisson(r_a T)`` independently; given
    the counts, the pooled points are i.i.d. uniform on ``[0, T)`` with exchangeable labels, so
    the sorted times get a uniformly random permutation of the labels (no argsort), and 1.3 M
    arrivals take about 0.1 s.
    """
    _check_window(1.0, duration_s, None)
    check_rng(rng)
    ar = assign_rates_round_robin(rates, n_adapters, rng, shuffle)
    t, ids = per_adapter_arrivals(ar, duration_s, ArrivalProcess("poisson"), rng)
    return t, ids, ar


#: the arrival processes a per-adapter stream takes by name (the sweep grid's ``arrival`` axis)
ARRIVAL_HELP = ("poisson (independent Poisson streams per adapter: the published runs) | gamma:CV (per-adapter "
                "gamma renewal streams with inter-arrival coefficient of variation CV, observed in steady state; "
                "CV > 1 is bursty, e.g. gamma:2)")


@dataclass(frozen=True)
class ArrivalProcess:
    """A per-adapter arrival process by name (:func:`parse_arrival`): ``kind`` ``poisson`` or ``gamma``, and the
    gamma gaps' coefficient of variation ``cv`` (1 for Poisson)."""

    kind: str
    cv: float = 1.0

    @property
    def name(self) -> str:
        """The canonical name: ``poisson`` or ``gamma:<cv>`` (``gamma:2.0`` and ``gamma:2`` are both ``gamma:2``)."""
        return "poisson" if self.kind == "poisson" else f"gamma:{self.cv:g}"


def parse_arrival(name: Any) -> ArrivalProcess:
    """``poisson`` or ``gamma:CV`` (CV within [:data:`MIN_CV`, :data:`MAX_CV`]) as an :class:`ArrivalProcess`;
    anything else is an :class:`ArrivalError` naming the accepted forms."""
    text = str(name).strip().lower() if isinstance(name, str) else None
    if text == "poisson":
        return ArrivalProcess("poisson")
    if text is not None and text.startswith("gamma:"):
        arg = text[len("gamma:"):].strip()
        try:
            cv = float(arg)
        except ValueError:
            cv = math.nan
        if not (math.isfinite(cv) and MIN_CV <= cv <= MAX_CV):
            raise ArrivalError(f"arrival process {name!r}: the coefficient of variation must be a number in "
                               f"[{MIN_CV:g}, {MAX_CV:g}] (1: as random as Poisson, > 1: bursty), e.g. gamma:2")
        return ArrivalProcess("gamma", cv)
    raise ArrivalError(f"unknown arrival process {name!r}; use {ARRIVAL_HELP}")


def per_adapter_arrivals(adapter_rates: Sequence[float], duration_s: float, process: ArrivalProcess,
                         rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Independent streams of ``process``, one per adapter at its rate ``adapter_rates[a]`` over ``[0,
    duration_s)``: ``(times, adapter_ids)`` sorted by time (ties in adapter order).

    A gamma stream is the equilibrium renewal process (:func:`gamma_renewal` with ``stationary``): the window
    is a stretch of a server's steady traffic, each adapter's gaps as bursty at the window's start as later.
    Poisson streams are drawn as :func:`per_adapter_poisson` draws them (counts, then uniform times)."""
    _check_window(1.0, duration_s, None)
    check_rng(rng)
    ar = np.asarray(adapter_rates, dtype=float)
    if ar.ndim != 1 or not ar.size or not np.isfinite(ar).all() or (ar <= 0).any():
        raise ArrivalError(f"per-adapter rates must be a non-empty list of positive req/s, got {adapter_rates!r}")
    _check_expected(float(ar.sum()) * duration_s, f"per-adapter rates summing to {float(ar.sum()):g} req/s over "
                                                   f"duration_s={duration_s!r}")
    if process.kind == "poisson":
        counts = rng.poisson(ar * duration_s)
        ids = rng.permutation(np.repeat(np.arange(ar.size, dtype=np.int64), counts))
        return np.sort(rng.uniform(0.0, duration_s, size=ids.size)), ids
    streams = [gamma_renewal(float(r), process.cv, rng, duration_s=duration_s, stationary=True) for r in ar]
    t = np.concatenate(streams) if streams else np.zeros(0)
    ids = np.repeat(np.arange(ar.size, dtype=np.int64), [len(x) for x in streams])
    order = np.argsort(t, kind="stable")
    return t[order], ids[order]


def cumulative_intensity(profile: Sequence[float], bin_s: float, duration_s: float, period_s: float | None = None,
                         start_s: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Knots ``(t, Lambda(t))`` of the piecewise-linear cumulative intensity of a rate profile.

    ``profile[j]`` is the relative rate in bin ``[j*bin_s, (j+1)*bin_s)``, the last bin ending at ``period_s``,
    where the profile starts again (it is periodic). ``period_s`` defaults to whole bins (``len(profile) *
    bin_s``); a profile fitted by :func:`rate_profile` over a span that is no whole number of bins ends with a
    partial bin, normalised by its real width, so its period is that span (the fit's ``duration_s``): the
    mean of the relative rate over a period is then 1, and the process's mean rate over whole periods the fitted
    one. (With whole bins the partial bin lasted a full ``bin_s``: the Splitwise conv fit's last bin, 21.7 s at
    0.308 x the mean, lasted 60 s, and a period averaged 0.75 % below the fitted rate.) A window that is no whole
    number of periods averages the profile over what it covers: one hour of the conv fit repeats its first 98 s,
    below the mean. ``period_s`` must lie in ``((len(profile) - 1) * bin_s, len(profile) * bin_s]``.

    ``start_s``: the profile's phase at ``t = 0`` (seconds into its period; any real number, taken modulo
    ``period_s``): real time ``t`` has the rate of profile time ``start_s + t``. The knots cover ``[0,
    duration_s]`` (the last one at or past it). ``Lambda`` is in "operational seconds", ``Lambda(0) = 0``: a
    unit-rate process in operational time maps to rate ``profile(t)`` in real time.
    """
    try:
        prof = np.asarray(profile, dtype=float).ravel()
    except (TypeError, ValueError):
        prof = np.zeros(0)
    if prof.size == 0 or not (np.isfinite(prof).all() and (prof >= 0).all()) or not (
            is_real_number(bin_s) and 0 < bin_s < math.inf):
        raise ArrivalError(f"a rate profile needs >= 1 finite non-negative relative rates and bin_s > 0 (got "
                           f"{prof.size} rate(s), bin_s={bin_s!r})")
    if not (is_real_number(duration_s) and 0 <= duration_s < math.inf):
        raise ArrivalError(f"a rate profile's duration_s must be a finite number of seconds >= 0, got {duration_s!r}")
    full = prof.size * float(bin_s)
    if period_s is None:
        period = full
    else:
        lo = (prof.size - 1) * float(bin_s)
        if not (is_real_number(period_s) and lo < period_s <= full * (1.0 + 1e-12)):
            raise ArrivalError(f"a rate profile of {prof.size} bins of {bin_s!r} s has a period in ({lo:g}, {full:g}] "
                               f"s (its last bin may be partial), got period_s={period_s!r}")
        period = min(float(period_s), full)
    if not (is_real_number(start_s) and math.isfinite(start_s)):
        raise ArrivalError(f"a rate profile's start_s must be a finite number of seconds, got {start_s!r}")
    _check_expected(duration_s / bin_s, f"bins of bin_s={bin_s!r} s over duration_s={duration_s!r}", "bins")
    prof = np.maximum(prof, 1e-9)  # keep Lambda strictly increasing so it can be inverted
    # one period: bin edges (the last bin ends at the period) and Lambda at them
    edges = np.minimum(np.arange(prof.size + 1) * float(bin_s), period)
    edges[-1] = period
    lam_p = np.concatenate([[0.0], np.cumsum(prof * np.diff(edges))])
    phase0 = float(start_s) % period
    end = phase0 + float(duration_s)  # profile time of the window's end, counted from the start's period
    periods = int(np.ceil(end / period)) + 1
    k = np.repeat(np.arange(periods), prof.size)
    u = k * period + np.tile(edges[:-1], periods)  # the bin starts of ``periods`` periods
    lam_u = k * lam_p[-1] + np.tile(lam_p[:-1], periods)
    # the last knot: the first at or past the end (and past the start, so that there are two)
    last = max(int(np.searchsorted(u, end, side="left")), int(np.searchsorted(u, phase0, side="right")))
    inner = (u > phase0) & (np.arange(u.size) <= last)
    lam0 = float(np.interp(phase0, edges, lam_p))
    t = np.concatenate([[0.0], u[inner] - phase0])
    lam = np.concatenate([[0.0], lam_u[inner] - lam0])
    return t, lam


def profiled_renewal(rps: float, cv: float, profile: Sequence[float], bin_s: float, duration_s: float,
                     rng: np.random.Generator, period_s: float | None = None, start_s: float = 0.0) -> np.ndarray:
    """Gamma renewal (mean rate ``rps``, CV ``cv``) in operational time, warped by a rate profile.

    ``t_i = Lambda^{-1}(tau_i)`` with ``tau`` a gamma renewal process and ``Lambda`` from
    :func:`cumulative_intensity` (``period_s``: the profile's period, the fit's span for a fitted profile
    whose last bin is partial; ``start_s``: the profile's phase at time 0): the rate over time follows
    ``rps * profile`` and the local burstiness (CV within a bin) is ``cv``.
    """
    t_k, lam_k = cumulative_intensity(profile, bin_s, duration_s, period_s, start_s)
    lam_end = float(np.interp(duration_s, t_k, lam_k))
    tau = gamma_renewal(rps, cv, rng, duration_s=lam_end)
    return np.interp(tau, lam_k, t_k)


def rescale_to_rps(times: np.ndarray, target_rps: float) -> tuple[np.ndarray, float]:
    """Replay times scaled by one factor so the mean rate becomes ``target_rps``.

    The mean rate of a trace is ``n / (t_last - t_first)`` (times are first shifted to start at
    0); the factor is ``current_rps / target_rps``. A pure time scaling keeps the trace's shape:
    the normalised rate profile and the inter-arrival CV are unchanged. Returns
    ``(scaled_times, factor)``.
    """
    t = np.asarray(times, dtype=float)
    if not (is_real_number(target_rps) and np.isfinite(target_rps) and target_rps > 0):
        raise ArrivalError(f"target rate must be > 0 req/s, got {target_rps!r}")
    if not np.isfinite(t).all():
        raise ArrivalError(f"arrival times must be finite; {int((~np.isfinite(t)).sum())} are NaN or infinite")
    if t.size < 2:
        return t - (t[0] if t.size else 0.0), 1.0
    t = t - t.min()
    span = float(t.max())
    if span <= 0:
        raise ArrivalError(f"cannot rescale to --rps {target_rps:g} a trace whose {t.size} arrivals all share one "
                           f"timestamp: a burst has no rate to scale; replay it as it is (twin run without --rps), or "
                           f"spread its arrival times")
    factor = (t.size / span) / target_rps
    return t * factor, factor


def time_window(times: np.ndarray, start_s: float = 0.0, duration_s: float | None = None) -> np.ndarray:
    """Boolean mask of arrivals in ``[start_s, start_s + duration_s)`` (open end when None)."""
    t = np.asarray(times, dtype=float)
    if not (math.isfinite(start_s) and start_s >= 0) or (duration_s is not None and not duration_s > 0):
        raise ArrivalError(f"a time window needs a finite start_s >= 0 (window_start) and duration_s > 0 (duration) "
                           f"(got {start_s}, {duration_s})")
    mask = t >= start_s
    if duration_s is not None:
        mask &= t < start_s + duration_s
    return mask


def interarrival_cv(times: np.ndarray) -> float:
    """Coefficient of variation (std/mean) of the gaps between sorted arrivals (NaN if < 3)."""
    t = np.sort(np.asarray(times, dtype=float))
    if t.size < 3:
        return float("nan")
    g = np.diff(t)
    m = g.mean()
    return float(g.std() / m) if m > 0 else float("nan")


#: the fewest requests an adapter needs for :func:`per_adapter_interarrival_cv` to count its gaps' CV
MIN_ADAPTER_REQUESTS = 10


def per_adapter_interarrival_cv(times: np.ndarray, adapter_ids: np.ndarray,
                                min_requests: int = MIN_ADAPTER_REQUESTS) -> tuple[float, int]:
    """``(median CV, adapters)``: the coefficient of variation of each adapter's own inter-arrival gaps
    (:func:`interarrival_cv` of its requests), its median over the adapters with at least ``min_requests``
    requests, and how many those are (``(NaN, 0)`` when none has). What the sweep's ``arrival = ["gamma:CV"]``
    sets per adapter: 1 for independent Poisson streams (or any trace whose requests pick their adapter
    independently of time), above 1 where an adapter's requests come in bursts. Adapter ids below 0 (the base
    model) are left out."""
    t = np.asarray(times, dtype=float)
    ids = np.asarray(adapter_ids, dtype=np.int64)
    keep = ids >= 0
    t, ids = t[keep], ids[keep]
    if t.size < 2:
        return float("nan"), 0
    order = np.lexsort((t, ids))
    t, ids = t[order], ids[order]
    same = ids[1:] == ids[:-1]
    g, a = np.diff(t)[same], ids[1:][same]
    _, a = np.unique(a, return_inverse=True)
    n = np.bincount(a).astype(float)
    s1, s2 = np.bincount(a, g), np.bincount(a, g * g)
    ok = n + 1 >= max(int(min_requests), 3)
    mean = s1[ok] / n[ok]
    var = np.maximum(s2[ok] / n[ok] - mean * mean, 0.0)
    pos = mean > 0
    cv = np.sqrt(var[pos]) / mean[pos]
    return (float(np.median(cv)), int(cv.size)) if cv.size else (float("nan"), 0)


def rate_profile(times: np.ndarray, bin_s: float, duration_s: float | None = None) -> np.ndarray:
    """Relative rate per ``bin_s`` bin (count / (mean rate * bin width)), mean 1 over the span.

    The last bin is normalised by its actual width (a partial bin is not under-counted), so the profile's
    period is the span, not whole bins: give it as :func:`cumulative_intensity`'s ``period_s``.
    """
    t = np.asarray(times, dtype=float)
    if not (is_real_number(bin_s) and 0 < bin_s < math.inf):
        raise ArrivalError(f"rate profile: bin_s must be a finite number of seconds > 0, got {bin_s!r}")
    if not np.isfinite(t).all():
        raise ArrivalError(f"rate profile: arrival times must be finite; {int((~np.isfinite(t)).sum())} are NaN or "
                           f"infinite")
    if t.size == 0:
        return np.zeros(0)
    span = float(duration_s if duration_s is not None else t.max())
    if not math.isfinite(span):
        raise ArrivalError(f"rate profile: duration_s must be finite, got {duration_s!r}")
    _check_expected(span / bin_s, f"bins of bin_s={bin_s!r} s over {span:g} s", "bins")
    if span <= 0:
        raise ArrivalError("rate profile needs a positive time span")
    nb = max(int(np.ceil(span / bin_s)), 1)
    counts = np.bincount(np.minimum((t / bin_s).astype(np.int64), nb - 1), minlength=nb)[:nb]
    widths = np.minimum(bin_s, span - np.arange(nb) * bin_s)
    widths = np.where(widths > 0, widths, bin_s)
    mean_rate = t.size / span
    return counts / (mean_rate * widths)
