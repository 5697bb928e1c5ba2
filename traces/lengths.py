"""Request lengths: prompt and output token counts.

Length models (all return ``(prompt_tokens, output_tokens)`` int64 arrays, both >= 1):

* :class:`FixedLengths` -- the published adapter twin's fixed request sizes (Agullo et al.
  2025): Small 23/27, Medium 250/231, Large 423/358 input/output tokens (the P25, mean and P75
  of ShareGPT V3).
* :class:`EmpiricalLengths` -- bootstrap of (prompt, output) *pairs* from a loaded trace (keeps
  their joint distribution).
* :class:`LognormalLengths` -- bivariate lognormal: ``(log p, log o) ~ N(mu, Sigma)`` fitted by
  the moments of the logs; ``mean_in``/``mean_out`` move ``mu`` so that
  ``E[x] = exp(mu + sigma^2/2)`` hits the target.
* :class:`CopulaLengths` -- a Gaussian copula with empirical marginal quantiles (log-linear
  interpolation of a quantile table) and the normal-scores correlation; fitted once on the
  real Splitwise traces (:mod:`traces.fit`), it is the "Splitwise-like" synthetic model.
* :class:`ShareGPTLengths` -- a ShareGPT-V3-like model built from the histograms and statistics
  in the data directory's ``lengths/`` (committed as knots of a piecewise-linear CDF in
  ``traces/data/sharegpt_lengths.json``) under the real runs' filters (prompt >= 4,
  output >= 4, prompt <= 1024, prompt + output <= 2048). :func:`sharegpt_like` matches target
  means exactly in expectation (see :meth:`ShareGPTLengths.solve`) and draws with stratified
  uniforms, so sample means land within ~1 % of the targets already at a few thousand requests.

Transforms: :func:`scale_lengths` (Chameleon scales Splitwise lengths down to fit a smaller
GPU) and :class:`LengthFilter` (max-length filtering).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Protocol

import numpy as np

DATA = Path(__file__).resolve().parent / "data"
SHAREGPT_JSON = DATA / "sharegpt_lengths.json"
FIT_COMMAND = "python -m traces.fit --data-dir ../shared/data"

#: The adapter twin's fixed request sizes (input, output tokens).
FIXED_SIZES: dict[str, tuple[int, int]] = {"small": (23, 27), "medium": (250, 231), "large": (423, 358)}


class LengthError(ValueError):
    """Invalid length-model parameters or an impossible target."""


def _fitted_json(path: Path) -> dict[str, Any]:
    if not path.exists():
        raise FileNotFoundError(f"fitted statistics {path.name} missing from {path.parent}; regenerate them with "
                                f"`{FIT_COMMAND}` (needs the real data directory)")
    return json.loads(path.read_text())


#: what reads each section of a committed fit (named in the error for a fit that lacks it)
FIT_SECTION_USERS = {"arrivals": "arrival=fitted (fit=NAME, --fit NAME)",
                     "lengths": "lengths=splitwise|splitwise-code"}


class FitSectionError(KeyError, LengthError):
    """A committed fit lacks a section (or an entry) that is asked of it: a ``KeyError`` (what a dict lookup
    raises, and what callers catch) and a :class:`LengthError` (bad input), whose message says which fits have
    it. ``str()`` is the message itself (a plain ``KeyError`` quotes it: the CLI printed ``error: arrivals``)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class FittedStats(dict):
    """A committed fit as loaded by :func:`load_fitted`: a plain ``dict`` (of such dicts) whose missing key is a
    :class:`FitSectionError` naming the fit, the key, the keys it has, what reads that key and the committed
    fits that have it (``load_fitted("sharegpt_lengths")["arrivals"]`` said only ``arrivals``). Uses the
    ``dict.__missing__`` hook of :meth:`dict.__getitem__`; ``get``, ``in`` and equality are a dict's."""

    def __init__(self, data: dict[str, Any], name: str = "", where: tuple[str, ...] = ()) -> None:
        super().__init__({k: FittedStats(v, name, where + (str(k),)) if isinstance(v, dict) and
                          not isinstance(v, FittedStats) else v for k, v in data.items()})
        self.name, self.where = name, where

    def __missing__(self, key: Any) -> Any:
        path = self.where + (str(key),)
        entry = "/".join(path)

        def has(stats: Any) -> bool:
            for k in path:
                if not isinstance(stats, dict) or k not in stats:
                    return False
                stats = dict.__getitem__(stats, k)
            return True

        others = []
        for stem in (sorted(p.stem for p in DATA.glob("*.json")) if DATA.is_dir() else []):
            try:
                if stem != self.name and has(load_fitted(stem)):
                    others.append(stem)
            except (OSError, ValueError):  # (an unreadable file: not offered)
                continue
        user = f", read by {FIT_SECTION_USERS[path[0]]}" if path[0] in FIT_SECTION_USERS else ""
        inside = f" under {'/'.join(self.where)}" if self.where else ""
        instead = (f"; use a fit that has it: {', '.join(others)}" if others else
                   f"; no committed fit has it (fits written by an older `{FIT_COMMAND}`? run it again)")
        raise FitSectionError(f"fitted statistics {self.name!r} (traces/data/{self.name}.json) hold no {entry!r}"
                              f"{user} (its keys{inside}: {', '.join(map(str, self)) or 'none'}){instead}")


@lru_cache(maxsize=None)
def load_fitted(name: str) -> FittedStats:
    """A committed fit from ``traces/data/<name>.json`` (cached); an unknown name is an error listing
    the committed ones (a file name such as ``x.json`` is a name too: ``x``), and a missing section of a
    known one (:class:`FittedStats`) an error naming the fits that have it."""
    path = DATA / f"{name}.json"
    known = sorted(p.stem for p in DATA.glob("*.json")) if DATA.is_dir() else []
    if not path.exists() and known:
        hint = f" (a name, not a file: {name[:-5]!r})" if name.endswith(".json") and name[:-5] in known else ""
        raise FileNotFoundError(f"unknown fitted statistics {name!r}{hint}; the committed ones are "
                                f"{', '.join(known)} (traces/data/<name>.json)")
    data = _fitted_json(path)
    return FittedStats(data, name) if isinstance(data, dict) else data


# --------------------------------------------------------------------------- filters, scaling
@dataclass
class LengthFilter:
    """Length limits a request must satisfy (``None`` = no limit)."""

    min_prompt: int = 1
    min_output: int = 1
    max_prompt: int | None = None
    max_output: int | None = None
    max_total: int | None = None

    def __post_init__(self) -> None:
        for kind in ("prompt", "output"):
            lo, hi = getattr(self, f"min_{kind}"), getattr(self, f"max_{kind}")
            if hi is not None and lo > hi:
                raise ValueError(f"min_{kind} {lo} is above max_{kind} {hi}: no request can pass; give "
                                 f"min_{kind} <= max_{kind}")
        if self.max_total is not None and self.min_prompt + self.min_output > self.max_total:
            raise ValueError(f"min_prompt {self.min_prompt} + min_output {self.min_output} is above max_total "
                             f"{self.max_total}: no request can pass; lower the minimums or raise max_total")

    def mask(self, prompt: np.ndarray, output: np.ndarray) -> np.ndarray:
        """True where ``(prompt, output)`` passes every limit."""
        p, o = np.asarray(prompt), np.asarray(output)
        m = (p >= self.min_prompt) & (o >= self.min_output)
        if self.max_prompt is not None:
            m &= p <= self.max_prompt
        if self.max_output is not None:
            m &= o <= self.max_output
        if self.max_total is not None:
            m &= p + o <= self.max_total
        return m

    def is_trivial(self) -> bool:
        return (self.min_prompt <= 1 and self.min_output <= 1 and self.max_prompt is None
                and self.max_output is None and self.max_total is None)

    def merged(self, other: "LengthFilter") -> "LengthFilter":
        """The stricter of two filters, limit by limit."""
        def mn(a, b):
            return b if a is None else a if b is None else min(a, b)
        return LengthFilter(max(self.min_prompt, other.min_prompt), max(self.min_output, other.min_output),
                            mn(self.max_prompt, other.max_prompt), mn(self.max_output, other.max_output),
                            mn(self.max_total, other.max_total))


#: The real vLLM runs' filters on ShareGPT (validation data; ``benchmark_serving_by_time.py``).
SHAREGPT_FILTER = LengthFilter(min_prompt=4, min_output=4, max_prompt=1024, max_total=2048)


def scale_lengths(prompt: np.ndarray, output: np.ndarray, factor: float) -> tuple[np.ndarray, np.ndarray]:
    """Multiply both lengths by ``factor`` and round (at least 1 token)."""
    if not (np.isfinite(factor) and factor > 0):
        raise LengthError(f"length scale factor must be > 0, got {factor!r}")
    if factor == 1.0:
        return np.asarray(prompt, np.int64), np.asarray(output, np.int64)
    p = np.maximum(np.rint(np.asarray(prompt) * factor), 1).astype(np.int64)
    o = np.maximum(np.rint(np.asarray(output) * factor), 1).astype(np.int64)
    return p, o


# --------------------------------------------------------------------------- models
class LengthModel(Protocol):
    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]: ...
    def describe(self) -> dict[str, Any]: ...


@dataclass
class FixedLengths:
    """Every request has the same ``prompt``/``output`` length (adapter twin Small/Medium/Large)."""

    prompt: int
    output: int

    @classmethod
    def named(cls, size: str) -> "FixedLengths":
        """``small``/``medium``/``large`` or ``"P/O"`` (e.g. ``"100/50"``)."""
        key = size.strip().lower()
        if key in FIXED_SIZES:
            return cls(*FIXED_SIZES[key])
        try:
            p, o = (int(x) for x in key.replace(",", "/").split("/"))
        except ValueError as e:
            raise LengthError(f"fixed size {size!r}: use small (23/27), medium (250/231), large (423/358) "
                              f"or PROMPT/OUTPUT such as 100/50") from e
        return cls(p, o)

    def __post_init__(self) -> None:
        if self.prompt < 1 or self.output < 1:
            raise LengthError(f"fixed lengths must be >= 1 (got {self.prompt}/{self.output})")

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        return np.full(n, self.prompt, np.int64), np.full(n, self.output, np.int64)

    def describe(self) -> dict[str, Any]:
        return {"model": "fixed", "prompt": self.prompt, "output": self.output}


@dataclass
class EmpiricalLengths:
    """Bootstrap of (prompt, output) pairs from a trace."""

    prompt: np.ndarray
    output: np.ndarray
    source: str = ""

    def __post_init__(self) -> None:
        self.prompt = np.asarray(self.prompt, np.int64)
        self.output = np.asarray(self.output, np.int64)
        if self.prompt.size == 0 or self.prompt.shape != self.output.shape:
            raise LengthError("empirical lengths need equal-length, non-empty prompt and output arrays")

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        idx = rng.integers(0, self.prompt.size, size=n)
        return np.maximum(self.prompt[idx], 1), np.maximum(self.output[idx], 1)

    def describe(self) -> dict[str, Any]:
        return {"model": "empirical", "source": self.source, "pairs": int(self.prompt.size)}


@dataclass
class LognormalLengths:
    """Bivariate lognormal lengths: ``(log p, log o) ~ N([mu_in, mu_out], Sigma)``."""

    mu_in: float
    sigma_in: float
    mu_out: float
    sigma_out: float
    rho: float = 0.0

    @classmethod
    def fit(cls, prompt: np.ndarray, output: np.ndarray) -> "LognormalLengths":
        """Moment fit of the logs (the maximum-likelihood estimate of a lognormal)."""
        lp, lo = np.log(np.maximum(prompt, 1)), np.log(np.maximum(output, 1))
        rho = float(np.corrcoef(lp, lo)[0, 1]) if lp.size > 2 and lp.std() > 0 and lo.std() > 0 else 0.0
        return cls(float(lp.mean()), float(lp.std()), float(lo.mean()), float(lo.std()), rho)

    def with_means(self, mean_in: float | None, mean_out: float | None) -> "LognormalLengths":
        """Same sigmas and correlation, ``mu`` moved so ``exp(mu + sigma^2/2)`` is the target mean."""
        mi = self.mu_in if mean_in is None else float(np.log(mean_in) - self.sigma_in**2 / 2)
        mo = self.mu_out if mean_out is None else float(np.log(mean_out) - self.sigma_out**2 / 2)
        return LognormalLengths(mi, self.sigma_in, mo, self.sigma_out, self.rho)

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        z1 = rng.standard_normal(n)
        z2 = self.rho * z1 + np.sqrt(max(1 - self.rho**2, 0.0)) * rng.standard_normal(n)
        p = np.exp(self.mu_in + self.sigma_in * z1)
        o = np.exp(self.mu_out + self.sigma_out * z2)
        return (np.maximum(np.rint(p), 1).astype(np.int64), np.maximum(np.rint(o), 1).astype(np.int64))

    def describe(self) -> dict[str, Any]:
        return {"model": "lognormal", **asdict(self)}


def normal_scores(x: np.ndarray) -> np.ndarray:
    """``Phi^-1((rank - 0.5)/n)`` with average ranks for ties (van der Waerden scores)."""
    from scipy.special import ndtri
    from scipy.stats import rankdata

    r = rankdata(x, method="average")
    return ndtri((r - 0.5) / len(x))


@dataclass
class CopulaLengths:
    """Gaussian copula over empirical marginals given as quantile tables of the log-lengths.

    ``x = exp(interp(Phi(z), probs, log_q))`` with ``(z_in, z_out)`` standard normals of
    correlation ``rho`` (the correlation of the normal scores of the fitted data).
    """

    probs: list[float]
    log_q_in: list[float]
    log_q_out: list[float]
    rho: float
    source: str = ""

    @classmethod
    def fit(cls, prompt: np.ndarray, output: np.ndarray, n_quantiles: int = 401, source: str = "") -> "CopulaLengths":
        probs = np.linspace(0.0, 1.0, n_quantiles)
        lq_in = np.quantile(np.log(np.maximum(prompt, 1)), probs)
        lq_out = np.quantile(np.log(np.maximum(output, 1)), probs)
        rho = float(np.corrcoef(normal_scores(prompt), normal_scores(output))[0, 1])
        r6 = lambda a: [round(float(v), 6) for v in a]  # noqa: E731
        return cls(r6(probs), r6(lq_in), r6(lq_out), round(rho, 6), source)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "CopulaLengths":
        return cls(list(d["probs"]), list(d["log_q_in"]), list(d["log_q_out"]), float(d["rho"]), d.get("source", ""))

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        from scipy.special import ndtr  # (imported here: scipy.special costs 0.2 s of start-up)

        z1 = rng.standard_normal(n)
        z2 = self.rho * z1 + np.sqrt(max(1 - self.rho**2, 0.0)) * rng.standard_normal(n)
        pr = np.asarray(self.probs)
        p = np.exp(np.interp(ndtr(z1), pr, self.log_q_in))
        o = np.exp(np.interp(ndtr(z2), pr, self.log_q_out))
        return (np.maximum(np.rint(p), 1).astype(np.int64), np.maximum(np.rint(o), 1).astype(np.int64))

    def describe(self) -> dict[str, Any]:
        return {"model": "copula", "source": self.source, "rho": self.rho, "quantiles": len(self.probs)}


# --------------------------------------------------------------------------- ShareGPT-like
def _stratified(n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` stratified uniforms on (0, 1): one per cell ``[i/n, (i+1)/n)``, randomly ordered."""
    return (rng.permutation(n) + rng.random(n)) / n


@dataclass
class ShareGPTLengths:
    """ShareGPT-V3-like lengths from piecewise-linear CDFs, under a joint length filter.

    The base marginals are the CDFs through the committed knots (histogram bin edges of the
    data directory's ``lengths/sharegpt_*_hist.csv`` plus the reported P25/P75), discretised
    per token: ``P(X = k) = F(k + 1/2) - F(k - 1/2)``. Prompt and output are independent before
    the filter (the source gives only marginals); the filter couples them.

    Mean matching (:meth:`solve`) transforms each marginal with one parameter and solves the
    two exact filtered means ``E[p | filter] = mean_in``, ``E[o | filter] = mean_out`` by
    alternating Brent root-finding (each mean is monotone in its own parameter):

    * ``method="scale"`` (default): ``X' = c X`` (``P(X' = k) = F((k+1/2)/c) - F((k-1/2)/c)``),
      which models a change of tokenizer (the same texts in fewer or more tokens), the reason
      the real runs' pool means (~222/196 with Llama-3.1's tokenizer) differ from the
      published Llama-2 statistics (250.9/231.5);
    * ``method="tilt"``: exponential tilting ``P'(k) ∝ P(k) e^{theta k}``, the minimum
      relative-entropy change of the histogram that moves the mean.

    ``prompt_output_corr`` (dimensionless, default 0: independent) couples the two lengths
    through a Gaussian copula: the output's uniform is ``Phi(rho z_p + sqrt(1 - rho^2) z)``
    with ``z_p`` the prompt's normal score, then inverted on the output pmf restricted by the
    filter, so the marginals stay those of the model (up to the filter, which binds for
    < 0.01 % of pairs) and ``E[o]``, ``E[p]`` stay matched.
    """

    knots_in: tuple[np.ndarray, np.ndarray]
    knots_out: tuple[np.ndarray, np.ndarray]
    filt: LengthFilter = field(default_factory=lambda: SHAREGPT_FILTER)
    method: str = "scale"
    par_in: float | None = None
    par_out: float | None = None
    prompt_output_corr: float = 0.0

    @classmethod
    def from_json(cls, path: Path | None = None, filt: LengthFilter | None = None, method: str = "scale",
                  ) -> "ShareGPTLengths":
        d = _fitted_json(path) if path is not None else load_fitted("sharegpt_lengths")
        kin = (np.asarray(d["prompt"]["knots_x"], float), np.asarray(d["prompt"]["knots_F"], float))
        kout = (np.asarray(d["output"]["knots_x"], float), np.asarray(d["output"]["knots_F"], float))
        if method not in ("scale", "tilt"):
            raise LengthError(f"mean-matching method must be 'scale' or 'tilt', got {method!r}")
        return cls(kin, kout, SHAREGPT_FILTER if filt is None else filt, method)

    def _identity(self) -> float:
        return 1.0 if self.method == "scale" else 0.0

    def _pmf(self, knots: tuple[np.ndarray, np.ndarray], par: float | None, kmax: int) -> np.ndarray:
        """pmf over tokens ``0..kmax`` (index = token count; index 0 has mass 0)."""
        kx, kf = knots
        k = np.arange(kmax + 1, dtype=float)
        c = par if (self.method == "scale" and par is not None) else 1.0
        F = lambda x: np.interp(x, kx, kf, left=0.0, right=1.0)  # noqa: E731
        p = np.maximum(F((k + 0.5) / c) - F((k - 0.5) / c), 0.0)
        p[0] = 0.0
        if self.method == "tilt" and par:
            with np.errstate(divide="ignore"):
                lw = np.log(p) + par * k
            lw -= lw[np.isfinite(lw)].max()
            p = np.exp(lw)
        s = p.sum()
        if s <= 0:
            raise LengthError("length distribution has no mass (scale factor too small?)")
        return p / s

    def _kmax(self, knots: tuple[np.ndarray, np.ndarray], par: float | None) -> int:
        c = par if (self.method == "scale" and par is not None) else 1.0
        return int(np.ceil(knots[0][-1] * c)) + 2

    def _tables(self, par_in: float | None, par_out: float | None):
        f = self.filt
        pp = self._pmf(self.knots_in, par_in, self._kmax(self.knots_in, par_in))
        po = self._pmf(self.knots_out, par_out, self._kmax(self.knots_out, par_out))
        ks_p = np.arange(pp.size)
        valid_p = ks_p >= f.min_prompt
        if f.max_prompt is not None:
            valid_p &= ks_p <= f.max_prompt
        ks_o = np.arange(po.size)
        po_v = po * (ks_o >= f.min_output)
        if f.max_output is not None:
            po_v = po_v * (ks_o <= f.max_output)
        C = np.cumsum(po_v)          # C[m] = P(min_o <= o <= m)
        H = np.cumsum(po_v * ks_o)   # H[m] = sum o P(o) over the same range
        if f.max_total is None:
            lim = np.full(pp.size, po.size - 1)
        else:
            lim = np.clip(f.max_total - ks_p, -1, po.size - 1)
        Cl = np.where(lim >= 0, C[np.maximum(lim, 0)], 0.0)
        Hl = np.where(lim >= 0, H[np.maximum(lim, 0)], 0.0)
        q = pp * valid_p * Cl        # unnormalised marginal of the prompt after the filter
        return q, Cl, Hl, np.cumsum(po_v), ks_p

    def expected_means(self, par_in: float | None = None, par_out: float | None = None) -> tuple[float, float]:
        """Exact ``(E[prompt], E[output])`` under the filter for the given parameters."""
        q, Cl, Hl, _, ks = self._tables(par_in, par_out)
        z = q.sum()
        if z <= 0:
            raise LengthError("no (prompt, output) pair passes the length filter")
        w = q / np.where(Cl > 0, Cl, 1.0)  # pp * valid
        return float((ks * q).sum() / z), float((w * Hl).sum() / z)

    def solve(self, mean_in: float | None, mean_out: float | None, tol: float = 1e-6) -> "ShareGPTLengths":
        """Parameters that make the filtered means equal ``mean_in``/``mean_out`` (None: keep)."""
        lo, hi = (0.05, 20.0) if self.method == "scale" else (-0.1, 0.1)
        pin, pout = self._identity(), self._identity()

        def root(fun, target, what):
            a, b = fun(lo) - target, fun(hi) - target
            if a > 0 or b < 0:
                raise LengthError(f"target {what} mean {target:g} is not reachable under the filter {self.filt} "
                                  f"(reachable range {fun(lo):.1f}..{fun(hi):.1f})")
            from scipy.optimize import brentq  # (here: scipy.optimize costs a start-up that only this solve needs)

            return brentq(lambda x: fun(x) - target, lo, hi, xtol=1e-10)

        for _ in range(30):
            old = (pin, pout)
            if mean_in is not None:
                pin = root(lambda x: self.expected_means(x, pout)[0], mean_in, "prompt")
            if mean_out is not None:
                pout = root(lambda x: self.expected_means(pin, x)[1], mean_out, "output")
            if abs(pin - old[0]) < tol and abs(pout - old[1]) < tol:
                break
        return ShareGPTLengths(self.knots_in, self.knots_out, self.filt, self.method, pin, pout,
                               self.prompt_output_corr)

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """Exact draws from the filtered joint (no rejection), with stratified uniforms."""
        q, Cl, _, Ccum, ks = self._tables(self.par_in, self.par_out)
        cq = np.cumsum(q)
        z = cq[-1]
        u_p = _stratified(n, rng)
        p = np.searchsorted(cq, u_p * z, side="right")
        p = np.minimum(p, ks.size - 1)
        u_o = _stratified(n, rng)
        rho = float(self.prompt_output_corr)
        if rho != 0.0:  # Gaussian copula: the output's normal score leans on the prompt's
            from scipy.special import ndtr, ndtri  # (imported here: scipy.special costs 0.2 s of start-up)

            z_o = rho * ndtri(np.clip(u_p, 1e-12, 1 - 1e-12)) + np.sqrt(1.0 - rho * rho) * ndtri(u_o)
            u_o = ndtr(z_o)
        # output | prompt: inverse CDF of the output pmf restricted to [min_o, max_total - p]
        o = np.searchsorted(Ccum, u_o * Cl[p], side="right")
        o = np.minimum(o, Ccum.size - 1)
        return p.astype(np.int64), o.astype(np.int64)

    def describe(self) -> dict[str, Any]:
        mi, mo = self.expected_means(self.par_in, self.par_out)
        return {"model": "sharegpt-like", "method": self.method, "par_in": self.par_in, "par_out": self.par_out,
                "prompt_output_corr": self.prompt_output_corr,
                "expected_mean_in": round(mi, 3), "expected_mean_out": round(mo, 3), "filter": asdict(self.filt)}


def sharegpt_like(n: int, rng: np.random.Generator, mean_in: float | None = None, mean_out: float | None = None,
                  method: str = "scale", filt: LengthFilter | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``n`` ShareGPT-like (prompt, output) pairs under the real runs' filters.

    ``mean_in``/``mean_out`` (e.g. 222/196, the real runs' prompt-pool means) are matched by
    :meth:`ShareGPTLengths.solve` (exact in expectation; stratified sampling keeps the sample
    means within ~1 %). ``filt`` defaults to :data:`SHAREGPT_FILTER`.
    """
    model = ShareGPTLengths.from_json(filt=filt, method=method)
    if mean_in is not None or mean_out is not None:
        model = model.solve(mean_in, mean_out)
    return model.sample(n, rng)


# --------------------------------------------------------------------------- configuration
LENGTH_DISTS = ("splitwise", "splitwise-code", "sharegpt", "lognormal[:NAME|PATH]", "fixed:small|medium|large|P/O",
                "empirical:NAME|PATH", "trace")
#: the length models whose argument is a trace name or a file (``empirical:PATH``, ``lognormal:PATH``;
#: :func:`build_length_model` loads it), so a scenario file's relative path is read from the file's directory
LENGTH_SOURCE_MODELS = ("empirical", "lognormal")


@dataclass
class LengthConfig:
    """How request lengths are produced.

    ``dist``: ``splitwise`` / ``splitwise-code`` (copula fitted on the real Splitwise trace),
    ``sharegpt`` (:func:`sharegpt_like`), ``lognormal`` (fitted on Splitwise conv, or
    ``lognormal:NAME|PATH`` fitted on a loaded trace), ``fixed:small|medium|large|P/O``,
    ``empirical:NAME|PATH`` (bootstrap from a loaded trace), ``trace`` (a real trace keeps its own).
    ``scale`` multiplies lengths (then the limits are applied by rejection for synthetic models and
    by dropping requests for a replayed trace).
    """

    dist: str = "splitwise"
    mean_in: float | None = None
    mean_out: float | None = None
    method: str = "scale"
    scale: float = 1.0
    min_prompt: int = 1
    min_output: int = 1
    max_prompt: int | None = None
    max_output: int | None = None
    max_total: int | None = None

    def filter(self) -> LengthFilter:
        return LengthFilter(self.min_prompt, self.min_output, self.max_prompt, self.max_output, self.max_total)


def build_length_model(cfg: LengthConfig, trace_lengths: Callable[[str], tuple[np.ndarray, np.ndarray]] | None = None,
                       ) -> LengthModel:
    """The model ``cfg.dist`` names. ``trace_lengths(name_or_path)`` loads a trace's lengths (for
    ``empirical:`` and ``lognormal:``; the registry passes its loader)."""
    kind, _, arg = cfg.dist.partition(":")
    kind = kind.strip().lower()
    means = cfg.mean_in is not None or cfg.mean_out is not None
    if kind in ("splitwise", "splitwise-conv", "splitwise-code"):
        fit = load_fitted("splitwise_code_fit" if kind == "splitwise-code" else "splitwise_conv_fit")
        if means:
            raise LengthError("mean_in/mean_out apply to the sharegpt and lognormal length models; "
                              "use length_scale to resize splitwise lengths")
        return CopulaLengths.from_dict(fit["lengths"]["copula"])
    if kind == "sharegpt":
        m = ShareGPTLengths.from_json(filt=SHAREGPT_FILTER.merged(cfg.filter()), method=cfg.method)
        return m.solve(cfg.mean_in, cfg.mean_out) if means else m
    if kind == "lognormal":
        if arg:
            if trace_lengths is None:
                raise LengthError("lognormal:NAME needs a trace loader")
            ln = LognormalLengths.fit(*trace_lengths(arg))
        else:
            ln = LognormalLengths(**load_fitted("splitwise_conv_fit")["lengths"]["lognormal"])
        return ln.with_means(cfg.mean_in, cfg.mean_out)
    if means:
        raise LengthError(f"mean_in/mean_out are not supported for length model {cfg.dist!r}; "
                          f"use sharegpt or lognormal (or length_scale)")
    if kind == "fixed":
        return FixedLengths.named(arg or "medium")
    if kind == "empirical":
        if not arg or trace_lengths is None:
            raise LengthError("empirical lengths need a source: empirical:NAME or empirical:PATH")
        p, o = trace_lengths(arg)
        return EmpiricalLengths(p, o, source=arg)
    if kind == "trace":
        raise LengthError("length model 'trace' keeps a real trace's own lengths; synthetic workloads need "
                          f"one of {', '.join(LENGTH_DISTS[:-1])}")
    raise LengthError(f"unknown length model {cfg.dist!r}; use one of {', '.join(LENGTH_DISTS)}")


#: the smallest share of draws a length filter may keep (0.1 %): below it :func:`sample_lengths` refuses the
#: filter instead of drawing on (an impossible filter was found out after 200 rounds of ever larger draws: 14 s,
#: or 477 M draws, or 1.2e8 pairs a round at 100 k requests); the rounds draw at most 1000 x what they still need,
#: the same bound
MIN_ACCEPTANCE = 1e-3


def _filter_text(filt: LengthFilter, scale: float) -> str:
    """The limits of ``filt`` that bind, as ``max_prompt=2, min_output=900`` (and the scale they apply after)."""
    d = LengthFilter()
    parts = [f"{k}={v}" for k, v in asdict(filt).items() if v is not None and v != getattr(d, k)]
    return (", ".join(parts) or "no limit") + (f" (after length_scale={scale:g})" if scale != 1.0 else "")


def sample_lengths(model: LengthModel, n: int, rng: np.random.Generator, scale: float = 1.0,
                   filt: LengthFilter | None = None, max_rounds: int = 200) -> tuple[np.ndarray, np.ndarray]:
    """``n`` pairs from ``model``, scaled by ``scale``, redrawn until all pass ``filt``.

    Rejection sampling in rounds: the first draws ``n``, each later one what is still needed times the
    inverse of the share kept so far (at most 1000, +20 % and 16). After every round the share kept is checked
    against :data:`MIN_ACCEPTANCE`: when even its upper bound, ``(kept + 3 sqrt(kept) + 3) / drawn`` (three
    standard errors, and the "rule of three" 95 % bound when nothing is kept), is below the floor, the filter
    is refused with a :class:`LengthError` naming its limits and the share observed. A filter that keeps a
    normal share never meets the check, so its draws are those of the plain rounds; an empty or vanishingly
    small acceptance region is refused after one or two rounds (``n`` draws, or ``n`` x min(``n``, 1000) x 1.2
    more when ``n`` <= 3,000), not 200.
    """
    filt = filt or LengthFilter()
    if n <= 0:  # (a workload with no arrivals: nothing to draw)
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    ps, os_ = [], []
    have = 0
    drawn = 0
    for _ in range(max_rounds):
        need = n - have
        if need <= 0:
            break
        if drawn and (have + 3.0 * np.sqrt(have) + 3.0) / drawn < MIN_ACCEPTANCE:
            model_name = model.describe().get("model")
            raise LengthError(f"length filter {_filter_text(filt, scale)} rejects almost every draw of {model_name} "
                              f"lengths: it kept {have:,} of {drawn:,} ({100.0 * have / drawn:.3g} %), below the "
                              f"{100 * MIN_ACCEPTANCE:g} % a workload may be drawn at; relax the limits (max_prompt, "
                              f"max_output, max_total, min_prompt, min_output) or change length_scale")
        m = need if have == drawn == 0 else int(need * min(drawn / max(have, 1), 1000) * 1.2) + 16
        p, o = model.sample(max(m, 1), rng)
        p, o = scale_lengths(p, o, scale)
        keep = filt.mask(p, o)
        drawn += p.size
        have += int(keep.sum())
        ps.append(p[keep])
        os_.append(o[keep])
    if have < n:
        raise LengthError(f"length filter {filt} rejects almost every draw of {model.describe().get('model')} "
                          f"(kept {have} of {drawn}); relax max_prompt/max_total or lower length_scale")
    return np.concatenate(ps)[:n], np.concatenate(os_)[:n]
