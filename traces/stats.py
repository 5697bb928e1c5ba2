"""Summary statistics of a workload (``twin traces show``): counts, rates, burstiness, lengths,
adapter popularity and conversations, as a dict, a text table or a figure."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from traces.adapters import top_k_share
from traces.arrivals import MIN_ADAPTER_REQUESTS, interarrival_cv, per_adapter_interarrival_cv
from traces.workload import Workload

PERCENTILES = (50, 90, 99)


def _pcts(x: np.ndarray) -> dict[str, float]:
    if x.size == 0:
        return {}
    d = {"mean": round(float(x.mean()), 2)}
    d.update({f"p{q}": float(np.percentile(x, q)) for q in PERCENTILES})
    d["max"] = int(x.max())
    return d


def auto_bin(duration_s: float) -> float:
    """A readable bin for the rate-over-time series: about 20 bins of 1/5/10/30/60/300/600/3600 s."""
    for b in (1, 5, 10, 30, 60, 300, 600, 1800, 3600, 21600, 86400):
        if duration_s / b <= 30:
            return float(b)
    return 86400.0


#: the most bins of a rate-over-time series
MAX_BINS = 10_000_000


def _bin_rates(counts: np.ndarray, b: float, dur: float) -> list[float]:
    """Arrivals per second in each bin of width ``b`` from the first arrival: the last bin ends at the last
    arrival, so it is divided by its own width, and left out when that is under half a bin (a few
    arrivals over a sliver of time are no rate); a trace shorter than one bin keeps its one bin."""
    widths = np.minimum(b, dur - np.arange(len(counts)) * b) if dur > 0 else np.full(len(counts), b)
    keep = widths >= 0.5 * b
    keep[0] = True
    return [round(float(c) / max(float(w), 1e-9), 4) for c, w, k in zip(counts, widths, keep) if k] if dur > 0 else \
        [round(float(c) / b, 4) for c in counts]


def summarize(w: Workload, bin_s: float | None = None, top_k: tuple[int, ...] = (1, 5, 10)) -> dict[str, Any]:
    """The statistics ``twin traces show`` prints."""
    df = w.df
    t = df["arrival_s"].to_numpy()
    n = len(df)
    dur = float(t.max() - t.min()) if n > 1 else 0.0
    b = bin_s or auto_bin(max(dur, 1.0))
    if dur / b > MAX_BINS:
        raise ValueError(f"--bin-s {b:g}: {dur / b:.3g} bins over the trace's {dur:g} s, more than {MAX_BINS:,}; "
                         f"give a bin of at least {dur / MAX_BINS:.3g} s (e.g. --bin-s {auto_bin(max(dur, 1.0)):g})")
    counts = np.bincount(((t - (t.min() if n else 0)) // b).astype(np.int64), minlength=1) if n else np.zeros(1)
    ids = df["adapter_id"].to_numpy()
    with_adapter = ids[ids >= 0]
    rank_counts = df.loc[df["adapter_id"] >= 0, "adapter_rank"].value_counts().sort_index()
    conv = df["conversation_id"].to_numpy()
    s: dict[str, Any] = {
        "source": w.meta.get("source", ""),
        "requests": int(n),
        "duration_s": round(dur, 3),
        "mean_rps": round(n / dur, 4) if dur > 0 else float("nan"),
        "interarrival_cv": round(interarrival_cv(t), 4),
        "adapter_interarrival_cv": _adapter_cv(t, df["adapter_id"].to_numpy()),
        "rate_over_time": {"bin_s": b, "rps": _bin_rates(counts, b, dur)},
        "prompt_tokens": _pcts(df["prompt_tokens"].to_numpy()),
        "output_tokens": _pcts(df["output_tokens"].to_numpy()),
        "adapters": int(np.unique(with_adapter).size),
        "base_model_requests": int((ids < 0).sum()),
        "top_k_share": {str(k): round(top_k_share(ids, k), 4) for k in top_k} if with_adapter.size else {},
        "rank_share": {str(int(r)): round(float(c) / max(with_adapter.size, 1), 4) for r, c in rank_counts.items()},
        "conversations": int(np.unique(conv[conv >= 0]).size),
        "multi_turn_requests": int((df["turn"].to_numpy() > 0).sum()),
        "mean_prefix_tokens": round(float(df["prefix_tokens"].mean()), 2) if n else 0.0,
    }
    retimed = ((w.meta.get("transform") or {}).get("arrivals") or {}) if w.meta.get("kind") == "real" else {}
    if retimed.get("process"):  # a trace whose timestamps were replaced by a drawn process (arrival=poisson|gamma)
        s["arrivals_retimed"] = {"process": retimed["process"], "rps": retimed.get("rps"),
                                 "rps_given": ((w.meta.get("config") or {}).get("arrivals") or {}).get("rps") is not None}
    dropped = _dropped_by_adapters_from_key(w.meta)
    if dropped:  # (requests of the trace that are not in the workload: say how many, and why)
        s["dropped_by_adapters_from_key"] = dropped
    return s


def _dropped_by_adapters_from_key(meta: dict[str, Any]) -> dict[str, Any] | None:
    """``{"requests": n, "reason": ...}`` when ``adapters_from=key`` dropped ``n`` > 0 requests of the trace
    (``transform.dropped_by_adapters_from_key`` and ``transform.adapters_from_key_reason`` of the workload's meta,
    :mod:`traces.registry`), else None (nothing dropped, or another kind of workload)."""
    tr = meta.get("transform") if isinstance(meta, dict) else None
    if not isinstance(tr, dict):
        return None
    n = tr.get("dropped_by_adapters_from_key")
    if isinstance(n, bool) or not isinstance(n, (int, float, np.integer)) or not n > 0:
        return None
    return {"requests": int(n), "reason": str(tr.get("adapters_from_key_reason") or "")}


def _adapter_cv(t: np.ndarray, ids: np.ndarray) -> dict[str, Any]:
    cv, n = per_adapter_interarrival_cv(t, ids)
    return {"median": round(cv, 4), "adapters": n, "min_requests": MIN_ADAPTER_REQUESTS}


def _or_why(v: Any, fmt: str, unit: str, requests: int, why: str) -> str:
    """A statistic as text, or why it is undefined (``nan req/s`` was printed for one request)."""
    if v is None or (isinstance(v, float) and not np.isfinite(v)):
        return f"n/a ({requests:,} request{'s' * (requests != 1)}: {why})"
    return f"{v:{fmt}}{unit}"


def format_summary(s: dict[str, Any]) -> str:
    """A two-column text table of :func:`summarize`'s dict."""
    rows: list[tuple[str, str]] = [
        ("source", str(s["source"])), ("requests", f"{s['requests']:,}"), ("duration", f"{s['duration_s']:.1f} s"),
        ("mean rate", _or_why(s["mean_rps"], ".3f", " req/s", s["requests"], "their arrivals span 0 s")),
        ("inter-arrival CV", _or_why(s["interarrival_cv"], ".3f", "", s["requests"],
                                     "fewer than 2 gaps" if s["requests"] < 3 else "every gap is 0 s")),
    ]
    rt = s.get("arrivals_retimed")
    if rt:  # (the trace's own timestamps are not these: say so, and where the rate came from)
        rows.insert(1, ("arrivals", f"re-timed: {rt['process']} at {rt['rps']:g} req/s "
                                    f"({'--rps' if rt['rps_given'] else 'the default; --rps sets it'}), not the "
                                    f"trace's timestamps"))
    r = np.asarray(s["rate_over_time"]["rps"])
    if r.size:
        rows.append((f"rate per {s['rate_over_time']['bin_s']:g} s bin",
                     f"min {r.min():.2f} / mean {r.mean():.2f} / max {r.max():.2f} req/s ({r.size} bins)"))
    for col in ("prompt_tokens", "output_tokens"):
        d = s[col]
        if d:
            rows.append((col.replace("_", " "), f"mean {d['mean']:.1f}  " + "  ".join(
                f"p{q} {d[f'p{q}']:.0f}" for q in PERCENTILES) + f"  max {d['max']}"))
    rows.append(("adapters", f"{s['adapters']} (+{s['base_model_requests']} base-model requests)"))
    dropped = s.get("dropped_by_adapters_from_key")
    if dropped:
        rows.append(("dropped requests", f"{dropped['requests']:,} of the trace: "
                                         + (dropped["reason"] or "adapters_from=key left their keys without adapter")))
    a = s.get("adapter_interarrival_cv") or {}
    if a.get("adapters"):
        rows.append(("per-adapter gap CV", f"median {a['median']:.3f} over the {a['adapters']} adapters with >= "
                                           f"{a['min_requests']} requests (a sweep's arrival gamma:CV)"))
    if s["top_k_share"]:
        rows.append(("top-k adapter share", "  ".join(f"top-{k} {v:.1%}" for k, v in s["top_k_share"].items())))
    if s["rank_share"]:
        rows.append(("rank share", "  ".join(f"r{k} {v:.1%}" for k, v in s["rank_share"].items())))
    if s["conversations"]:
        rows.append(("conversations", f"{s['conversations']} ({s['multi_turn_requests']} later turns, "
                                      f"mean prefix {s['mean_prefix_tokens']:.0f} tokens)"))
    w = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{w}}  {v}" for k, v in rows)


def to_json(s: dict[str, Any]) -> str:
    """The summary as JSON; a figure that is not a number (NaN: the rate of one request) is null, as JSON has no NaN
    (``"mean_rps": NaN`` was printed, which JSON readers refuse)."""
    def clean(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [clean(x) for x in v]
        if isinstance(v, np.generic):  # (numpy scalars)
            v = v.item()
        return None if isinstance(v, float) and not math.isfinite(v) else v
    return json.dumps(clean(s), indent=1, default=float, allow_nan=False)


def plot_summary(w: Workload, path: str | Path, s: dict[str, Any] | None = None) -> Path:
    """A 2x2 figure: rate over time, length CDFs, adapter popularity (rank-frequency), inter-arrival histogram."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = s or summarize(w)
    df = w.df
    fig, ax = plt.subplots(2, 2, figsize=(11, 7))
    r = s["rate_over_time"]
    ax[0, 0].step(np.arange(len(r["rps"])) * r["bin_s"], r["rps"], where="post")
    ax[0, 0].set(title="rate over time", xlabel="time (s)", ylabel=f"req/s per {r['bin_s']:g} s")
    for col in ("prompt_tokens", "output_tokens"):
        x = np.sort(df[col].to_numpy())
        if x.size:
            ax[0, 1].plot(x, np.arange(1, x.size + 1) / x.size, label=col)
    ax[0, 1].set(title="length CDF", xlabel="tokens", ylabel="CDF", xscale="log")
    ax[0, 1].legend()
    ids = df["adapter_id"].to_numpy()
    ids = ids[ids >= 0]
    if ids.size:
        c = np.sort(np.bincount(ids))[::-1]
        c = c[c > 0]
        ax[1, 0].loglog(np.arange(1, c.size + 1), c / ids.size, ".-")
    ax[1, 0].set(title="adapter popularity", xlabel="adapter (by popularity)", ylabel="share of requests")
    t = df["arrival_s"].to_numpy()
    if t.size > 2:
        g = np.diff(t)
        ax[1, 1].hist(g, bins=60, log=True)
    ax[1, 1].set(title=f"inter-arrival gaps (CV {s['interarrival_cv']:.2f})", xlabel="s", ylabel="count")
    fig.suptitle(f"{s['source']}: {s['requests']:,} requests, {s['mean_rps']:.2f} req/s")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
