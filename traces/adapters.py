"""Adapters: how many, which ranks, and which adapter each request asks for.

Ranks (Chameleon, Iliakopoulou et al., MICRO'25): ``N`` adapters over a list of ranks,
default ``8, 16, 32, 64, 128`` with ``N/5`` adapters each. Ranks are cycled round-robin over
adapter ids (``rank[a] = ranks[a % len(ranks)]``), which is also how the published adapter
twin's vLLM fork creates its ``--max-cpu-loras`` adapters from ``--dummy-lora-modules``: a list
with repeats such as ``8, 8, 16`` gives 2/3 rank 8 and 1/3 rank 16.

Popularity specs (:func:`parse_popularity`), all a distribution over *popularity positions*
``i = 0..M-1`` (0 = most popular):

* ``uniform`` (``U``): ``p_i = 1/M``.
* ``powerlaw[:alpha]`` (``P``; default ``alpha = 0.5``): the S-LoRA power law (Sheng et al.,
  MLSys 2024, ``benchmarks/trace.py``; Chameleon's U-P uses a power law whose exponent it does not
  give): a request's position is ``floor(M * X)`` with
  ``X ~ Power(alpha)`` (density ``alpha x^(alpha-1)`` on [0, 1], numpy's ``rng.power``), so
  ``P(i < k) = (k/M)^alpha`` and ``p_i = ((i+1)/M)^alpha - (i/M)^alpha``. ``alpha = 1`` is
  uniform, smaller ``alpha`` is more skewed (top-1 share ``M^-alpha``). The default 0.5 is the
  twin's assumption, inside S-LoRA's sweep (0.1, 0.3, 0.6, 1; its a10g suite runs at 1), not a
  value either paper gives for its main set-up.
* ``zipf[:s]`` (``Z``; default ``s = 1.0``): Zipf's law over the positions,
  ``p_i = (i+1)^-s / H_{M,s}`` (top-1 share ``1/H_{M,s}``).
* ``skewed[:x]`` (default ``x = 0.1``): FastLibra's Skewed-x (Zhang et al., 2025): a
  Gaussian over the adapter index with standard deviation ``x * M`` centred at ``(M-1)/2``,
  discretised per index and truncated to ``[0, M)``; smaller ``x`` is more skewed.
* ``distinct``: FastLibra's Distinct: request ``j`` (in arrival order) goes to adapter
  ``j mod N`` (round-robin, every adapter equally often and never twice in a row).
* ``bursty[:B]`` (default ``B = 50``): the adaptive-LoRA-caching study's "bursty" pattern,
  whose parameters the study does not give (Dasari et al. §3; these are assumptions): the
  requests, in arrival order, are cut into bursts of ``B`` consecutive requests; each burst
  draws a hot set of ``max(1, round(N * BURST_HOT_FRACTION))`` adapters uniformly at random,
  sends a share :data:`BURST_HOT_SHARE` of its requests to it (uniform within the set) and the
  rest uniformly over all adapters. Over a long run every adapter is equally popular; what
  changes is which few are hot at a time, so recency matters more than frequency.

For the single-level forms the popularity positions are mapped to adapter ids through a
seeded random permutation, so popularity is independent of the rank. Two-level specs
``R-A`` (Chameleon's U-U, U-P, P-P; any two of the forms above, e.g. ``P:0.3-zipf:1.2``) first
draw a *rank* with distribution ``R`` over the distinct ranks in the order given (first =
most popular), then an adapter of that rank with distribution ``A``.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from traces.arrivals import check_rng

DEFAULT_RANKS: tuple[int, ...] = (8, 16, 32, 64, 128)
DEFAULT_POWERLAW_ALPHA = 0.5
DEFAULT_ZIPF_S = 1.0
DEFAULT_SKEW_X = 0.1
DEFAULT_BURST_REQUESTS = 50
#: ``bursty``: share of a burst's requests that go to its hot set, and the hot set's size as a
#: fraction of the adapters (assumptions: the adaptive-caching study gives no burst parameters)
BURST_HOT_SHARE = 0.9
BURST_HOT_FRACTION = 0.1

_ALIASES = {"u": "uniform", "uniform": "uniform", "p": "powerlaw", "powerlaw": "powerlaw", "power-law": "powerlaw",
            "power": "powerlaw", "z": "zipf", "zipf": "zipf", "skewed": "skewed", "skew": "skewed",
            "s": "skewed", "distinct": "distinct", "round-robin": "distinct", "roundrobin": "distinct",
            "d": "distinct", "bursty": "bursty", "burst": "bursty"}
_DEFAULT_PARAM = {"uniform": None, "powerlaw": DEFAULT_POWERLAW_ALPHA, "zipf": DEFAULT_ZIPF_S,
                  "skewed": DEFAULT_SKEW_X, "distinct": None, "bursty": DEFAULT_BURST_REQUESTS}
POPULARITY_HELP = ("uniform | powerlaw[:alpha] | zipf[:s] | skewed[:x] | distinct | bursty[:B] | R-A two-level over "
                   "ranks then adapters, e.g. U-U, U-P, P-P, P:0.3-zipf:1.2")
#: laws that depend on the arrival order (not a fixed distribution): single-level only
SEQUENTIAL_LAWS = ("distinct", "bursty")


class PopularityError(ValueError):
    """A popularity spec that cannot be parsed or used."""


@dataclass(frozen=True)
class Dist:
    """One popularity law over positions (see the module docstring)."""

    kind: str
    param: float | None = None

    def label(self) -> str:
        return self.kind if self.param is None else f"{self.kind}:{self.param:g}"


@dataclass(frozen=True)
class Popularity:
    """A parsed popularity spec: one law over adapters, or a rank law then an adapter law."""

    adapter: Dist
    rank: Dist | None = None

    def label(self) -> str:
        return self.adapter.label() if self.rank is None else f"{self.rank.label()}-{self.adapter.label()}"


def _parse_dist(text: str, spec: str) -> Dist:
    name, colon, arg = text.strip().partition(":")
    kind = _ALIASES.get(name.strip().lower())
    if kind is None:
        raise PopularityError(f"unknown popularity law {name!r} in {spec!r}; use {POPULARITY_HELP}")
    if colon and not arg.strip():  # (it read as the law's default parameter)
        raise PopularityError(f"popularity {spec!r}: a ':' with no parameter after it; give the parameter (e.g. "
                              f"{name.strip()}:1.2) or the law alone for its default")
    if arg:
        if kind in ("uniform", "distinct"):
            raise PopularityError(f"popularity {kind!r} takes no parameter (got {spec!r})")
        try:
            param = float(arg)
        except ValueError as e:
            raise PopularityError(f"popularity parameter {arg!r} in {spec!r} is not a number") from e
        if not np.isfinite(param) or param < 0 or (kind in ("powerlaw", "skewed") and param == 0):
            raise PopularityError(f"popularity parameter of {kind} must be > 0 (>= 0 for zipf), got {param}")
        if kind == "bursty" and (param < 1 or not param.is_integer()):
            raise PopularityError(f"bursty:B takes the burst length in requests, an integer >= 1 (got {arg!r})")
        return Dist(kind, param)
    return Dist(kind, _DEFAULT_PARAM[kind])


def parse_popularity(spec: str | Popularity | None) -> Popularity:
    """Parse ``"uniform"``, ``"powerlaw:0.5"``, ``"zipf:1.2"``, ``"skewed:0.1"``, ``"distinct"``,
    ``"U-P"``, ``"P-P"``, ``"P:0.3-zipf:1.2"``... (case-insensitive)."""
    if isinstance(spec, Popularity):
        return spec
    if spec is None or not str(spec).strip():
        spec = "powerlaw"
    s = str(spec).strip()
    if s.lower() in ("power-law",):
        return Popularity(_parse_dist("powerlaw", s))
    if ":-" in s:  # ("zipf:-1" would otherwise read as the two-level spec "zipf:" then "1")
        raise PopularityError(f"popularity parameter in {s!r} is negative: a law's parameter must be > 0 "
                              f"(>= 0 for zipf); use {POPULARITY_HELP}")
    if "-" in s and s.lower() not in ("round-robin",):
        parts = s.split("-")
        if len(parts) != 2:
            raise PopularityError(f"two-level popularity {s!r} must be RANKLAW-ADAPTERLAW, e.g. U-P; "
                                  f"use {POPULARITY_HELP}")
        rank, adapter = _parse_dist(parts[0], s), _parse_dist(parts[1], s)
        for kind in SEQUENTIAL_LAWS:
            if kind in (rank.kind, adapter.kind):
                raise PopularityError(f"{kind!r} cannot be one level of a two-level spec ({s!r})")
        return Popularity(adapter=adapter, rank=rank)
    return Popularity(_parse_dist(s, s))


def position_probabilities(dist: Dist, m: int) -> np.ndarray:
    """Probabilities of positions ``0..m-1`` (0 = most popular) under ``dist``."""
    if m < 1:
        raise PopularityError("a popularity law needs at least one adapter")
    i = np.arange(m, dtype=float)
    if dist.kind in ("uniform", "distinct", "bursty"):  # the sequential laws' long-run shares
        p = np.full(m, 1.0 / m)
    elif dist.kind == "powerlaw":
        a = float(dist.param)
        p = ((i + 1) / m) ** a - (i / m) ** a
    elif dist.kind == "zipf":
        w = (i + 1) ** -float(dist.param)
        p = w / w.sum()
    elif dist.kind == "skewed":
        from scipy.special import ndtr  # (here: scipy.special costs 0.2 s of every command's start-up)

        sd = float(dist.param) * m
        mu = (m - 1) / 2.0
        p = ndtr((i + 0.5 - mu) / sd) - ndtr((i - 0.5 - mu) / sd)
        if p.sum() <= 0:  # pragma: no cover - guarded by sd > 0
            p = np.full(m, 1.0 / m)
        p = p / p.sum()
    else:  # pragma: no cover
        raise PopularityError(f"unknown popularity law {dist.kind!r}")
    return p / p.sum()


def _whole(v: Any) -> bool:
    """An integer (numpy's too) or a whole float; not a bool or a string."""
    return (isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_))) or (
        isinstance(v, (float, np.floating)) and float(v).is_integer())


def assign_ranks(n_adapters: int, ranks: Sequence[int] = DEFAULT_RANKS) -> np.ndarray:
    """Rank of each adapter id: ``ranks`` cycled round-robin (``N/len(ranks)`` each)."""
    try:  # (a fraction, 8.5, would be truncated to 8 silently)
        given = list(ranks)
        whole = all(_whole(v) for v in given)
    except TypeError:
        given, whole = [ranks], False
    r = np.asarray(given, dtype=np.int64) if whole else np.zeros(0, np.int64)
    if r.size == 0 or (r < 1).any():
        raise PopularityError(f"ranks must be a non-empty list of positive integers, e.g. [8, 16, 32], got {ranks!r}")
    if not _whole(n_adapters) or n_adapters < 0:
        raise PopularityError(f"number of adapters must be a whole number >= 0, got {n_adapters!r}")
    n_adapters = int(n_adapters)
    return r[np.arange(n_adapters) % r.size]


def adapter_probabilities(popularity: str | Popularity, adapter_ranks: np.ndarray, rng: np.random.Generator,
                          rank_order: Sequence[int] | None = None) -> np.ndarray:
    """Probability that a request goes to each adapter id (length ``N``).

    ``rank_order`` is the rank popularity order of two-level specs (default: the distinct ranks
    in order of first appearance in ``adapter_ranks``, i.e. the order of the ``ranks`` list).
    Uses ``rng`` for the popularity-to-id permutation.
    """
    pop = parse_popularity(popularity)
    check_rng(rng)
    n = int(len(adapter_ranks))
    if n == 0:
        raise PopularityError("no adapters to assign requests to")
    if pop.rank is None:
        p_pos = position_probabilities(pop.adapter, n)
        perm = rng.permutation(n)  # position k -> adapter perm[k]
        p = np.empty(n)
        p[perm] = p_pos
        return p
    ranks_arr = np.asarray(adapter_ranks)
    if rank_order is None:
        _, first = np.unique(ranks_arr, return_index=True)
        rank_order = ranks_arr[np.sort(first)]
    rank_order = [int(r) for r in rank_order if (ranks_arr == r).any()]
    p_rank = position_probabilities(pop.rank, len(rank_order))
    p = np.zeros(n)
    for r, pr in zip(rank_order, p_rank):
        ids = np.flatnonzero(ranks_arr == r)
        p_in = position_probabilities(pop.adapter, ids.size)
        p[rng.permutation(ids)] = pr * p_in
    return p / p.sum()


def assign_adapters(n_requests: int, n_adapters: int, rng: np.random.Generator,
                    ranks: Sequence[int] = DEFAULT_RANKS, popularity: str | Popularity = "powerlaw",
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Adapter id and rank of each of ``n_requests`` requests (in arrival order).

    ``n_adapters = 0`` gives base-model requests (id -1, rank 0). ``distinct`` assigns
    round-robin in arrival order, ``bursty`` burst by burst (:func:`bursty_adapters`); every
    other law draws i.i.d. from :func:`adapter_probabilities`.
    """
    for what, v in (("n_requests", n_requests), ("n_adapters", n_adapters)):
        if not _whole(v) or v < 0:
            raise PopularityError(f"{what} must be a whole number >= 0, got {v!r}")
    n_requests, n_adapters = int(n_requests), int(n_adapters)
    check_rng(rng)
    if n_adapters == 0:
        return np.full(n_requests, -1, np.int64), np.zeros(n_requests, np.int64)
    rank_of = assign_ranks(n_adapters, ranks)
    pop = parse_popularity(popularity)
    if pop.rank is None and pop.adapter.kind == "distinct":
        ids = np.arange(n_requests, dtype=np.int64) % n_adapters
    elif pop.rank is None and pop.adapter.kind == "bursty":
        ids = bursty_adapters(n_requests, n_adapters, int(pop.adapter.param), rng)
    else:
        p = adapter_probabilities(pop, rank_of, rng, rank_order=list(dict.fromkeys(int(r) for r in ranks)))
        ids = rng.choice(n_adapters, size=n_requests, p=p).astype(np.int64)
    return ids, rank_of[ids]


def bursty_adapters(n_requests: int, n_adapters: int, burst: int, rng: np.random.Generator) -> np.ndarray:
    """Adapter ids of the ``bursty:B`` law (module docstring): bursts of ``burst`` requests, each
    sending :data:`BURST_HOT_SHARE` of its requests to a hot set of
    ``max(1, round(n_adapters * BURST_HOT_FRACTION))`` adapters drawn afresh per burst."""
    for what, v, low in (("n_requests", n_requests, 0), ("n_adapters", n_adapters, 1), ("burst", burst, 1)):
        if not _whole(v) or v < low:
            raise PopularityError(f"bursty adapters: {what} must be a whole number >= {low}, got {v!r}")
    n_requests, n_adapters, burst = int(n_requests), int(n_adapters), int(burst)
    check_rng(rng)
    hot_n = max(1, int(round(n_adapters * BURST_HOT_FRACTION)))
    ids = np.empty(n_requests, np.int64)
    for start in range(0, n_requests, burst):
        k = min(burst, n_requests - start)
        hot = rng.choice(n_adapters, size=hot_n, replace=False)
        to_hot = rng.random(k) < BURST_HOT_SHARE
        ids[start:start + k] = np.where(to_hot, hot[rng.integers(0, hot_n, k)], rng.integers(0, n_adapters, k))
    return ids


def map_keys_to_adapters(keys: np.ndarray, n_adapters: int, ranks: Sequence[int] = DEFAULT_RANKS,
                         ) -> tuple[np.ndarray, np.ndarray, list]:
    """Map the ``n_adapters`` most frequent keys (functions, models) to adapters ``0..n-1``.

    As FastLibra does with Azure Functions: the n most-invoked functions become n adapters
    (adapter 0 = most invoked). Requests of other keys get id -1 (callers usually drop them).
    Returns ``(adapter_id, adapter_rank, top_keys)``.
    """
    keys = np.asarray(keys)
    uniq, inv, counts = np.unique(keys, return_inverse=True, return_counts=True)
    order = np.lexsort((np.arange(uniq.size), -counts))  # most frequent first, ties by key order
    top = order[:n_adapters]
    lookup = np.full(uniq.size, -1, np.int64)
    lookup[top] = np.arange(top.size)
    ids = lookup[inv.ravel()]
    rank_of = assign_ranks(top.size, ranks)
    adapter_rank = np.where(ids >= 0, rank_of[np.maximum(ids, 0)] if top.size else 0, 0).astype(np.int64)
    return ids, adapter_rank, [uniq[k].item() if hasattr(uniq[k], "item") else uniq[k] for k in top]


def top_k_share(adapter_ids: np.ndarray, k: int = 1) -> float:
    """Share of requests that go to the ``k`` most requested adapters (base-model requests excluded)."""
    if not _whole(k) or k < 1:
        raise PopularityError(f"top_k_share: k must be a whole number >= 1 (the k most requested adapters), got {k!r}")
    k = int(k)
    ids = np.asarray(adapter_ids)
    ids = ids[ids >= 0]
    if ids.size == 0:
        return float("nan")
    counts = np.sort(np.bincount(ids))[::-1]
    return float(counts[:k].sum() / ids.size)
