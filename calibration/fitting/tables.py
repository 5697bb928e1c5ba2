"""Reading the vLLM 0.8.5 calibration tables and turning ~2 s windows into fit observations.

The tables are those documented in the data directory's README
(``calibration/vllm085_h100/``): ``step_latency{,_runs}.csv``,
``adapter_overhead{,_windows}.csv``, ``adapter_load.csv``, ``kv_capacity.csv``,
``scheduler_overhead.csv`` and ``peer_fitted_constants.csv``. Nothing is copied: the
fits read them from the directory given on the command line.

Window method (the finest grain the data has is a ~2 s Prometheus window with ``S`` engine
steps, ``P`` prompt tokens, running/waiting gauges at its two ends and KV usage at its end):

* **target**: ``mean_step_ms`` (gap between consecutive step timestamps) minus
  ``mean_scheduler_ms`` (measured separately) is the model-execution time of the mean step
  (backbone, plus LoRA where enabled); the scheduler is fitted to ``mean_scheduler_ms``,
  so that backbone + scheduler reproduces ``mean_step_ms``;
* **decode sequences per step** ``D``: mean of the running gauge at the window's ends
  (checked against generated tokens / steps where that counter is exact: median ratio 1.00);
* **context tokens** ``C``: mean of the KV usage at the window's start (previous window's
  end) and end, times the server's KV capacity, minus 8 tokens per sequence for the
  half-filled last 16-token block;
* **prefill tokens**: the window's ``P`` prompt tokens are carried by
  ``n = min(S, ceil(P / (2048 - D)))`` steps of ``P/n`` tokens (decodes are scheduled first
  and prompt chunks fill the rest of the ``max_num_batched_tokens`` = 2048 budget), the
  other ``S - n`` steps are pure decode; a model's window prediction is the
  step-weighted mean over these two kinds of step (exact for linear forms);
* **exclusions**: windows with fewer than 5 steps (sampling edges), the warm-up/drain
  windows (running gauge 0 at either end), windows whose counters overflowed (``NaN``) and
  stall windows (max step > 4x median: a one-off ~0.35 s host pause inside the scheduler);
* **weights**: a window's mean over ``S`` steps gets ``sigma = 1/sqrt(S)``;
* **kinds**: ``decode`` (no prompt tokens), ``prefill`` (prefill sweep) and ``mixed``
  (decode sweep windows where a new wave of prompts was prefilled). The step composition
  of mixed windows is not observed, so they are used for held-out scoring only.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from calibration.fitting.core import FitError, TableError, first_nan_counts, warn_dropped
from traces.arguments import csv_layout_problem
from traces.datadir import data_dir, unset_data_dir_hint
from twin.model_spec import ModelSpec, get_model
from twin.scenario import VLLM_MAX_LORA_RANKS

#: vLLM 0.8.5 V1 defaults of the measured servers
MAX_BATCHED_TOKENS = 2048
GRAPH_MAX_TOKENS = 512
MIN_STEPS = 5
STALL_FACTOR = 4.0

VLLM085_FILES = ("step_latency.csv", "step_latency_runs.csv", "adapter_overhead.csv", "adapter_overhead_windows.csv",
                 "adapter_load.csv", "kv_capacity.csv", "scheduler_overhead.csv")


VLLM085_README = "the data README, section calibration/vllm085_h100"


def vllm085_directory(data: str | None) -> Path:
    """The vLLM 0.8.5 calibration directory of a ``--data`` option: the given one, or
    ``$TWIN_DATA_DIR/calibration/vllm085_h100`` when it is None; ``ValueError`` naming the fix when it
    is empty or not a directory (the ``python -m calibration.fitting.*`` commands)."""
    if data is not None and not data.strip():
        raise ValueError("--data: empty; give the vLLM 0.8.5 calibration directory, or leave --data out for "
                         "$TWIN_DATA_DIR/calibration/vllm085_h100")
    directory = Path(data) if data else Path(data_dir()) / "calibration" / "vllm085_h100"
    if not directory.is_dir():
        raise ValueError(f"no calibration directory {directory}; set TWIN_DATA_DIR or pass --data")
    return directory


#: what a ``python -m calibration.fitting.*`` command reports as its error (exit 2) instead of a traceback: a
#: directory or table that is not there or incomplete, a model absent from the tables, a fit that cannot be made
FITTING_ERRORS = (ValueError, KeyError, FileNotFoundError, FitError)


def fitting_parser(module: str, doc: str | None, tables: bool = True) -> argparse.ArgumentParser:
    """The parser of ``python -m calibration.fitting.<module>`` (described by the first paragraph of ``doc``): its
    ``--data`` option (:func:`vllm085_directory`), and with ``tables`` the ``--model`` of the tables and ``--json``."""
    ap = argparse.ArgumentParser(prog=f"python -m calibration.fitting.{module}",
                                 description=(doc or "").split("\n\n")[0])
    ap.add_argument("--data", default=None, help="the vLLM 0.8.5 calibration directory (default: "
                                                 "$TWIN_DATA_DIR/calibration/vllm085_h100)")
    if tables:
        ap.add_argument("--model", default="llama-3.1-8b", help="model of the tables (default llama-3.1-8b)")
        ap.add_argument("--json", action="store_true", help="print the result as JSON")
    return ap


def fitting_error(module: str, e: BaseException) -> int:
    """Print one of :data:`FITTING_ERRORS` as ``<module>: <message>`` on stderr (a ``KeyError``'s own text, not its
    quoted repr) and return the exit status 2."""
    print(f"{module}: {e.args[0] if isinstance(e, KeyError) and e.args else e}", file=sys.stderr)
    return 2


# ------------------------------------------------------------------------------------------
# reading a table: columns present, numbers where numbers are needed, no impossible value
# ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Col:
    """A column a fit reads.

    ``what``: what a value is (for the messages); ``kind``: ``num`` or ``text``; ``check`` (numbers):
    ``pos`` (> 0: durations, bandwidths, sizes that cannot be zero), ``nonneg`` (>= 0: counts, gauges,
    times that may be 0), ``frac`` (0..1) or ``any``; ``missing_ok``: an empty cell (NaN) is allowed --
    the fit leaves such rows out (named in a DroppedRowsWarning) or fills them in, as documented where
    it reads the column; ``whole``: a whole number (ranks, indices: the fit casts them to int);
    ``required``: the table must have the column (else it is checked only when present); ``most``: the largest
    value the server accepts and ``choices``: the only values it accepts (vLLM's ranks, :func:`adapter_rank` and
    :func:`max_lora_rank`), with ``why`` saying whose limit it is.
    """

    name: str
    what: str
    check: str = "nonneg"
    kind: str = "num"
    missing_ok: bool = True
    whole: bool = False
    required: bool = True
    most: float | None = None
    choices: tuple[float, ...] | None = None
    why: str = ""


def _vllm_ranks(ranks: tuple[int, ...]) -> str:
    """vLLM's ``max_lora_rank`` values (LoRAConfig's possible_max_ranks), as ``twin run --max-lora-rank`` takes them."""
    return f"{', '.join(map(str, ranks))}; LoRAConfig's possible_max_ranks"


def adapter_rank(name: str = "adapter_rank", ranks: tuple[int, ...] = VLLM_MAX_LORA_RANKS) -> Col:
    """An adapter's rank: a whole number from 1 to the largest ``max_lora_rank`` the tables' vLLM accepts (``ranks``:
    :data:`twin.scenario.VLLM_MAX_LORA_RANKS` for 0.8.5, :data:`~twin.scenario.VLLM050_MAX_LORA_RANKS` for 0.5.0; it
    refuses an adapter above the server's ``max_lora_rank``): a rank 1000 times too large fitted a degenerate load
    model."""
    return Col(name, "an adapter rank", "pos", missing_ok=False, whole=True, most=ranks[-1],
               why=f"the largest max_lora_rank vLLM accepts ({_vllm_ranks(ranks)}): no vLLM server loads such an adapter")


def max_lora_rank(name: str = "max_lora_rank", what: str = "a max LoRA rank", without_lora: bool = False,
                  missing_ok: bool = True, required: bool = True, ranks: tuple[int, ...] = VLLM_MAX_LORA_RANKS) -> Col:
    """A server's ``max_lora_rank``: one of the values the tables' vLLM accepts (``ranks``, as :func:`adapter_rank`),
    or 0 for a server without LoRA where the table writes it so (``without_lora``)."""
    choices = ((0,) if without_lora else ()) + tuple(ranks)
    return Col(name, what, "nonneg" if without_lora else "pos", missing_ok=missing_ok, whole=True, required=required,
               choices=choices,
               why=f"vLLM accepts only {_vllm_ranks(ranks)}" + (" (0: without LoRA)" if without_lora else ""))


def text(name: str, what: str, missing_ok: bool = False, required: bool = True) -> Col:
    return Col(name, what, "any", "text", missing_ok, False, required)


_RULES = {  # check -> (passes, what the value is, what it must be)
    "pos": (lambda v: v > 0, "is not positive", "must be greater than 0"),
    "nonneg": (lambda v: v >= 0, "is negative", "cannot be negative"),
    "frac": (lambda v: (v >= 0) & (v <= 1), "is outside 0..1", "is a fraction between 0 and 1"),
}


def _rows(mask: np.ndarray) -> str:
    """``row 6 (line 7)`` / ``row 6 (line 7) and 2 other rows (lines 9, 12)``: rows count from 1 after
    the header; lines are the file's (the header is line 1)."""
    idx = np.flatnonzero(mask) + 1
    first = f"row {idx[0]} (line {idx[0] + 1})"
    if len(idx) == 1:
        return first
    more = ", ".join(str(int(i) + 1) for i in idx[1:6]) + (", ..." if len(idx) > 6 else "")
    s = "s" if len(idx) > 2 else ""
    return f"{first} and {len(idx) - 1} other row{s} (line{s} {more})"


def _fix(mask: np.ndarray, remove: bool = True) -> str:
    one = int(np.sum(mask)) == 1
    return ("correct the value" if one else "correct those values") + (
        ("" if not remove else " or remove the row" if one else " or remove those rows"))


def _value(v) -> str:
    return f"{v:g}" if isinstance(v, (float, np.floating)) else repr(str(v))


#: the largest magnitude a measured value may have in any unit the tables use (ms, bytes, tokens, counts): beyond it, a
#: corrupt cell (a 1e300 scheduler time drove a fit into a million overflow warnings)
MAX_MEASURED = 1e15


def read_table(path: str | Path, columns: Sequence[Col], source: str) -> pd.DataFrame:
    """Read the CSV table ``path`` and check it before any fit uses it: the ``columns`` present,
    numbers where numbers are expected, no empty cell where the fit needs a value, no physically
    impossible value (negative durations, counts or sizes; zero where zero is impossible).

    Raises :class:`~calibration.fitting.core.TableError` naming the file, the column, the rows
    (file lines) and the value, what is wrong and how to fix it; ``source`` says where the table's
    format is documented. Numeric columns come back numeric; text columns as strings.
    """
    path = Path(path)
    names = ", ".join(c.name for c in columns if c.required)
    try:
        df = pd.read_csv(path)
    except pd.errors.EmptyDataError:
        raise TableError(f"{path} is empty (not even a header line); restore the table: the fit reads its columns "
                         f"{names} (see {source})") from None
    except UnicodeDecodeError:
        raise TableError(f"{path} is not a text (UTF-8) CSV file; restore the table (see {source})") from None
    except pd.errors.ParserError as e:
        m = re.search(r"Expected (\d+) fields in line (\d+), saw (\d+)", str(e))
        why = (f"line {m[2]} has {m[3]} fields where line 1 (the header) has {m[1]}" if m
               else "its lines do not split into the header's fields")
        raise TableError(f"{path} is not a well-formed CSV table ({why}); fix that line or restore the table "
                         f"(see {source})") from None
    except OSError as e:
        raise TableError(f"{path} cannot be read ({e.strerror or type(e).__name__}); give a readable CSV file "
                         f"(see {source})") from None
    problem = csv_layout_problem(path)
    if problem:
        raise TableError(f"{path}: {problem} (see {source})")
    missing = [c.name for c in columns if c.required and c.name not in df.columns]
    if missing:
        have = ", ".join(map(str, df.columns[:12])) + (", ..." if len(df.columns) > 12 else "")
        raise TableError(f"{path} lacks the column{'s' if len(missing) > 1 else ''} {', '.join(missing)}, which the "
                         f"fit reads (the header has: {have}); restore {'them' if len(missing) > 1 else 'it'} or "
                         f"regenerate the table (see {source})")
    problems = []
    for c in columns:
        if c.name not in df.columns:
            continue
        s = df[c.name]
        null = s.isna().to_numpy()
        where = f"column {c.name}"
        if not c.missing_ok and null.any():
            one = int(null.sum()) == 1
            problems.append(f"{where} is empty at {_rows(null)}; every row needs {c.what}: fill "
                            f"{'it' if one else 'them'} in or remove {'the row' if one else 'those rows'}")
            continue
        if c.kind == "text":
            if s.dtype.kind not in "OSUT" and not isinstance(s.dtype, pd.StringDtype):
                df[c.name] = s.astype(object).where(s.isna(), s.astype(str))
            continue
        if s.dtype.kind == "b":
            problems.append(f"{where} holds true/false values, not numbers; write {c.what} as a number")
            continue
        num = s if s.dtype.kind in "iuf" else pd.to_numeric(s, errors="coerce")
        bad = num.isna().to_numpy() & ~null
        if bad.any():
            problems.append(f"{where}: {_value(s[bad].iloc[0])} at {_rows(bad)} is not a number; write {c.what} as "
                            f"a number" + (" (or leave the cell empty where the measurement is missing)"
                                           if c.missing_ok else ""))
            continue
        v = num.to_numpy(float)
        inf = np.isinf(v) | (np.abs(np.where(np.isnan(v), 0.0, v)) > MAX_MEASURED)  # (1e300: a fit that never converged)
        if inf.any():
            problems.append(f"{where}: {_value(v[inf][0])} at {_rows(inf)} is not a finite number of a measurable "
                            f"size (at most {MAX_MEASURED:g}); {c.what} must be a finite measurement: {_fix(inf)}")
            continue
        fin = ~null
        if c.check in _RULES:
            passes, is_, must = _RULES[c.check]
            with np.errstate(invalid="ignore"):
                out = fin & ~passes(np.where(fin, v, 0.5))
            if out.any():
                problems.append(f"{where}: {_value(v[out][0])} at {_rows(out)} {is_}; {c.what} {must}: "
                                f"{_fix(out)}")
                continue
        if c.whole:
            frac = fin & (np.where(fin, v, 0.0) != np.round(np.where(fin, v, 0.0)))
            if frac.any():
                problems.append(f"{where}: {_value(v[frac][0])} at {_rows(frac)} is not a whole number; "
                                f"{c.what} is a whole number: {_fix(frac, remove=False)}")
                continue
        if c.most is not None:
            over = fin & (np.where(fin, v, 0.0) > c.most)
            if over.any():
                problems.append(f"{where}: {_value(v[over][0])} at {_rows(over)} is above {c.most:g}, {c.why}; "
                                f"{c.what} is at most {c.most:g}: {_fix(over)}")
                continue
        if c.choices is not None:
            odd = fin & ~np.isin(np.where(fin, v, c.choices[0]), c.choices)
            if odd.any():
                problems.append(f"{where}: {_value(v[odd][0])} at {_rows(odd)} is not a value the server accepts "
                                f"({c.why}); {c.what} is one of them: {_fix(odd)}")
                continue
        if num is not s:
            df[c.name] = num
    if problems:
        if len(problems) == 1:
            raise TableError(f"{path}, {problems[0]}")
        raise TableError(f"{path} has {len(problems)} problems (fix them, then run again):\n"
                         + "\n".join(f"  - {p}" for p in problems))
    return df


#: the columns naming a measurement run, first in every table of runs and windows
_RUN_KEYS = (text("model", "model name"), text("experiment", "experiment name"), text("run_dir", "run directory"))


def _window_columns(lora: bool) -> tuple[Col, ...]:
    """Columns of the ~2 s windows (step_latency.csv; adapter_overhead_windows.csv with ``lora``)."""
    return _RUN_KEYS + (
        Col("window_start_s", "a window start (s)", missing_ok=False),
        Col("kv_usage_end", "the KV usage at the window end", "frac", missing_ok=False),
        Col("running_start", "a running-request gauge", missing_ok=False, whole=True),
        Col("running_end", "a running-request gauge", missing_ok=False, whole=True),
        Col("waiting_start", "a waiting-request gauge", missing_ok=False, whole=True),
        Col("waiting_end", "a waiting-request gauge", missing_ok=False, whole=True),
        Col("engine_steps", "a number of engine steps", whole=True),
        Col("prompt_tokens", "a number of prompt tokens", whole=True),
        Col("mean_step_ms", "a mean step time (ms)", "pos"),
        Col("median_step_ms", "a median step time (ms)", "pos"),
        Col("max_step_ms", "a longest step time (ms)", "pos"),
        Col("mean_scheduler_ms", "a scheduler time per step (ms)"),
        Col("adapter_slots", "a number of adapter slots", required=lora, whole=True),
        Col("adapters_used", "a number of adapters used", required=lora, whole=True),
        Col("mean_unique_adapters", "a mean number of distinct adapters per step", required=lora),
        max_lora_rank(required=lora),
    )

#: the columns each vLLM 0.8.5 table must have (and what their values may be)
VLLM085_COLUMNS: dict[str, tuple[Col, ...]] = {
    "step_latency.csv": _window_columns(lora=False),
    "adapter_overhead_windows.csv": _window_columns(lora=True),
    "step_latency_runs.csv": _RUN_KEYS + (
        Col("kv_cache_tokens", "a KV cache size (tokens)", "pos", whole=True),
        Col("engine_steps", "a number of engine steps", whole=True),
        Col("mean_step_ms", "a mean step time (ms)", "pos"),
        Col("mean_scheduler_ms_per_step", "a scheduler time per step (ms)"),
        Col("total_input_tokens", "a number of prompt tokens", whole=True),
        Col("adapter_slots", "a number of adapter slots", required=False, whole=True),
    ),
    "adapter_overhead.csv": _RUN_KEYS + (
        Col("kv_cache_tokens", "a KV cache size (tokens)", "pos", whole=True),
        Col("adapter_slots", "a number of adapter slots", whole=True),
        max_lora_rank(),
        Col("adapters_used", "a number of adapters used", whole=True),
        Col("engine_steps", "a number of engine steps", whole=True),
        Col("mean_itl_ms", "a mean inter-token latency (ms)"),
        text("status", "run status", missing_ok=True),
        Col("ts_mean_running", "a mean running-request gauge"),
        Col("ts_mean_waiting", "a mean waiting-request gauge"),
        Col("ts_mean_kv_usage", "a mean KV usage", "frac"),
        Col("input_tokens_per_req", "a number of prompt tokens per request", required=False),
    ),
    "adapter_load.csv": (
        text("model", "model name", required=False),
        text("load_kind", "load kind (disk_to_cpu or cpu_to_gpu)"), text("phase", "load phase (startup or serving)"),
        adapter_rank(),
        max_lora_rank(missing_ok=False),
        Col("load_index", "a load's position in its server start (1, 2, ...)", "pos", missing_ok=False, whole=True),
        Col("load_ms", "an adapter load time (ms)", "pos", missing_ok=False),
    ),
    "kv_capacity.csv": (
        text("model", "model name", required=False), text("experiment", "experiment name"),
        Col("adapter_slots", "a number of adapter slots", missing_ok=False, whole=True),
        max_lora_rank(what="a max LoRA rank (0 without LoRA)", without_lora=True, missing_ok=False),
        Col("max_num_seqs", "a max_num_seqs setting", "pos", whole=True),
        text("status", "server start status (ok, failed_...)"),
        Col("kv_cache_tokens", "a KV cache size (tokens)", "pos", whole=True),
        Col("kv_available_gib", "an available KV memory (GiB)"),
    ),
    "scheduler_overhead.csv": (
        Col("mean_running", "a mean running-request gauge", missing_ok=False),
        Col("mean_waiting", "a mean waiting-request gauge", missing_ok=False),
        Col("adapter_slots", "a number of adapter slots", missing_ok=False, whole=True),
        Col("served_adapters", "a number of served adapters", missing_ok=False, whole=True),
        Col("scheduler_ms_per_step", "a scheduler time per step (ms)", missing_ok=False),
        # the serving-run columns (used for the LoRA fit when all are present; see serving_run_lora_obs)
        text("rate_mode", "rate mode", required=False),
        Col("engine_steps", "a number of engine steps", required=False, whole=True),
        Col("mean_itl_ms", "a mean inter-token latency (ms)", "pos", required=False),
        Col("completed_requests", "a number of completed requests", missing_ok=False, required=False, whole=True),
        Col("duration_s", "a run duration (s)", "pos", missing_ok=False, required=False),
        Col("lora_loading_time_s", "an adapter loading time (s)", required=False),
        Col("mean_unique_adapters_per_step", "a mean number of distinct adapters per step", missing_ok=False,
            required=False),
        Col("output_tok_s", "an output throughput (tokens/s)", required=False),
    ),
    "peer_fitted_constants.csv": (
        text("model", "model name"), text("component", "component name"), text("constant", "constant name"),
        Col("value", "a constant's value", "any"),
    ),
}


def detect_format(directory: Path) -> str:
    """``vllm085`` (peer 0.8.5 tables), ``vllm050`` (Llama-2 0.5.0 runs) or ``vidur`` (operator timings)."""
    d = Path(directory)
    if not d.is_dir():
        what = "is a file, not a directory" if d.exists() else "does not exist"
        raise FileNotFoundError(f"measurement directory {d} {what}{unset_data_dir_hint(d)}; give --measurements the "
                                f"directory that holds the calibration tables: $TWIN_DATA_DIR/calibration/vllm085_h100 "
                                f"(vLLM 0.8.5), .../vllm050_h100_llama2 (vLLM 0.5.0) or .../vidur_linear_ops "
                                f"(Vidur's operator timings, with --gpu)")
    if (d / "step_latency.csv").exists():
        return "vllm085"
    if (d / "runs.csv").exists() and (d / "adapter_load_manual.csv").exists():
        return "vllm050"
    if any(d.glob("*/*_mlp.csv")) or any(d.glob("*_mlp.csv")):
        return "vidur"
    raise FileNotFoundError(f"{d} holds no known calibration tables (expected step_latency.csv [vLLM 0.8.5], "
                            f"runs.csv + adapter_load_manual.csv [vLLM 0.5.0] or <gpu>/*_mlp.csv [Vidur])")


def same_model(names: pd.Series, model: ModelSpec) -> np.ndarray:
    """Rows of a ``model`` column that name ``model`` (aliases such as ``-instruct`` resolved)."""
    cache: dict[str, bool] = {}
    out = []
    for n in names.astype(str):
        if n not in cache:
            try:
                cache[n] = get_model(n).name == model.name
            except KeyError:
                cache[n] = False
        out.append(cache[n])
    return np.asarray(out, bool)


@dataclass
class Vllm085Tables:
    """The 0.8.5 tables restricted to one model (``sched``, ``peer`` keep their 'all' rows)."""

    directory: Path
    model: ModelSpec
    step_runs: pd.DataFrame
    step_windows: pd.DataFrame
    lora_runs: pd.DataFrame
    lora_windows: pd.DataFrame
    loads: pd.DataFrame
    kv: pd.DataFrame
    sched: pd.DataFrame
    peer: pd.DataFrame

    @classmethod
    def read(cls, directory: str | Path, model: str | ModelSpec) -> "Vllm085Tables":
        d = Path(directory)
        spec = model if isinstance(model, ModelSpec) else get_model(model)
        missing = [f for f in VLLM085_FILES if not (d / f).exists()]
        if missing:
            raise FileNotFoundError(f"{d} lacks {', '.join(missing)}; it is not a complete vLLM 0.8.5 calibration "
                                    f"directory (see {VLLM085_README})")
        # every table is checked (columns, numbers, impossible values) before any is used
        names = VLLM085_FILES + (("peer_fitted_constants.csv",) if (d / "peer_fitted_constants.csv").exists() else ())
        raw = {name: read_table(d / name, VLLM085_COLUMNS[name], VLLM085_README) for name in names}
        for name in VLLM085_FILES:
            if len(raw[name]) == 0:
                raise TableError(f"{d / name} has a header but no rows; the fit needs its measurements: restore the "
                                 f"table (see {VLLM085_README})")

        def rd(name: str, by_model: bool = True) -> pd.DataFrame:
            df = raw[name]
            if by_model and "model" in df.columns:
                df = df[same_model(df["model"], spec)].reset_index(drop=True)
            return df

        t = cls(d, spec, rd("step_latency_runs.csv"), rd("step_latency.csv"), rd("adapter_overhead.csv"),
                rd("adapter_overhead_windows.csv"), rd("adapter_load.csv"), rd("kv_capacity.csv"),
                rd("scheduler_overhead.csv", by_model=False),
                rd("peer_fitted_constants.csv", by_model=False) if "peer_fitted_constants.csv" in raw
                else pd.DataFrame())
        if t.peer is not None and len(t.peer):
            t.peer = t.peer[same_model(t.peer["model"], spec) | (t.peer["model"] == "all")].reset_index(drop=True)
        if len(t.step_windows) == 0:
            avail = sorted(raw["step_latency_runs.csv"]["model"].unique())
            raise FitError(f"no step-latency measurements of {spec.name} in {d}; models present: {avail}")
        return t


def _kv_tokens_per_run(windows: pd.DataFrame, runs: pd.DataFrame) -> pd.Series:
    """KV capacity (tokens) of the server of each window's run; runs whose log is missing take
    the median of the logged runs of the same experiment with the same LoRA setting."""
    keys = ["model", "experiment", "run_dir"]
    r = runs[keys + ["kv_cache_tokens"]].copy()
    r["lora"] = (runs["adapter_slots"].fillna(0) > 0) if "adapter_slots" in runs.columns else False
    kv = windows[keys].merge(r[keys + ["kv_cache_tokens"]], on=keys, how="left")["kv_cache_tokens"].to_numpy(float).copy()
    lora = ((windows["adapter_slots"].fillna(0) > 0).to_numpy() if "adapter_slots" in windows.columns
            else np.zeros(len(windows), bool))
    fill = r.groupby(["experiment", "lora"])["kv_cache_tokens"].median()
    fill_lora = r.groupby("lora")["kv_cache_tokens"].median()
    for i in np.flatnonzero(~np.isfinite(kv)):
        v = fill.get((windows["experiment"].iloc[i], bool(lora[i])), np.nan)
        kv[i] = v if np.isfinite(v) else fill_lora.get(bool(lora[i]), r["kv_cache_tokens"].median())
    return pd.Series(kv, index=windows.index)


def window_features(windows: pd.DataFrame, runs: pd.DataFrame, table: str = "windows") -> pd.DataFrame:
    """One row per usable window with the model inputs and targets (see the module docstring).

    Columns: ``group`` (run), ``experiment``, ``kind``, ``S``, ``P``, ``n_pre``, ``P_step``,
    ``D``, ``C``, ``R``, ``W``, ``G``, ``N``, ``A``, ``step_ms``, ``sched_ms``, ``comp_ms``
    (= step - scheduler), ``sigma``; ``attrs['excluded']`` counts the dropped windows by reason.
    Windows dropped for a NaN are named in a :class:`~calibration.fitting.core.DroppedRowsWarning`
    (``table``: where they come from).
    """
    w = windows.sort_values(["model", "experiment", "run_dir", "window_start_s"]).copy()
    w["kv_start"] = w.groupby(["model", "experiment", "run_dir"])["kv_usage_end"].shift(1).fillna(0.0)
    w["kv_tokens"] = _kv_tokens_per_run(w, runs)
    reasons = {
        "fewer than 5 steps": w["engine_steps"].fillna(0) < MIN_STEPS,
        "no step timing": w["mean_step_ms"].isna() | w["mean_scheduler_ms"].isna(),
        "warm-up or drain (running 0 at an end)": (w["running_start"] == 0) | (w["running_end"] == 0),
        "token counter overflow (NaN)": w["prompt_tokens"].isna(),
        "stall (max step > 4x median)": w["max_step_ms"] > STALL_FACTOR * w["median_step_ms"],
    }
    drop = np.zeros(len(w), bool)
    excluded = {}
    for name, m in reasons.items():
        m = m.to_numpy() & ~drop
        excluded[name] = int(m.sum())
        drop |= m
    warn_dropped(table, len(w), {"engine_steps": int(w["engine_steps"].isna().sum()),  # (under "fewer than 5 steps")
                                 "mean_step_ms or mean_scheduler_ms": excluded["no step timing"],
                                 "prompt_tokens": excluded["token counter overflow (NaN)"]}, "windows")
    w = w[~drop].copy()
    S = w["engine_steps"].to_numpy(float)
    P = w["prompt_tokens"].to_numpy(float)
    D = (w["running_start"].to_numpy(float) + w["running_end"].to_numpy(float)) / 2
    # decodes are scheduled first; prompt chunks fill the rest of the 2048-token budget
    n_pre = np.minimum(S, np.ceil(P / np.maximum(MAX_BATCHED_TOKENS - D, 64.0)))
    C = np.maximum((w["kv_start"].to_numpy(float) + w["kv_usage_end"].to_numpy(float)) / 2
                   * w["kv_tokens"].to_numpy(float) - 8.0 * D, 0.0)
    G = w["adapter_slots"].fillna(0).to_numpy(float) if "adapter_slots" in w.columns else np.zeros(len(w))
    N = w["adapters_used"].fillna(0).to_numpy(float) if "adapters_used" in w.columns else np.zeros(len(w))
    N = np.where(N > 0, N, G)
    A = w["mean_unique_adapters"].fillna(0).to_numpy(float) if "mean_unique_adapters" in w.columns else np.zeros(len(w))
    kind = np.where(P == 0, "decode", np.where(w["experiment"].to_numpy() == "prefill_sweep", "prefill", "mixed"))
    out = pd.DataFrame({
        "group": (w["experiment"] + "/" + w["run_dir"]).to_numpy(),
        "experiment": w["experiment"].to_numpy(), "kind": kind, "S": S, "P": P, "n_pre": n_pre,
        "P_step": np.where(n_pre > 0, P / np.maximum(n_pre, 1), 0.0), "D": D, "C": C,
        "R": D, "W": (w["waiting_start"].to_numpy(float) + w["waiting_end"].to_numpy(float)) / 2,
        "G": G, "N": N, "A": A, "adapters_used": w["adapters_used"].fillna(0).to_numpy(float) if "adapters_used" in w
        else 0.0,
        "step_ms": w["mean_step_ms"].to_numpy(float), "sched_ms": w["mean_scheduler_ms"].to_numpy(float),
        "sigma": 1.0 / np.sqrt(S), "window_start_s": w["window_start_s"].to_numpy(float),
    })
    out["comp_ms"] = out["step_ms"] - out["sched_ms"]
    out.attrs["excluded"] = excluded
    return out.reset_index(drop=True)


def prefill_run_points(runs: pd.DataFrame, used_groups: set[str]) -> pd.DataFrame:
    """Run-level observations of prefill-sweep runs that have no usable window (too few steps).

    A run of ``S`` logged steps with ``P`` prompt tokens and 1-token outputs becomes one
    observation with ``n = ceil(P/2048)`` prefill steps and ``D = C = 0``.
    """
    r = runs[runs["experiment"] == "prefill_sweep"].copy()
    r["group"] = r["experiment"] + "/" + r["run_dir"]
    r = r[~r["group"].isin(used_groups)]
    warn_dropped("step_latency_runs.csv (prefill runs without windows)", len(r),
                 first_nan_counts(r, ("engine_steps", "mean_step_ms", "total_input_tokens")), "runs")
    r = r[r["engine_steps"].notna() & r["mean_step_ms"].notna() & r["total_input_tokens"].notna()]
    if len(r) == 0:
        return pd.DataFrame()
    S = r["engine_steps"].to_numpy(float)
    P = r["total_input_tokens"].to_numpy(float)
    n_pre = np.minimum(S, np.ceil(P / MAX_BATCHED_TOKENS))
    out = pd.DataFrame({
        "group": r["group"].to_numpy(), "experiment": "prefill_sweep", "kind": "prefill", "S": S, "P": P,
        "n_pre": n_pre, "P_step": P / np.maximum(n_pre, 1), "D": 0.0, "C": 0.0, "R": 0.0, "W": 0.0, "G": 0.0,
        "N": 0.0, "A": 0.0, "adapters_used": 0.0, "step_ms": r["mean_step_ms"].to_numpy(float),
        "sched_ms": r["mean_scheduler_ms_per_step"].to_numpy(float), "sigma": 1.0 / np.sqrt(S),
        "window_start_s": np.nan})
    out["comp_ms"] = out["step_ms"] - out["sched_ms"]
    return out.reset_index(drop=True)
