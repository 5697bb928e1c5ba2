"""The real-run tables and what the twin needs of one run (:class:`RunSpec`).

Every row of a real-run table (``validation/vllm085_*.csv`` in the data directory, see its
README) is one one-hour vLLM 0.8.5 run; the published twin's predictions for the same
scenarios sit beside it (``peer_twin_*.csv``). This module reads both, joins them on
:data:`RUN_KEYS`, selects runs (:func:`select_runs`) and turns a row into a :class:`RunSpec`
(:func:`spec_from_row`): the run's configuration only, never its measured figures.
"""

from __future__ import annotations

import math
import os
import warnings
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pandas as pd

from traces.arguments import cell_error, csv_layout_problem, parse_list
from traces.datadir import require, unset_data_dir_hint
from traces.registry import MAX_REQUESTS
from twin.scenario import MAX_SIM_SECONDS, VLLM_MAX_LORA_RANKS
from twin.validation.metrics import METRICS

WINDOW_S = 3600.0

#: Key columns that identify a scenario in both the real and the peer table.
RUN_KEYS = ("source", "ranks", "rates", "served_adapters", "adapter_slots", "max_lora_rank")

#: Real-run statuses that mean "the server could not start with this configuration" (memory).
START_FAILURE_STATUSES = ("failed_kv_insufficient", "failed_no_kv_memory", "failed_cuda_oom",
                          "failed_sampler_warmup_oom")


# --------------------------------------------------------------------------- the tables
def default_real_csv(data_dir: str | os.PathLike | None = None) -> Path:
    return require("validation/vllm085_h100_llama31_8b.csv", data_dir)


def script_inputs(real: str | None, *files: str) -> Path:
    """For a fit or report script's ``main``: the real-run table (``real``, else the default one
    under ``$TWIN_DATA_DIR``), after checking it and ``files`` exist; a missing one ends the script
    with a message naming it and the fix (SystemExit), before any work is done."""
    try:
        real_csv = Path(real) if real else default_real_csv()
    except FileNotFoundError as e:
        raise SystemExit(f"{e} (or pass --real)") from None
    for f in (*files, real_csv):
        if not Path(f).is_file():
            raise SystemExit(f"{str(f)!r} not found (pass --real / the file's option, or set TWIN_DATA_DIR)")
    return real_csv


def default_peer_csv(real_csv: str | os.PathLike) -> Path | None:
    """The ``peer_twin_*.csv`` beside ``real_csv`` for the same model (None if there is none)."""
    real_csv = Path(real_csv)
    stem = real_csv.stem
    parts = stem.split("_")
    # vllm085_h100_llama31_8b -> model tag after the GPU part
    tag = "_".join(parts[2:]) if len(parts) > 2 else stem
    cand = real_csv.parent / f"peer_twin_{tag}.csv"
    if cand.exists():
        return cand
    for p in sorted(real_csv.parent.glob("peer_twin_*.csv")):
        if tag and tag in p.stem:
            return p
    return None


def read_table(path: str | os.PathLike, what: str) -> pd.DataFrame:
    """A CSV table; ``ValueError`` naming the file (and ``what`` it should be) when it is
    missing, empty, binary or not CSV."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"{what} {p} does not exist{unset_data_dir_hint(p)}")
    if p.is_dir():
        raise ValueError(f"{what} {p} is a directory; give the CSV file")
    with open(p, "rb") as fh:
        if b"\0" in fh.read(4096):
            raise ValueError(f"{what} {p} is not a text file (a binary file, not a CSV table)")
    try:
        df = pd.read_csv(p)
    except pd.errors.EmptyDataError:
        raise ValueError(f"{what} {p} is empty; give the CSV table") from None
    except UnicodeDecodeError:
        raise ValueError(f"{what} {p} is not a text file (not UTF-8 CSV)") from None
    except (pd.errors.ParserError, ValueError, OSError) as e:
        raise ValueError(f"{what} {p} is not a readable CSV table ({str(e).strip().splitlines()[0]})") from None
    problem = csv_layout_problem(p)
    if problem:
        raise ValueError(f"{what} {p}: {problem}")
    if df.empty:
        raise ValueError(f"{what} {p} holds no runs (a header but no rows)")
    return df


def _seed_id(run_id: str) -> str:
    """The run id a re-creation's seed comes from: without the ``#k`` :func:`load_real` appends to the copies of one
    run, so every copy is re-created the same (a pasted copy read 2.1 s TTFT once, 6.3 s as each of two copies)."""
    head, sep, k = run_id.rpartition("#")
    return head if sep and k.isdigit() else run_id


class DuplicateRunWarning(UserWarning):
    """A table of real runs lists one row twice, cell for cell (:func:`load_real`)."""


def load_real(path: str | os.PathLike) -> pd.DataFrame:
    df = read_table(path, "real-run table (--real)")
    missing = [c for c in (*RUN_KEYS, "status", "scenario", "run_dir", "offered_req_s", "pool_mean_input_tokens",
                           "pool_mean_output_tokens") if c not in df.columns]
    if missing:
        raise ValueError(f"{path}: not a real-run validation table (missing columns {missing})")
    dup = df.duplicated(keep="first").to_numpy()
    if dup.any():  # (a pasted copy is re-created and scored twice, as run_id#0 and #1: said, not refused, since
        # a table of real runs may repeat a run on purpose and the scoring keeps every row it is given)
        i = int(np.argmax(dup))
        same = (df.iloc[:i] == df.iloc[i]) | (df.iloc[:i].isna() & df.iloc[i].isna())  # (NaN == NaN as a repeat)
        j = int(np.flatnonzero(same.all(axis=1).to_numpy())[0])
        more = f" ({int(dup.sum())} such rows in all)" if dup.sum() > 1 else ""
        warnings.warn(f"{path}: row {i + 1} (line {i + 2}) repeats row {j + 1} (line {j + 2}) cell for cell{more}: "
                      f"the run is re-created and scored once per row; remove the copy if it was pasted by mistake",
                      DuplicateRunWarning, stacklevel=2)
    for c in ("ranks", "rates"):
        df[c] = df[c].astype(str)
    check_real_rows(df, path)
    df["run_id"] = [f"{s}/{sc}/{rd}" for s, sc, rd in zip(df["source"], df["scenario"], df["run_dir"])]
    if df["run_id"].duplicated().any():
        df["run_id"] = df["run_id"] + "#" + df.groupby("run_id").cumcount().astype(str)
    return df


#: the real runs' ``max_num_batched_tokens`` (the engine setting every re-created run starts with)
REAL_MAX_BATCHED_TOKENS = 2048
#: the longest benchmark window a row may give (s): the simulated clock's limit (twin run's)
MAX_WINDOW_S = MAX_SIM_SECONDS

#: integer columns of a real-run row, each >= 1 (the configuration the run was started with)
_REAL_INT_COLUMNS = ("served_adapters", "adapter_slots", "max_lora_rank")
#: columns a run that served (status ``ok``) needs as positive numbers (its workload's lengths)
_REAL_OK_COLUMNS = ("pool_mean_input_tokens", "pool_mean_output_tokens")


#: measured figures of a run with status ``ok`` that the scores compare with: >= 0 where recorded
#: (``benchmark_time_s`` > 0)
_REAL_MEASURED_COLUMNS = ("benchmark_time_s", "total_tok_s", "request_throughput", "mean_itl_ms", "median_itl_ms",
                          "p99_itl_ms", "mean_tpot_ms", "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms",
                          "ttft_ms_incl_unfinished")
#: the server's gauges and token rates of a run with status ``ok`` that the report's diagnostics read (the
#: step mix, the KV tokens per running request): >= 0 where recorded, ``ts_mean_kv_usage`` a fraction
_REAL_GAUGE_COLUMNS = ("input_tok_s", "output_tok_s", "ts_mean_running", "ts_mean_waiting", "ts_max_waiting",
                       "ts_mean_kv_usage", "ts_preemptions")


class UnscoredFigureWarning(UserWarning):
    """A real-run table lacks the column of a figure ``twin validate`` scores (:func:`warn_unscored_figures`)."""


def warn_unscored_figures(df: pd.DataFrame, path: str | os.PathLike) -> list[str]:
    """Name the measured figures (:data:`twin.validation.metrics.METRICS`) a real-run table has no column for: their
    rows of the report read "n 0 / -" (a table without ``total_tok_s`` validated without a word). Returns them."""
    scored = [m.real for m in METRICS if m.real]
    absent = [c for c in scored if c not in df.columns]
    if len(absent) == len(scored):
        warnings.warn(f"{path}: no measured figure (none of the columns {', '.join(scored)}): nothing is scored, the "
                      f"report gives the twin's figures alone", UnscoredFigureWarning, stacklevel=2)
    elif absent:
        which = "that figure is" if len(absent) == 1 else "those figures are"
        warnings.warn(f"{path}: no column {', '.join(absent)}: {which} not scored", UnscoredFigureWarning, stacklevel=2)
    return absent


def check_real_rows(df: pd.DataFrame, path: str | os.PathLike) -> None:
    """Every row the twin re-creates (status ``ok`` or a start failure, :data:`START_FAILURE_STATUSES`;
    other rows are only counted) is a configuration it can build: ``rates`` and ``ranks`` lists of
    positive numbers (``0.4-0.05-0.00625``, ``8-16-32``), the served adapters, slots and max rank
    integers >= 1, and for a run with status ``ok`` positive pool mean lengths. Otherwise an error
    naming the file, the row (its CSV line), the column, the value and the form to give, before any
    run is simulated."""
    def bad(i: int, col: str, what: str) -> ValueError:
        return cell_error(path, df, i, col, what, "fix the row or leave it out of the table")

    status = df["status"].astype(str)
    used = (status.eq("ok") | status.isin(START_FAILURE_STATUSES)).to_numpy()
    ok = status.eq("ok").to_numpy()
    src = df["source"]
    blank = used & (src.isna() | (src.astype(str).str.strip() == "")).to_numpy()
    if blank.any():  # (the run ids are source/scenario/run_dir: it read "nan/...")
        raise bad(int(np.argmax(blank)), "source", "names no subset (e.g. ml_test or dt_modelling)")
    top_rank: dict[int, int] = {}  # row -> its largest adapter rank
    classes: dict[int, dict[str, int]] = {}  # row -> its number of rate and rank classes
    for col, cast, example in (("rates", float, "0.4-0.05-0.00625"), ("ranks", int, "8-16-32")):
        for i in np.flatnonzero(used).tolist():
            try:
                vals = parse_list(df[col].iloc[i], cast, col)
            except ValueError:
                vals = []
            if not vals or not all(np.isfinite(x) and x > 0 for x in vals):
                raise bad(i, col, f"is not a list of positive {'numbers' if cast is float else 'integers'} "
                                  f"(e.g. {example})")
            classes.setdefault(i, {})[col] = len(vals)
            if col == "ranks":
                top_rank[i] = max(vals)
    for col in _REAL_INT_COLUMNS:
        x = pd.to_numeric(df[col], errors="coerce").to_numpy(float)
        with np.errstate(invalid="ignore"):
            wrong = used & (~np.isfinite(x) | (x < 1) | (x != np.round(x)))
        if wrong.any():
            raise bad(int(np.argmax(wrong)), col, "is not an integer >= 1")
    for i, n in classes.items():  # classes assigned round-robin to the served adapters: each needs one
        served = float(df["served_adapters"].iloc[i])
        for col, k in n.items():
            if k > served:
                raise bad(i, col, f"lists {k} classes for {served:g} served adapters (they are assigned "
                                  f"round-robin, so some would serve no adapter)")
    if "adapters_per_rate" in df.columns:  # recorded split of the served adapters: the twin's round-robin one
        for i, n in classes.items():
            cell = df["adapters_per_rate"].iloc[i]
            if cell is None or (isinstance(cell, float) and cell != cell) or not str(cell).strip():
                continue
            served, k = int(float(df["served_adapters"].iloc[i])), n["rates"]
            split = [served // k + (1 if j < served % k else 0) for j in range(k)]
            try:
                given = parse_list(str(cell), int, "adapters_per_rate")
            except ValueError:
                given = None
            if given != split:
                raise bad(i, "adapters_per_rate", f"is not how the twin splits {served} served adapters over "
                                                  f"{k} rate classes (round-robin: {'-'.join(map(str, split))}), so "
                                                  f"the re-created run would differ (an empty cell is not checked)")
    for i in np.flatnonzero(used).tolist():  # vLLM starts only with one of its max ranks (the twin's re-run too)
        if int(float(df["max_lora_rank"].iloc[i])) not in VLLM_MAX_LORA_RANKS:
            raise bad(i, "max_lora_rank", f"is not a max_lora_rank vLLM accepts "
                                          f"({', '.join(map(str, VLLM_MAX_LORA_RANKS))}; LoRAConfig), so no real run "
                                          f"started with it")
    for i, top in top_rank.items():  # vLLM pads every slot to max_lora_rank and refuses a larger adapter
        if float(df["max_lora_rank"].iloc[i]) < top:
            raise bad(i, "max_lora_rank", f"is below the run's largest adapter rank {top} (vLLM would refuse those "
                                          f"adapters)")
    # numbers given as text (absent is NaN, and allowed): the window and the sent count of every
    # re-created run, the measured figures of the runs that served (``float('long')`` failed later,
    # with no row named)
    measured = (*_REAL_MEASURED_COLUMNS, *_REAL_GAUGE_COLUMNS)
    for col in ("benchmark_time_s", "requests_sent", "max_num_seqs", "max_cpu_loras", *measured):
        if col not in df.columns:
            continue
        x = pd.to_numeric(df[col], errors="coerce").to_numpy(float)
        rows = ok if col in measured and col != "benchmark_time_s" else used
        wrong = rows & np.isnan(x) & df[col].notna().to_numpy() & (df[col].astype(str).str.strip() != "").to_numpy()
        if wrong.any():
            what = "a measurement" if col in measured else "a number"
            raise bad(int(np.argmax(wrong)), col, f"is not {what} (leave the cell empty when it was not recorded)")
    if "benchmark_time_s" in df.columns:  # the re-created window: simulated from 0 to it
        x = pd.to_numeric(df["benchmark_time_s"], errors="coerce").to_numpy(float)
        with np.errstate(invalid="ignore"):
            wrong = used & ~np.isnan(x) & ~((x > 0) & (x <= MAX_WINDOW_S))
        if wrong.any():
            raise bad(int(np.argmax(wrong)), "benchmark_time_s", f"is not a benchmark window in seconds, > 0 and at "
                                                                 f"most {MAX_WINDOW_S:g} (leave it empty for "
                                                                 f"{WINDOW_S:g} s)")
    # engine settings: absent (NaN) takes the default; vLLM refuses max_num_seqs < 1 and
    # max_cpu_loras < max_loras (LoRAConfig), the client cannot have sent a negative count
    for col, lo, what in (("max_num_seqs", 1, "is not an integer >= 1 (vLLM's max_num_seqs)"),
                          ("max_cpu_loras", None, "is below adapter_slots (vLLM requires max_cpu_loras >= max_loras)")):
        if col not in df.columns:
            continue
        x = pd.to_numeric(df[col], errors="coerce").to_numpy(float)
        floor = pd.to_numeric(df["adapter_slots"], errors="coerce").to_numpy(float) if lo is None else lo
        with np.errstate(invalid="ignore"):
            wrong = used & np.isfinite(x) & ((x < floor) | (x != np.round(x)))
        if wrong.any():
            raise bad(int(np.argmax(wrong)), col, what)
    if "max_num_seqs" in df.columns:  # vLLM refuses a step budget below the running requests
        x = pd.to_numeric(df["max_num_seqs"], errors="coerce").to_numpy(float)
        with np.errstate(invalid="ignore"):
            wrong = used & (x > REAL_MAX_BATCHED_TOKENS)
        if wrong.any():
            raise bad(int(np.argmax(wrong)), "max_num_seqs", f"is above the real runs' max_num_batched_tokens "
                                                             f"{REAL_MAX_BATCHED_TOKENS} (vLLM refuses a step budget "
                                                             f"below max_num_seqs)")
    if "requests_sent" in df.columns:
        x = pd.to_numeric(df["requests_sent"], errors="coerce").to_numpy(float)
        with np.errstate(invalid="ignore"):
            wrong = used & ~np.isnan(x) & (~np.isfinite(x) | (x < 0) | (x > MAX_REQUESTS))
        if wrong.any():
            raise bad(int(np.argmax(wrong)), "requests_sent", f"is not a request count from 0 to {MAX_REQUESTS:,} "
                                                              f"(leave it empty for the nominal load)")
        with np.errstate(invalid="ignore"):
            wrong = used & np.isfinite(x) & (x != np.round(x))
        if wrong.any():  # (the re-created workload draws this many requests: 12.5 is no count)
            raise bad(int(np.argmax(wrong)), "requests_sent", "is not a whole number of requests (leave it empty "
                                                              "for the nominal load)")
        if "successful_requests" in df.columns:  # a client cannot finish more requests than it sent
            done = pd.to_numeric(df["successful_requests"], errors="coerce").to_numpy(float)
            with np.errstate(invalid="ignore"):
                wrong = ok & np.isfinite(x) & np.isfinite(done) & (done > x)
            if wrong.any():
                i = int(np.argmax(wrong))
                raise bad(i, "requests_sent", f"is below the row's successful_requests {done[i]:g}: the client cannot "
                                              f"finish more requests than it sent; fix either (or leave requests_sent "
                                              f"empty for the nominal load)")
    for i in np.flatnonzero(used).tolist():  # the nominal load a row without requests_sent re-creates
        n = nominal_requests(df.iloc[i])
        if not n <= MAX_REQUESTS:
            raise bad(i, "rates", f"offers {n:,.0f} requests over the run's window, more than the {MAX_REQUESTS:,} a "
                                  f"run may generate (rates in req/s per adapter)")
    for col in _REAL_OK_COLUMNS:
        x = pd.to_numeric(df[col], errors="coerce").to_numpy(float)
        with np.errstate(invalid="ignore"):
            wrong = ok & (~np.isfinite(x) | (x <= 0))
        if wrong.any():
            raise bad(int(np.argmax(wrong)), col, "is not a positive number (a run with status ok needs it)")
    for col in measured:  # measured figures: absent (NaN) is allowed, nonsense is not
        if col not in df.columns:
            continue
        x = pd.to_numeric(df[col], errors="coerce").to_numpy(float)
        with np.errstate(invalid="ignore"):
            wrong = ok & ((x < 0) | np.isinf(x) | ((x == 0) & (col == "benchmark_time_s")))
        if wrong.any():
            raise bad(int(np.argmax(wrong)), col, "is not a measurement (negative, infinite, or a zero-length "
                                                  "benchmark)")
        if col == "ts_mean_kv_usage":
            with np.errstate(invalid="ignore"):
                wrong = ok & (x > 1)
            if wrong.any():
                raise bad(int(np.argmax(wrong)), col, "is not a fraction of the KV cache (vLLM's gpu_cache_usage_perc "
                                                      "gauge runs from 0 to 1)")


def load_peer(path: str | os.PathLike) -> pd.DataFrame:
    df = read_table(path, "published twin's table (--peer)")
    figures = ["finished_requests"] + [m.peer for m in METRICS if m.peer and m.peer != "peer_rps"]
    missing = [c for c in (*RUN_KEYS, *figures) if c not in df.columns]
    if missing:
        raise ValueError(f"{path}: not a published twin's prediction table (missing columns {missing}); give "
                         f"--peer FILE with them or --peer none")
    for col in (*_REAL_INT_COLUMNS, *figures):  # keys to join on, and predicted figures (empty: not predicted)
        x = pd.to_numeric(df[col], errors="coerce")
        with np.errstate(invalid="ignore"):
            wrong = (x.isna() & df[col].notna()) | (x < 0) | np.isinf(x)
            if col in _REAL_INT_COLUMNS:
                wrong |= x.isna() | (x != np.round(x))
        if wrong.any():
            i = int(np.argmax(wrong.to_numpy()))
            raise ValueError(f"{path}: row {i + 1} (line {i + 2}), column {col}: {df[col].iloc[i]!r} is not "
                             f"{'an integer >= 0' if col in _REAL_INT_COLUMNS else 'a number >= 0 (or empty)'}; fix "
                             f"the row, or give --peer none")
        df[col] = x
    for c in ("ranks", "rates"):
        df[c] = df[c].astype(str)
    df["peer_rps"] = df["finished_requests"] / WINDOW_S
    df = df.drop_duplicates(list(RUN_KEYS), keep="first")
    return df


def attach_peer(real: pd.DataFrame, peer: pd.DataFrame | None) -> pd.DataFrame:
    """Real runs with the published twin's predictions (columns ``peer_<metric>``)."""
    out = real.copy()
    cols = {m.peer: f"peer_{m.name}" for m in METRICS if m.peer}
    if peer is None:
        for c in cols.values():
            out[c] = np.nan
        out["has_peer"] = False
        return out
    p = peer[list(RUN_KEYS) + list(cols)].rename(columns=cols)
    out = out.merge(p, on=list(RUN_KEYS), how="left")
    out["has_peer"] = out[list(cols.values())[0]].notna()
    return out


def select_runs(real: pd.DataFrame, filt: str | None = None, limit: int | None = None,
                run_ids: Iterable[str] | None = None) -> pd.DataFrame:
    """Runs to validate. ``filt``: a pandas query (``"adapter_slots <= 32 and source == 'ml_test'"``)
    when it contains a comparison, else a substring of ``run_id``. ``limit``: ``N`` runs evenly
    spread over the (filtered) table, so a small limit still covers slots, rates and loads.
    ``run_ids``: only these runs (``source/scenario/run_dir``)."""
    df = real
    if run_ids is not None:
        df = df[df["run_id"].isin(set(run_ids))]
    if filt:
        if any(op in filt for op in ("==", "!=", "<", ">", " in ", "~")):
            try:
                df = df.query(filt, engine="python")
            except Exception as e:  # pandas raises NameError/SyntaxError/TypeError/... for a bad query
                msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                raise ValueError(f"--filter {filt!r}: not a valid query on the real-run table ({msg}); columns: "
                                 f"{', '.join(map(str, real.columns))}") from None
        elif "=" in filt:  # no run id holds '=': an assignment typed for a comparison
            raise ValueError(f"--filter {filt!r}: a query compares with '==' (e.g. --filter \"adapter_slots == 32\"); "
                             f"without a comparison the filter is a substring of the run ids")
        else:
            df = df[df["run_id"].str.contains(filt, regex=False)]
    if limit is not None and limit < len(df):
        idx = np.unique(np.linspace(0, len(df) - 1, int(limit)).round().astype(int))
        df = df.iloc[idx]
    return df


# --------------------------------------------------------------------------- one run
def adapter_rates(rates: Iterable[float] | str, served: int) -> np.ndarray:
    """Per-adapter rates (req/s): the rate list over the ``served`` adapters, round-robin."""
    r = np.asarray(parse_list(rates, float, "rates"), float)
    return r[np.arange(served) % r.size]


@dataclass
class RunSpec:
    """What the twin needs to re-create one real run (its configuration only; ``length_corr``:
    the prompt-output length coupling of the request pool, :data:`PROMPT_OUTPUT_CORR`;
    ``frontend_s``: the requests' path outside the engine, :data:`FRONTEND_LATENCY_S`;
    ``scrape_s_per_label``: the metrics scrape's stall, :data:`SCRAPE_S_PER_LABEL`;
    ``serving_s_per_running``: the serving path's host time per running request and step,
    :data:`SERVING_S_PER_RUNNING`; ``rank_tile_cost``: the LoRA shrink's rank tiles beyond the first,
    :data:`RANK_TILE_COST`, None: the profile's own)."""

    run_id: str
    model: str
    ranks: list[int]
    rates: list[float]
    served: int
    slots: int
    max_rank: int
    cpu_slots: int
    max_num_seqs: int
    mean_in: float
    mean_out: float
    requests_sent: float | None
    window_s: float = WINDOW_S
    seed: int = 0
    length_corr: float = 0.0
    frontend_s: float = 0.0
    scrape_s_per_label: float = 0.0
    serving_s_per_running: float = 0.0
    rank_tile_cost: float | None = None
    #: the real run's status: a start failure (:data:`START_FAILURE_STATUSES`) is only checked
    #: against the twin's start-up check, never simulated (it served nothing to compare with)
    real_status: str = "ok"
    #: each adapter's arrival process (:func:`traces.arrivals.parse_arrival`): ``poisson``, the real runs'
    #: client, or ``gamma:CV``, bursty per-adapter streams, which only a sweep grid's ``arrival`` axis asks for
    arrival: str = "poisson"

    @property
    def adapter_rates(self) -> np.ndarray:
        """Per-adapter rates (req/s): the rate list over the served adapters, round-robin."""
        return adapter_rates(self.rates, self.served)

    @property
    def nominal_requests(self) -> float:
        return float(self.adapter_rates.sum() * self.window_s)


def _finite_or(value, cast, default):
    """``cast(value)`` when ``value`` is a finite number, else ``default``."""
    return cast(value) if value is not None and np.isfinite(float(value)) else default


#: Gaussian-copula correlation of prompt and output length in the real runs' ShareGPT request
#: pool (dimensionless). Fitted on the fit split only (the 22 ``dt_modelling`` runs without a
#: queue and with KV usage < 0.5): it makes the KV tokens per running request of the length
#: model equal the real gauges' median, 366 tokens (independent lengths: 442; the real means
#: per request are matched either way). ``twin.validation.length_coupling.fit_prompt_output_corr``
#: recomputes it; ``twin validate --length-corr 0`` turns it off.
PROMPT_OUTPUT_CORR = -0.37


def check_length_corr(value: Any, where: str) -> float:
    """A prompt-output length coupling: a number strictly between -1 and 1, else an error naming
    ``where`` (:data:`PROMPT_OUTPUT_CORR` re-creates the real runs); ``twin validate --length-corr`` and the
    sweep grids' ``length_corr`` check with it."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(float(value))
    if not ok or not -1.0 < float(value) < 1.0:
        raise ValueError(f"{where}: {value!r} is not a correlation strictly between -1 and 1; e.g. -0.37 "
                         f"(the real runs' pool, as twin validate re-creates it) or 0 (independent lengths)")
    return float(value)


#: Front-end latency of one request outside the engine (seconds): the real client's HTTP request,
#: vLLM 0.8.5's API server (request parsing, tokenisation, hand-over to the engine core) and the
#: way back of its tokens (engine-core output, detokenisation, the streamed chunk the client
#: reads). The client's TTFT and E2E include it; its ITL does not. Fitted on the fit split only
#: (:func:`twin.validation.frontend.fit_frontend_latency`): the median, over the 9
#: ``dt_modelling`` runs that never queued (``ts_max_waiting`` 0) with at most 16 served adapters,
#: of real mean TTFT - the twin's engine TTFT, with the serving path's host time
#: (:data:`SERVING_S_PER_RUNNING`) and the rank tile cost (:data:`RANK_TILE_COST`) in the engine (7.5 ms
#: before the host time was added, stop 39; 6.8 ms with the host time alone, before stop 40's rank tile cost,
#: which makes the rank-32 runs among the 9 faster; 7.9 ms with it, stop 40; 8.63 ms since stop 42's profile,
#: whose kernel grid prices the light steps' 64-split blocks lower). ``twin validate --frontend-ms 0`` turns it off.
FRONTEND_LATENCY_S = 0.0086

#: The server's metrics scrape stalls the client-observed path for this long per LoRA label
#: series it writes (seconds per series; :mod:`twin.scrape_stall`): every (waiting adapters,
#: running adapters) combination seen since the start is one series of vLLM 0.8.5's
#: ``vllm:lora_requests_info``, written at every scrape (every 2 s) from the API server's event
#: loop. Fitted on the fit split only (:func:`twin.validation.scrape_stall.fit_scrape_stall`,
#: scipy ``curve_fit`` of the real P99 TTFT of the 18 ``dt_modelling`` runs that never queued, with the
#: front-end latency, the serving path's host time and the rank tile cost at their values; 12.7 us before the
#: host time was added, stop 39; 12.9 us before the rank tile cost and the front-end refit, stop 40; 13.17 +- 0.34
#: us with them; 12.74 +- 0.36 us since stop 42's profile and the refitted rank tile cost and front-end latency).
#: ``twin validate --scrape-us 0`` turns it off.
SCRAPE_S_PER_LABEL = 12.7e-6


#: Host time per running request and engine step of vLLM 0.8.5 serving through its OpenAI API server to
#: streaming clients (seconds per running request per step; :meth:`twin.perf.profile.Profile.with_serving_host`).
#: The calibration's offline runs (all requests given at once, no API server, no client) do not contain it:
#: their 300-slot windows hold 220 running requests and fit the calibrated step within 2 %. The fit split does:
#: in its runs with KV usage below 0.5 (no preemption), the real ITL exceeds the twin's by 4-7 ms at 100-300
#: running requests and 12-13 ms at 300-450, at every slot count from 8 to 128 and at both rate sets, while at
#: most ~100 running show no excess. Fitted on the fit split only (:func:`twin.validation.serving_host.
#: fit_serving_host`: the least squares of the twin's mean ITL against the real one, relative errors, over the
#: 32 ``dt_modelling`` runs with KV usage < 0.5 and at least 100 running requests; 18.0 us, their ITL SMAPE
#: 5.9 -> 1.5; stop 39, every rank tile priced alike). Fitted first; the rank tile cost (:data:`RANK_TILE_COST`)
#: was fitted with it in place, then the front-end latency and the scrape stall, which move client-observed times
#: only. Refitted with the rank tile cost in place (stop 40) the same procedure gives 23.7 us, but that pair is
#: worse on the fit split as a whole (README.md, Fidelity, "rank tile"): the two constants are not separated by
#: these runs, and 18 us stays. With stop 42's profile the same procedure gives 22.9 us with the refitted tile cost
#: in place (27.0 with the stop-40 one); the pair 22.9 us / tile 0.7028 / front-end 8.4 ms / stall 13.0 us reads
#: 1.1 / 2.4 / 4.6 / 4.9 / 6.5 on the fit split, 17 of 22 crossings, against 1.5 / 2.7 / 4.1 / 4.7 / 6.2 and 17 with
#: 18 us: no better as a whole, so 18 us stays. ``twin validate --serving-us 0`` turns it off.
SERVING_S_PER_RUNNING = 18e-6

#: Working-block cost of a LoRA shrink rank tile beyond the first, relative to the first (dimensionless;
#: :meth:`twin.perf.profile.Profile.with_rank_tile_cost`). vLLM 0.8.5's shrink kernel tiles the rank in blocks
#: of 16, so slots padded to rank 32 run two tiles; the calibration measured rank 8 only, and its profiles price
#: both tiles alike (1). The fit split says the second costs about a quarter: in its 10 pairs of runs without a
#: queue that differ only in the slots' max rank (16 vs 32), the real ITL grows 1.01-1.19x, the calibrated
#: twin's 1.06-1.47x. Fitted on those pairs only (:func:`twin.validation.rank_tile.fit_rank_tile`, ``curve_fit``
#: of the rank-32 - rank-16 step differences at the runs' own mean step composition, with the serving path's
#: host time in the steps: 0.7091 +- 0.111 at 18 us on stop 42's profile). That profile prices a working block of
#: the light steps' 64-split shrink at 0.58 of an 8-split one (``split64_cost``, fitted on the calibration
#: tables, :mod:`calibration.fitting.split64`), and these pairs' steps are such steps, so the second tile's
#: block costs 0.58 x 0.71 = 0.41 of an 8-split block; on the stop-40 profile (every block alike) the same fit
#: gave 0.2646 +- 0.079 (0.277 without the host time). Slots of rank <= 16 are unchanged. It is the
#: ``ranktile`` profile variant's constant, applied to any kernel-grid profile.
#: ``twin validate --rank-tile-cost 1`` turns it off.
RANK_TILE_COST = 0.7091


def spec_from_row(row: pd.Series | dict, seed: int = 0, use_sent: bool = True,
                  length_corr: float = PROMPT_OUTPUT_CORR, frontend_s: float = FRONTEND_LATENCY_S,
                  scrape_s_per_label: float = SCRAPE_S_PER_LABEL,
                  serving_s_per_running: float = SERVING_S_PER_RUNNING,
                  rank_tile_cost: float | None = RANK_TILE_COST) -> RunSpec:
    """The configuration of one real-run row; ``use_sent``: keep ``requests_sent`` (the offered
    count), else the nominal Poisson load. The seed mixes the run id with ``seed``."""
    g = row.get
    served = int(g("served_adapters"))
    sent = _finite_or(g("requests_sent"), float, None) if use_sent else None
    run_id = str(g("run_id"))
    return RunSpec(run_id=run_id, model=str(g("model")), ranks=parse_list(g("ranks"), int, "ranks"),
                   rates=parse_list(g("rates"), float, "rates"), served=served, slots=int(g("adapter_slots")),
                   max_rank=int(g("max_lora_rank")), cpu_slots=_finite_or(g("max_cpu_loras"), int, served),
                   max_num_seqs=_finite_or(g("max_num_seqs"), int, REAL_MAX_BATCHED_TOKENS),
                   mean_in=float(g("pool_mean_input_tokens")), mean_out=float(g("pool_mean_output_tokens")),
                   requests_sent=sent, window_s=_finite_or(g("benchmark_time_s"), float, WINDOW_S),
                   seed=(zlib.crc32(_seed_id(run_id).encode()) ^ (seed * 0x9E3779B1)) & 0x7FFFFFFF,
                   length_corr=float(length_corr),
                   frontend_s=float(frontend_s), scrape_s_per_label=float(scrape_s_per_label),
                   serving_s_per_running=float(serving_s_per_running),
                   rank_tile_cost=None if rank_tile_cost is None else float(rank_tile_cost),
                   real_status=str(g("status", "ok")))


def nominal_requests(row: pd.Series | dict) -> float:
    """The nominal request count of a real-run row: its per-adapter rates over its window."""
    win = row.get("benchmark_time_s", WINDOW_S)
    win = float(win) if win == win and win is not None else WINDOW_S
    return float(adapter_rates(row["rates"], int(row["served_adapters"])).sum() * win)
