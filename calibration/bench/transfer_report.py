"""What an ``h2d_copy.csv`` says about the host-to-GPU link (torch-free).

The twin moves adapters over one FIFO host link (``twin/adapters.py``, ``HostLink``): concurrent loads share
its bandwidth, and a load does not slow the step that runs meanwhile. A bench's ``h2d_copy.csv`` tests both:

* copies alone, ``concurrent`` at once: each memory kind's bandwidth and the makespan of ``N`` copies over one
  copy's (``N`` for a link the copies share, 1 for independent links);
* ``with_compute`` rows (tables written since the mode was added): the same pinned copies while a loop of GEMMs
  runs on another CUDA stream; how much longer the copies take than alone (``copy_slowdown``) and how much longer
  the compute takes than alone (``compute_slowdown``; 1 = a load costs the running step nothing).

Tables written before the ``with_compute`` mode (``results/calibration/bench_h200/linear_h2d_load``) have no such
columns: :func:`read_h2d_table` reads every row of them as a copy alone.

    python -m calibration.bench.transfer_report results/calibration/bench_h200/linear_h2d_load
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from calibration.bench.schema import H2D_COPY_COLUMNS

H2D_FILE = "h2d_copy.csv"
#: the columns a table written before the ``with_compute`` mode lacks, and their value for its rows
WITH_COMPUTE_DEFAULTS = {"with_compute": False, "overlap": "", "copy_ms_alone": np.nan, "copy_slowdown": np.nan,
                         "compute_ms": np.nan, "compute_ms_alone": np.nan, "compute_slowdown": np.nan,
                         "compute_gemms": np.nan}


def read_h2d_table(path: str | Path) -> pd.DataFrame:
    """``h2d_copy.csv`` (a file or the bench's ``--out`` directory), old or new: a table without the
    ``with_compute`` columns gets them (every row a copy alone); a clear error when it is not such a table."""
    p = Path(path)
    if p.is_dir():
        p = p / H2D_FILE
    if not p.is_file():
        raise FileNotFoundError(f"{p}: no {H2D_FILE} here; run `twin calibrate bench --parts h2d --out DIR` first")
    try:
        df = pd.read_csv(p)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise ValueError(f"{p}: not a readable CSV ({type(e).__name__}); give the {H2D_FILE} a bench run "
                         f"wrote") from None
    missing = [c for c in H2D_COPY_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"{p}: not a host-to-device copy table (missing columns {missing})")
    if len(df) == 0:
        raise ValueError(f"{p}: the table has no rows (the h2d part measured nothing)")
    for col, default in WITH_COMPUTE_DEFAULTS.items():
        if col not in df.columns:
            df[col] = default
    # (a partial table, or one read back from CSV: booleans as text, empty cells as NaN)
    df["with_compute"] = df["with_compute"].map(lambda v: str(v).strip().lower() in ("true", "1")).astype(bool)
    df["overlap"] = df["overlap"].fillna("").astype(str)
    return df


def _range(lo: float, hi: float, fmt: str) -> str:
    """``lo-hi`` in ``fmt``, or one value where they agree to 0.5 %."""
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return "-"
    return fmt.format(lo) if np.isclose(lo, hi, rtol=5e-3) else f"{fmt.format(lo)}-{fmt.format(hi)}"


def h2d_summary(df: pd.DataFrame) -> pd.DataFrame:
    """Per (memory, concurrent, with_compute): the ranks, the bandwidth range, the makespan over one copy's
    (copies alone of the same rank and memory, ``concurrent=1``), and for ``with_compute`` rows the copies' and
    the compute's slowdowns."""
    alone = df[~df["with_compute"]]
    one = alone[alone["concurrent"] == 1].set_index(["memory", "adapter_rank"])["time_ms_mean"]
    out = []
    for (memory, c, wc), g in df.groupby(["memory", "concurrent", "with_compute"], sort=True):
        ref = [one.get((memory, r), np.nan) for r in g["adapter_rank"]]
        ratio = g["time_ms_mean"].to_numpy(float) / np.asarray(ref, float)
        out.append({"memory": memory, "concurrent": int(c), "with_compute": bool(wc), "ranks": len(g),
                    "gbps_min": float(g["gbps"].min()), "gbps_max": float(g["gbps"].max()),
                    "makespan_over_one_min": float(np.nanmin(ratio)) if np.isfinite(ratio).any() else np.nan,
                    "makespan_over_one_max": float(np.nanmax(ratio)) if np.isfinite(ratio).any() else np.nan,
                    "copy_slowdown_median": float(g["copy_slowdown"].median()) if wc else np.nan,
                    "compute_slowdown_median": float(g["compute_slowdown"].median()) if wc else np.nan,
                    "compute_slowdown_max": float(g["compute_slowdown"].max()) if wc else np.nan,
                    "overlap": ",".join(sorted(set(g["overlap"]) - {""})) if wc else ""})
    return pd.DataFrame(out)


def _row_text(r) -> tuple[str, str, str]:
    span = _range(r.makespan_over_one_min, r.makespan_over_one_max, "{:.2f}")
    gbps = _range(r.gbps_min, r.gbps_max, "{:.1f}")
    extra = ""
    if r.with_compute:
        extra = (f"copies x{r.copy_slowdown_median:.2f} their time alone, compute x{r.compute_slowdown_median:.2f} "
                 f"(max x{r.compute_slowdown_max:.2f}; {r.overlap})")
    return gbps, span, extra


def h2d_lines(df: pd.DataFrame) -> list[str]:
    summ = h2d_summary(df)
    device = str(df["device"].iloc[0]) if "device" in df else "?"
    lines = [f"host-to-device copies ({H2D_FILE}, {device}): bandwidth, makespan over one copy's, and with a "
             f"compute job on another stream"]
    for r in summ.itertuples():
        gbps, span, extra = _row_text(r)
        mode = " +compute" if r.with_compute else " " * 9
        lines.append(f"  {r.memory:<8} x{r.concurrent}{mode}  {r.ranks} ranks  {gbps:>11} GB/s  "
                     f"makespan / one copy's {span}" + (f"  {extra}" if extra else ""))
    if not summ["with_compute"].any():
        lines.append("  (no with_compute rows: a table written before that mode; copies alone only)")
    return lines


def h2d_markdown(df: pd.DataFrame) -> str:
    summ = h2d_summary(df)
    lines = ["## Host-to-device copies", "",
             "Makespan of `N` copies at once over one copy's time (`N` = one link the copies share); `+compute`: the "
             "copies while a GEMM loop runs on another CUDA stream, each beside its time alone.", "",
             "| memory | copies at once | with compute | ranks | GB/s | makespan / one copy's | copies' slowdown | "
             "compute's slowdown |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in summ.itertuples():
        gbps, span, _ = _row_text(r)
        cs = f"{r.copy_slowdown_median:.2f}" if r.with_compute else ""
        ps = (f"{r.compute_slowdown_median:.2f} (max {r.compute_slowdown_max:.2f}, {r.overlap})" if r.with_compute
              else "")
        lines.append(f"| {r.memory} | {r.concurrent} | {'yes' if r.with_compute else 'no'} | {r.ranks} | {gbps} | "
                     f"{span} | {cs} | {ps} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m calibration.bench.transfer_report",
                                description="Summarise a bench's h2d_copy.csv (copies alone, concurrent, and with "
                                            "a compute job on another CUDA stream).")
    p.add_argument("bench", help="the bench's --out directory (or its h2d_copy.csv)")
    p.add_argument("--markdown", metavar="MD", help="also write the summary as Markdown")
    args = p.parse_args(argv)
    try:
        df = read_h2d_table(args.bench)
    except (FileNotFoundError, ValueError) as e:
        print(f"{p.prog}: error: {e}", file=sys.stderr)
        return 2
    print("\n".join(h2d_lines(df)))
    if args.markdown:
        Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
        Path(args.markdown).write_text(h2d_markdown(df))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
