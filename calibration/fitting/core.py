"""Shared machinery of the fits: ``curve_fit`` with bounds and standard errors, fit-quality
metrics, and deterministic grouped cross-validation for the held-out scores.

Every component fit follows the same recipe:

1. build a table of observations (one row per ~2 s window, run, load or server start)
   with a *group* key (the run it comes from, so that neighbouring windows of one run are
   never split between training and test data);
2. for each candidate form, fit the parameters with :func:`fit_params`
   (``scipy.optimize.curve_fit``, trust-region reflective with bounds, initial guesses,
   ``sigma`` weights) and compute the standard errors from the covariance matrix;
3. score it on held-out data with :func:`grouped_folds` (k-fold over groups: each group's
   predictions come from a fit that never saw it) and keep the candidate with the lowest
   held-out MAPE (ties within 2 % relative go to the simpler form).
"""

from __future__ import annotations

import hashlib
import math
import sys
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import numpy as np
from scipy.optimize import OptimizeWarning, curve_fit


class FitError(RuntimeError):
    """A fit could not be done (missing or unusable measurements); the message says which and why."""


class TableError(FitError, ValueError):
    """A measurement table that cannot be used as it is (unreadable, a column missing, a value that is not a
    number or is physically impossible); the message names the file, the column and the rows, the problem and
    the fix. Raised while the tables are read, before any fitting."""


class DroppedRowsWarning(UserWarning):
    """Measurement rows left out of a fit because a value they need is missing (NaN)."""


def warn_dropped(table: str, total: int, nan_by_column: dict[str, int], what: str = "rows") -> None:
    """Warn (:class:`DroppedRowsWarning`) that rows of ``table`` (``total`` considered) were left out
    for a NaN in the given columns (``column: rows``); nothing when none were."""
    n = sum(nan_by_column.values())
    if n:
        cols = ", ".join(f"{c} ({k})" for c, k in nan_by_column.items() if k)
        warnings.warn(f"{table}: {n} of {total} {what} dropped for a missing (NaN) value in {cols}", DroppedRowsWarning,
                      stacklevel=2)


def first_nan_counts(df: Any, columns: Sequence[str]) -> dict[str, int]:
    """Rows of ``df`` by the first of ``columns`` that is NaN in them (each row counted once)."""
    left = np.ones(len(df), bool)
    out = {}
    for c in columns:
        m = df[c].isna().to_numpy() & left
        out[c] = int(m.sum())
        left &= ~m
    return out


@contextmanager
def dropped_rows_reported(prefix: str) -> Iterator[None]:
    """Print each distinct :class:`DroppedRowsWarning` raised inside on stderr as ``PREFIX: warning: ...``
    (also when the block fails: the drops may be why); other warnings are shown as usual."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", DroppedRowsWarning)
        try:
            yield
        finally:
            seen: set[str] = set()
            shown: set[tuple] = set()  # (a fit on absurd values raised a million overflow warnings: replaying every
            for w in caught:           # one hung the command; each distinct one is shown once)
                if not issubclass(w.category, DroppedRowsWarning):
                    key = (w.category, str(w.message), w.filename, w.lineno)
                    if key not in shown:
                        shown.add(key)
                        warnings.showwarning(w.message, w.category, w.filename, w.lineno)
                elif str(w.message) not in seen:
                    seen.add(str(w.message))
                    print(f"{prefix}: warning: {w.message}", file=sys.stderr)


def r2_score(y: np.ndarray, pred: np.ndarray, weights: np.ndarray | None = None) -> float:
    """Coefficient of determination ``1 - SS_res / SS_tot`` (weighted when ``weights`` is given)."""
    y = np.asarray(y, float)
    pred = np.asarray(pred, float)
    w = np.ones_like(y) if weights is None else np.asarray(weights, float)
    if len(y) < 2:
        return float("nan")
    mean = np.sum(w * y) / np.sum(w)
    ss_tot = float(np.sum(w * (y - mean) ** 2))
    ss_res = float(np.sum(w * (y - pred) ** 2))
    return float("nan") if ss_tot == 0 else 1.0 - ss_res / ss_tot


def mape(y: np.ndarray, pred: np.ndarray) -> float:
    """Mean absolute percentage error, in percent (points with ``y == 0`` are skipped)."""
    y = np.asarray(y, float)
    pred = np.asarray(pred, float)
    ok = y != 0
    if not ok.any():
        return float("nan")
    return float(np.mean(np.abs(pred[ok] - y[ok]) / np.abs(y[ok])) * 100.0)


def quality(y: np.ndarray, pred: np.ndarray, weights: np.ndarray | None = None) -> dict[str, float]:
    """``{"r2", "mape_pct", "rmse", "bias_pct", "n"}`` of predictions against measurements."""
    y = np.asarray(y, float)
    pred = np.asarray(pred, float)
    ok = np.isfinite(y) & np.isfinite(pred)
    y, pred = y[ok], pred[ok]
    w = None if weights is None else np.asarray(weights, float)[ok]
    if len(y) == 0:
        return {"r2": float("nan"), "mape_pct": float("nan"), "rmse": float("nan"), "bias_pct": float("nan"), "n": 0}
    nz = y != 0
    bias = float(np.mean((pred[nz] - y[nz]) / np.abs(y[nz])) * 100.0) if nz.any() else float("nan")
    return {"r2": _round(r2_score(y, pred, w)), "mape_pct": _round(mape(y, pred)),
            "rmse": _round(float(np.sqrt(np.mean((y - pred) ** 2)))), "bias_pct": _round(bias), "n": int(len(y))}


def _round(x: float, sig: int = 6) -> float:
    if not np.isfinite(x) or x == 0:
        return float(x)
    return float(f"{x:.{sig}g}")


@dataclass
class ParamSpec:
    """One fitted parameter: initial guess and bounds (in the fit's working units)."""

    name: str
    p0: float
    lo: float = 0.0
    hi: float = math.inf


@dataclass
class Fitted:
    """Result of :func:`fit_params`: values and standard errors by name (working units)."""

    values: dict[str, float]
    stderr: dict[str, float]
    at_bound: list[str] = field(default_factory=list)
    cost: float = float("nan")


def fit_params(func: Callable[..., np.ndarray], specs: Sequence[ParamSpec], y: np.ndarray,
               sigma: np.ndarray | None = None, what: str = "model") -> Fitted:
    """Fit ``y ~ func(*params)`` with ``scipy.optimize.curve_fit`` (bounded TRF).

    ``func`` closes over its inputs and takes only the parameters. Standard errors are the
    square roots of the covariance diagonal (``absolute_sigma=False``: scaled by the residual
    variance); parameters that end on a bound are listed in ``at_bound`` (their error is not
    meaningful and is reported as NaN).
    """
    y = np.asarray(y, float)
    if len(y) < len(specs):
        raise FitError(f"{what}: {len(y)} measurements for {len(specs)} parameters; the fit needs at least as many "
                       f"points as parameters (check the measurement directory and the model name)")
    p0 = np.array([s.p0 for s in specs], float)
    lo = np.array([s.lo for s in specs], float)
    hi = np.array([s.hi for s in specs], float)
    # curve_fit needs a strictly feasible start: nudge guesses on or outside a bound inside it
    width = np.where(np.isfinite(hi - lo), hi - lo, np.maximum(np.abs(p0), 1.0))
    p0 = np.minimum(np.maximum(p0, lo + 1e-6 * width), hi - 1e-6 * width)

    def wrapped(_x, *theta):
        return np.asarray(func(*theta), float)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OptimizeWarning)
        try:
            popt, pcov = curve_fit(wrapped, None, y, p0=p0, sigma=sigma, bounds=(lo, hi), method="trf",
                                   x_scale="jac", max_nfev=20000)
        except (RuntimeError, ValueError) as e:
            raise FitError(f"{what}: curve_fit failed ({e}); check that the measurements cover the model's inputs") from e
    perr = np.sqrt(np.clip(np.diag(pcov), 0, np.inf)) if np.all(np.isfinite(pcov)) else np.full(len(popt), np.nan)
    span = np.where(np.isfinite(hi - lo), hi - lo, np.maximum(np.abs(popt), 1.0))
    at_bound = [s.name for i, (s, v) in enumerate(zip(specs, popt))
                if (np.isfinite(s.lo) and abs(v - s.lo) <= 1e-6 * span[i] + 1e-12)
                or (np.isfinite(s.hi) and abs(v - s.hi) <= 1e-6 * span[i])]
    res = np.asarray(wrapped(None, *popt)) - y
    wres = res / sigma if sigma is not None else res
    values = {s.name: float(v) for s, v in zip(specs, popt)}
    stderr = {s.name: (float("nan") if s.name in at_bound else float(e)) for s, e in zip(specs, perr)}
    return Fitted(values, stderr, at_bound, float(np.sum(wres ** 2)))


def _stable_hash(key: Any) -> int:
    return int(hashlib.sha1(str(key).encode()).hexdigest()[:8], 16)


def grouped_folds(groups: Sequence[Any], k: int = 5) -> list[tuple[np.ndarray, np.ndarray]]:
    """Deterministic k-fold split over ``groups`` (whole groups go to one fold).

    Groups are ordered by a stable hash of their key and dealt round-robin into ``k`` folds,
    so the split does not depend on the row order or on Python's hash seed. With fewer than
    ``k`` groups, leave-one-group-out is used.
    """
    groups = np.asarray([str(g) for g in groups])
    uniq = sorted(set(groups.tolist()), key=lambda g: (_stable_hash(g), g))
    k = max(2, min(k, len(uniq)))
    fold_of = {g: i % k for i, g in enumerate(uniq)}
    fid = np.array([fold_of[g] for g in groups])
    return [(np.flatnonzero(fid != f), np.flatnonzero(fid == f)) for f in range(k)]


def cross_val_predict(fit: Callable[[np.ndarray], Any], predict: Callable[[Any, np.ndarray], np.ndarray],
                      n: int, groups: Sequence[Any], k: int = 5, train_mask: np.ndarray | None = None) -> np.ndarray:
    """Out-of-fold predictions: for each fold, ``fit(train_idx)`` then ``predict(model, test_idx)``.

    ``train_mask`` restricts which rows may be used for fitting (e.g. windows whose step
    composition is not observed are only ever predicted); every row is predicted by a model
    fitted without its group.
    """
    out = np.full(n, np.nan)
    tm = np.ones(n, bool) if train_mask is None else np.asarray(train_mask, bool)
    for tr, te in grouped_folds(groups, k):
        tr = tr[tm[tr]]
        if len(tr) == 0:
            continue
        try:
            model = fit(tr)
        except FitError:
            continue
        out[te] = predict(model, te)
    return out


def choose(candidates: dict[str, dict[str, Any]], key: str = "mape_pct", tol: float = 0.02) -> str:
    """Name of the candidate with the lowest held-out ``key``; within ``tol`` relative of the
    best, the one with fewer parameters wins (Occam)."""
    scored = [(name, c["heldout"][key], len(c["params"])) for name, c in candidates.items()
              if np.isfinite(c["heldout"].get(key, np.nan))]
    if not scored:
        raise FitError("no candidate form could be scored on held-out data")
    best = min(s for _, s, _ in scored)
    near = [(npar, s, name) for name, s, npar in scored if s <= best * (1 + tol) + 1e-12]
    return min(near)[2]


# ------------------------------------------------------------------------------------------
# the quality gate of `twin calibrate fit`
# ------------------------------------------------------------------------------------------

#: The largest held-out MAPE (percent) a fitted component may have for ``twin calibrate fit`` to write its profile.
#: The shipped fits stay well below it (the largest: the scheduler's per-step host time, 27.9 % for Llama-3.1-8B and
#: 24.9 % for Qwen-2.5-7B; every other component below 17 %), while a failed fit lands near 100 % (every constant at
#: 0: the model predicts nothing) or far above (step times in microseconds read as milliseconds: 297 %).
MAX_HELDOUT_MAPE_PCT = 50.0


class PoorFitError(FitError):
    """A fit that ran but does not describe its tables (:func:`fit_quality_problems`); ``twin calibrate fit`` writes
    no profile unless ``--allow-poor-fit`` is given. ``problems``: one line per failing component."""

    def __init__(self, message: str, problems: list[str]):
        super().__init__(message)
        self.problems = problems


def fit_quality_problems(profile: dict[str, Any]) -> list[str]:
    """What makes a fitted profile unusable, one line per component: every constant its fit estimated ended on a
    bound of the fit (``at_bound`` covers all the params not ``fixed``), or its held-out error exceeds
    :data:`MAX_HELDOUT_MAPE_PCT` or its held-out R^2 is below 0 (worse than predicting the mean). Components that
    were estimated or carried over (no held-out score, nothing at a bound) pass."""
    out: list[str] = []
    for kind, comp in (profile.get("components") or {}).items():
        fixed = set(comp.get("fixed") or [])
        params = {k: v for k, v in (comp.get("params") or {}).items()
                  if k not in fixed and isinstance(v, (int, float)) and not isinstance(v, bool)}
        at = set(comp.get("at_bound") or [])
        units = comp.get("units") or {}
        why: list[str] = []
        if params and at and all(k in at for k in params):
            vals = ", ".join(f"{k} = {v:.4g}{' ' + units[k] if k in units else ''}" for k, v in params.items())
            why.append(f"every constant its fit estimated ended on a bound of the fit ({vals})")
        held = ((comp.get("fit") or {}).get("heldout") or {}).get("all") or {}
        m, r2 = held.get("mape_pct"), held.get("r2")
        bad_m = isinstance(m, (int, float)) and math.isfinite(m) and m > MAX_HELDOUT_MAPE_PCT
        bad_r2 = isinstance(r2, (int, float)) and math.isfinite(r2) and r2 < 0
        if bad_m or bad_r2:
            figs = [f"held-out MAPE {m:.4g} %" + (f" (the limit: {MAX_HELDOUT_MAPE_PCT:g} %)" if bad_m else "")
                    if isinstance(m, (int, float)) else "",
                    f"held-out R^2 {r2:.3g}" + (" (below 0: worse than the mean)" if bad_r2 else "")
                    if isinstance(r2, (int, float)) else ""]
            why.append(", ".join(f for f in figs if f))
        if why:
            out.append(f"{kind} ({comp.get('form', '?')}): " + "; ".join(why))
    return out


#: what usually makes a fit fail the gate, for the error message
POOR_FIT_CAUSES = ("the tables' times in another unit than the fit reads (the *_ms columns are milliseconds: "
                   "microseconds put every constant at its upper bound), or a column holding another quantity than "
                   "its name says (a scheduler time above the step time leaves the base model nothing: every constant "
                   "at 0)")


def check_fit_quality(profile: dict[str, Any]) -> None:
    """Raise :class:`PoorFitError` naming each failing component, its figures and the likely cause when
    :func:`fit_quality_problems` finds any."""
    problems = fit_quality_problems(profile)
    if problems:
        raise PoorFitError(
            f"the fit of profile {profile.get('name', '?')!r} does not describe its tables, so no profile was "
            f"written:\n  " + "\n  ".join(problems) + f"\nLikely cause: {POOR_FIT_CAUSES}. Check the measurement "
            f"directory's tables against its README; --allow-poor-fit writes the profile anyway (the problems are "
            f"recorded in its provenance.poor_fit)", problems)
