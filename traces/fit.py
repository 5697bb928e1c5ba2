"""Fit the committed statistics in ``traces/data/`` from the real data, with this package's code.

Run once (and again whenever the data or the fitting code changes)::

    .venv/bin/python -m traces.fit --data-dir ../shared/data

It writes

* ``traces/data/splitwise_conv_fit.json`` and ``splitwise_code_fit.json`` -- from the Azure LLM
  inference traces (Splitwise): the mean rate, a 60 s rate profile (relative rate per bin,
  mean 1), the inter-arrival CV of the raw trace and of the *de-trended* trace (gaps in
  operational time ``Lambda(t)``, which is the CV of the renewal process that
  :func:`traces.arrivals.profiled_renewal` draws), the lengths' Gaussian-copula fit
  (:class:`traces.lengths.CopulaLengths`), a bivariate lognormal fit and summary statistics.
  ``splitwise-synth`` generates from these numbers without the trace.
* ``traces/data/sharegpt_lengths.json`` -- knots of piecewise-linear CDFs for ShareGPT V3
  prompt and output lengths: the histogram bin edges of ``lengths/sharegpt_{prompt,output}_hist.csv``
  with their cumulative shares, plus the reported P25 and P75 as extra knots (they refine the
  tall first bins), and the resulting means before and after the real runs' filters.

Only derived numbers are committed; the data files stay in the data directory. Each JSON
records the source file's sha256 and this command.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from traces.datadir import data_dir, sha256_file

from traces import arrivals as arr
from traces.lengths import DATA, SHAREGPT_FILTER, CopulaLengths, LognormalLengths, ShareGPTLengths
from traces.loaders.azure_llm import load_azure_llm

COMMAND = "python -m traces.fit --data-dir ../shared/data"
BIN_S = 60.0
SPLITWISE_FILES = {"conv": "traces/AzureLLMInferenceTrace_conv.csv", "code": "traces/AzureLLMInferenceTrace_code.csv"}
SHAREGPT_HIST = {"prompt": "lengths/sharegpt_prompt_hist.csv", "output": "lengths/sharegpt_output_hist.csv"}
#: Statistics of ShareGPT V3 (prompts <= 1024, Llama-2 tokenizer) reported with the histograms.
SHAREGPT_REPORTED = {"prompt": {"mean": 250.9, "p25": 23.0, "p75": 423.0},
                     "output": {"mean": 231.5, "p25": 27.0, "p75": 359.0}}




def _pct(x: np.ndarray) -> dict[str, float]:
    return {"mean": round(float(x.mean()), 3), "p25": float(np.percentile(x, 25)), "p50": float(np.percentile(x, 50)),
            "p75": float(np.percentile(x, 75)), "p90": float(np.percentile(x, 90)), "p99": float(np.percentile(x, 99)),
            "max": float(x.max())}


def fit_arrivals(t: np.ndarray, bin_s: float = BIN_S) -> dict[str, Any]:
    """Mean rate, rate profile, raw and de-trended inter-arrival CV of sorted times ``t``."""
    t = np.sort(t - t.min())
    span = float(t[-1])
    prof = arr.rate_profile(t, bin_s, span)
    # operational time: Lambda(t) = integral of the relative rate, so gaps have mean 1/rps
    t_k, lam_k = arr.cumulative_intensity(prof, bin_s, span)
    tau = np.interp(t, t_k, lam_k)
    return {"requests": int(t.size), "duration_s": round(span, 6), "mean_rps": round(t.size / span, 6),
            "bin_s": bin_s, "profile": [round(float(v), 5) for v in prof],
            "raw_cv": round(arr.interarrival_cv(t), 5), "renewal_cv": round(arr.interarrival_cv(tau), 5),
            "zero_gaps_share": round(float((np.diff(t) == 0).mean()), 6)}


def fit_splitwise(path: Path) -> dict[str, Any]:
    """The ``splitwise*-synth`` statistics of one Azure LLM trace."""
    tab = load_azure_llm(path).df
    p, o = tab["prompt_tokens"].to_numpy(), tab["output_tokens"].to_numpy()
    ln = LognormalLengths.fit(p, o)
    return {
        "source": path.name, "sha256": sha256_file(path), "command": COMMAND,
        "arrivals": fit_arrivals(tab["arrival_s"].to_numpy()),
        "lengths": {
            "copula": CopulaLengths.fit(p, o, source=path.name).__dict__,
            "lognormal": {k: round(float(v), 6) for k, v in ln.__dict__.items()},
            "prompt": _pct(p), "output": _pct(o),
        },
    }


def sharegpt_knots(hist: pd.DataFrame, reported: dict[str, float]) -> tuple[list[float], list[float], list[str]]:
    """CDF knots through the histogram edges plus the reported quartiles where consistent."""
    lo, hi, cnt = (hist[c].to_numpy(float) for c in ("bin_lo_tokens", "bin_hi_tokens", "count_approx"))
    x = np.r_[lo[0], hi]
    F = np.r_[0.0, np.cumsum(cnt) / cnt.sum()]
    notes = []
    for q, key in ((0.25, "p25"), (0.75, "p75")):
        v = reported[key]
        j = int(np.searchsorted(x, v))  # x[j-1] < v <= x[j]
        if 0 < j < x.size and F[j - 1] < q < F[j] and x[j - 1] < v < x[j]:
            x = np.insert(x, j, v)
            F = np.insert(F, j, q)
            notes.append(f"{key}={v:g} inserted as a knot")
        else:
            notes.append(f"{key}={v:g} inconsistent with the histogram, not used")
    return [round(float(v), 4) for v in x], [round(float(v), 6) for v in F], notes


def fit_sharegpt(data_dir: Path) -> dict[str, Any]:
    """The ``sharegpt_lengths.json`` content from the histogram CSVs."""
    out: dict[str, Any] = {"command": COMMAND, "sources": {}, "reported": SHAREGPT_REPORTED,
                           "filter_of_real_runs": "prompt >= 4, output >= 4, prompt <= 1024, prompt + output <= 2048",
                           "note": "bar heights were read by eye from the peer repository's plots (30 equal bins); "
                                   "CDF linear between knots"}
    for side, rel in SHAREGPT_HIST.items():
        f = data_dir / rel
        if not f.exists():
            raise FileNotFoundError(f"{rel} not found in the data directory {data_dir}; set TWIN_DATA_DIR or "
                                    f"--data-dir to the shared data directory")
        hist = pd.read_csv(f)
        x, F, notes = sharegpt_knots(hist, SHAREGPT_REPORTED[side])
        xs, Fs = np.asarray(x), np.asarray(F)
        mean = float(np.sum((xs[1:] + xs[:-1]) / 2 * np.diff(Fs)))
        out[side] = {"knots_x": x, "knots_F": F, "knot_notes": notes, "mean_unfiltered": round(mean, 3)}
        out["sources"][side] = {"file": rel, "sha256": sha256_file(f)}
    knots = {s: (np.asarray(out[s]["knots_x"]), np.asarray(out[s]["knots_F"])) for s in SHAREGPT_HIST}
    mi, mo = ShareGPTLengths(knots["prompt"], knots["output"], SHAREGPT_FILTER).expected_means()
    out["means_with_real_run_filter"] = {"prompt": round(mi, 3), "output": round(mo, 3)}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m traces.fit", description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", default=None, help="data directory (default: $TWIN_DATA_DIR)")
    ap.add_argument("--out", default=str(DATA), help="where to write the JSON files (default: traces/data)")
    args = ap.parse_args(argv)
    root = data_dir(args.data_dir)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, rel in SPLITWISE_FILES.items():
        f = root / rel
        if not f.exists():
            raise SystemExit(f"{rel} not found in the data directory {root}; run `twin traces fetch "
                             f"{'splitwise' if name == 'conv' else 'splitwise-code'}` or set --data-dir")
        fit = fit_splitwise(f)
        (out / f"splitwise_{name}_fit.json").write_text(json.dumps(fit, indent=1) + "\n")
        a = fit["arrivals"]
        print(f"splitwise {name}: {a['requests']} requests, {a['mean_rps']:.3f} req/s, raw CV {a['raw_cv']:.3f}, "
              f"renewal CV {a['renewal_cv']:.3f}")
    sg = fit_sharegpt(root)
    (out / "sharegpt_lengths.json").write_text(json.dumps(sg, indent=1) + "\n")
    print(f"sharegpt: unfiltered means {sg['prompt']['mean_unfiltered']}/{sg['output']['mean_unfiltered']}, "
          f"with the real runs' filter {sg['means_with_real_run_filter']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
