"""Bad measurement tables and options of ``twin calibrate fit`` / ``report``: a clear error naming the
file, the column, the row and the fix, before any fitting; exit code 2; never a traceback, never a
silent acceptance (no profile written).

The tables are the synthetic vLLM 0.8.5 tables (:mod:`calibration.fitting.synthetic`, written once),
each test corrupting one of them in a copy. Nothing is fitted: every error comes while reading.
"""

from __future__ import annotations

import io
import shutil
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from calibration.fitting.core import TableError
from calibration.fitting.tables import Col, read_table, text
from twin.cli import main


@pytest.fixture(scope="module")
def tables(tmp_path_factory) -> Path:
    from calibration.fitting.synthetic import write_vllm085_tables

    return write_vllm085_tables(tmp_path_factory.mktemp("synthetic085"), seed=1)


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = main(argv)
    return rc, out.getvalue(), err.getvalue()


def fit(meas: Path, tmp_path: Path, *extra: str) -> tuple[int, str, str]:
    """``twin calibrate fit`` of ``meas`` into ``tmp_path/p.json`` (never the shipped profile)."""
    out = tmp_path / "p.json"
    rc, o, e = run_cli(["calibrate", "fit", "--measurements", str(meas), "--model", "llama-3.1-8b",
                        "--out", str(out), "--quiet", *extra])
    assert "Traceback" not in e
    if rc != 0:
        assert not out.exists()  # nothing fitted, nothing written
    return rc, o, e


def corrupt(tables: Path, tmp_path: Path, name: str, edit=None, content: bytes | None = None) -> Path:
    """A copy of ``tables`` with ``name`` edited (``edit(df)``: in place, or returns the new frame) or
    replaced by ``content``."""
    d = tmp_path / "meas"
    shutil.copytree(tables, d)
    if content is not None:
        (d / name).write_bytes(content)
    else:
        df = pd.read_csv(d / name)
        new = edit(df)
        (df if new is None else new).to_csv(d / name, index=False)
    return d


# ------------------------------------------------------------------------------------------
# finding 1: missing columns, empty files, values that are not numbers
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name,column", [("step_latency.csv", "mean_step_ms"), ("adapter_load.csv", "load_ms"),
                                         ("kv_capacity.csv", "status"),
                                         ("scheduler_overhead.csv", "scheduler_ms_per_step"),
                                         ("adapter_overhead_windows.csv", "max_lora_rank")])
def test_missing_column_named_with_file_and_fix(tables, tmp_path, name, column):
    d = corrupt(tables, tmp_path, name, lambda df: df.drop(columns=[column]))
    rc, out, err = fit(d, tmp_path)
    assert rc == 2 and out == ""
    assert f"twin calibrate fit: error: {d / name} lacks the column {column}, which the fit reads" in err, err
    assert "restore it or regenerate the table (see the data README" in err, err


def test_empty_and_header_only_tables(tables, tmp_path):
    d = corrupt(tables, tmp_path, "adapter_load.csv", content=b"")
    rc, _, err = fit(d, tmp_path)
    assert rc == 2 and f"{d / 'adapter_load.csv'} is empty (not even a header line); restore the table" in err, err
    assert "No columns to parse" not in err
    (d / "adapter_load.csv").write_text("model,adapter_rank,max_lora_rank,load_kind,phase,load_index,load_ms\n")
    rc, _, err = fit(d, tmp_path)
    assert rc == 2 and f"{d / 'adapter_load.csv'} has a header but no rows" in err, err


def test_not_a_number_names_column_row_and_value(tables, tmp_path):
    def edit(df):
        df["mean_step_ms"] = df["mean_step_ms"].astype(object)
        df.loc[2, "mean_step_ms"] = "abc"

    d = corrupt(tables, tmp_path, "step_latency.csv", edit)
    rc, _, err = fit(d, tmp_path)
    assert rc == 2
    assert (f"{d / 'step_latency.csv'}, column mean_step_ms: 'abc' at row 3 (line 4) is not a number; write a mean "
            f"step time (ms) as a number") in err, err
    assert "could not convert" not in err


def test_rows_with_a_cell_too_many_and_a_repeated_column(tables, tmp_path):
    """A trailing comma on every row: pandas read the first column as row labels and shifted every value
    one column left (the fit read the wrong columns); a repeated column's second copy was dropped."""
    d = corrupt(tables, tmp_path, "kv_capacity.csv", content=b"a,b\n1,2,\n3,4,\n")
    rc, _, err = fit(d, tmp_path)
    assert rc == 2 and "kv_capacity.csv: row 1 (line 2) has 3 cells but the header names 2 columns (a trailing " \
                       "comma?)" in err, err
    (d / "kv_capacity.csv").write_text("a,b,a\n1,2,3\n")
    rc, _, err = fit(d, tmp_path)
    assert rc == 2 and "kv_capacity.csv: the header names column 'a' twice" in err, err


def test_malformed_csv_and_unreadable_file(tables, tmp_path):
    d = corrupt(tables, tmp_path, "kv_capacity.csv", content=b"a,b\n1,2\n1,2,3,4\n")
    rc, _, err = fit(d, tmp_path)
    assert rc == 2 and "kv_capacity.csv is not a well-formed CSV table (line 3 has 4 fields where line 1 (the " \
                       "header) has 2)" in err, err
    (d / "kv_capacity.csv").unlink()
    (d / "kv_capacity.csv").mkdir()
    rc, _, err = fit(d, tmp_path)
    assert rc == 2 and "kv_capacity.csv cannot be read (Is a directory)" in err, err


def test_empty_cell_where_every_row_needs_a_value(tables, tmp_path):
    d = corrupt(tables, tmp_path, "adapter_load.csv", lambda df: df.assign(
        load_ms=df["load_ms"].where(~df.index.isin([4, 9, 11]))))
    rc, _, err = fit(d, tmp_path)
    assert rc == 2
    assert ("column load_ms is empty at row 5 (line 6) and 2 other rows (lines 11, 13); every row needs an adapter "
            "load time (ms): fill them in or remove those rows") in err, err


# ------------------------------------------------------------------------------------------
# finding 2: physically impossible values refused; legitimate zeros kept
# ------------------------------------------------------------------------------------------

def test_negative_step_times_refused(tables, tmp_path):
    d = corrupt(tables, tmp_path, "step_latency.csv", lambda df: df.assign(mean_step_ms=-5.0))
    rc, _, err = fit(d, tmp_path)
    n = len(pd.read_csv(d / "step_latency.csv"))
    assert rc == 2
    assert (f"{d / 'step_latency.csv'}, column mean_step_ms: -5 at row 1 (line 2) and {n - 1} other rows (lines 3, "
            f"4, 5, 6, 7, ...) is not positive; a mean step time (ms) must be greater than 0: correct those values or "
            f"remove those rows") in err, err


@pytest.mark.parametrize("name,column,value,fragment", [
    ("adapter_load.csv", "load_ms", 0.0, "column load_ms: 0 at row 1 (line 2) is not positive; an adapter load time "
                                         "(ms) must be greater than 0: correct the value or remove the row"),
    ("adapter_load.csv", "adapter_rank", 8.5, "column adapter_rank: 8.5 at row 1 (line 2) is not a whole number"),
    ("adapter_load.csv", "load_index", 0, "column load_index: 0 at row 1 (line 2) is not positive"),
    ("step_latency.csv", "kv_usage_end", 1.5, "column kv_usage_end: 1.5 at row 1 (line 2) is outside 0..1"),
    ("step_latency.csv", "prompt_tokens", -1.0, "column prompt_tokens: -1 at row 1 (line 2) is negative; a number "
                                                "of prompt tokens cannot be negative"),
    ("step_latency.csv", "mean_step_ms", np.inf, "column mean_step_ms: inf at row 1 (line 2) is not a finite number"),
    # a corrupt cell of 1e300 drove the fit into a million overflow warnings, whose replay hung the command
    ("scheduler_overhead.csv", "scheduler_ms_per_step", 1e300, "column scheduler_ms_per_step: 1e+300 at row 1 (line "
                                                               "2) is not a finite number of a measurable size (at "
                                                               "most 1e+15)"),
    ("step_latency_runs.csv", "kv_cache_tokens", 0.0, "column kv_cache_tokens: 0 at row 1 (line 2) is not positive"),
    ("kv_capacity.csv", "adapter_slots", -8, "column adapter_slots: -8 at row 1 (line 2) is negative"),
    ("scheduler_overhead.csv", "scheduler_ms_per_step", -0.1, "column scheduler_ms_per_step: -0.1 at row 1 (line 2) "
                                                              "is negative; a scheduler time per step (ms) cannot be "
                                                              "negative"),
    ("scheduler_overhead.csv", "mean_waiting", -2.0, "column mean_waiting: -2 at row 1 (line 2) is negative"),
    # counts of slots, adapters, requests, steps and tokens are whole numbers (a fractional one was fitted as given)
    ("scheduler_overhead.csv", "adapter_slots", 12.5, "column adapter_slots: 12.5 at row 1 (line 2) is not a whole "
                                                      "number; a number of adapter slots is a whole number"),
    ("adapter_overhead_windows.csv", "running_end", 3.25, "column running_end: 3.25 at row 1 (line 2) is not a whole "
                                                          "number; a running-request gauge is a whole number"),
    ("step_latency_runs.csv", "engine_steps", 10.5, "column engine_steps: 10.5 at row 1 (line 2) is not a whole "
                                                    "number"),
    # ranks vLLM cannot serve: a rank 1000 times too large fitted a degenerate load model (fixed times of 1e-27 s)
    ("adapter_load.csv", "adapter_rank", 8000, "column adapter_rank: 8000 at row 1 (line 2) is above 512, the "
                                               "largest max_lora_rank vLLM accepts (8, 16, 32, 64, 128, 256, 320, "
                                               "512; LoRAConfig's possible_max_ranks): no vLLM server loads such an "
                                               "adapter; an adapter rank is at most 512: correct the value or remove "
                                               "the row"),
    ("adapter_load.csv", "max_lora_rank", 24, "column max_lora_rank: 24 at row 1 (line 2) is not a value the server "
                                              "accepts (vLLM accepts only 8, 16, 32, 64, 128, 256, 320, 512; "
                                              "LoRAConfig's possible_max_ranks); a max LoRA rank is one of them"),
    ("kv_capacity.csv", "max_lora_rank", 16000, "column max_lora_rank: 16000 at row 1 (line 2) is not a value the "
                                                "server accepts (vLLM accepts only 8, 16, 32, 64, 128, 256, 320, 512; "
                                                "LoRAConfig's possible_max_ranks (0: without LoRA))"),
])
def test_impossible_value_refused(tables, tmp_path, name, column, value, fragment):
    def edit(df):
        df[column] = df[column].astype(float)
        df.loc[0, column] = value

    d = corrupt(tables, tmp_path, name, edit)
    rc, _, err = fit(d, tmp_path)
    assert rc == 2 and f"{d / name}, {fragment}" in err, err


def test_every_problem_of_a_table_listed(tables, tmp_path):
    def edit(df):
        df.loc[3, "load_ms"] = -1.0
        df.loc[6, "max_lora_rank"] = 0

    d = corrupt(tables, tmp_path, "adapter_load.csv", edit)
    rc, _, err = fit(d, tmp_path)
    assert rc == 2 and f"{d / 'adapter_load.csv'} has 2 problems (fix them, then run again):" in err, err
    assert "  - column max_lora_rank: 0 at row 7 (line 8) is not positive" in err, err
    assert "  - column load_ms: -1 at row 4 (line 5) is not positive" in err, err


def test_the_ranks_of_the_vllm050_tables_are_bounded_too(tmp_path):
    """The vLLM 0.5.0 runs and load samples read ranks with 0.5.0's bounds (``possible_max_ranks`` = 8, 16, 32, 64
    in that wheel's ``vllm/config.py``; 0.8.5 adds 128-512); a server without LoRA (an empty max_lora_rank) passes."""
    from calibration.fitting.vllm050 import LOAD_COLUMNS, RUNS_COLUMNS

    p = tmp_path / "adapter_load_manual.csv"
    p.write_text("model,phase,adapter_rank,sample,loading_ms,activating_ms\nllama-2-7b,first_load,128,1,5,1\n")
    with pytest.raises(TableError, match=r"column adapter_rank: 128 at row 1 \(line 2\) is above 64, the largest "
                                         r"max_lora_rank vLLM accepts \(8, 16, 32, 64; LoRAConfig"):
        read_table(p, LOAD_COLUMNS, "the test")
    cols = [c for c in RUNS_COLUMNS if c.name in ("run_dir", "max_lora_rank")]
    p = tmp_path / "runs.csv"
    p.write_text("run_dir,max_lora_rank\na,\nb,0\nc,64\n")
    assert read_table(p, cols, "the test")["max_lora_rank"].tolist()[1:] == [0, 64]
    for bad in (48, 128):  # (128 is a value vLLM 0.8.5 accepts, 0.5.0 does not: vllm/config.py possible_max_ranks)
        p.write_text(f"run_dir,max_lora_rank\na,\nb,{bad}\n")
        with pytest.raises(TableError, match=rf"column max_lora_rank: {bad} at row 2 \(line 3\) is not a value the "
                                             r"server accepts \(vLLM accepts only 8, 16, 32, 64; LoRAConfig"):
            read_table(p, cols, "the test")


def test_read_table_keeps_legitimate_zeros_and_missing_values(tmp_path):
    """Zero waiting requests, zero prompt tokens, an empty (missing) step time, a number in a text column:
    accepted (the fit leaves NaN rows out where it documents it); the numbers come back numeric."""
    p = tmp_path / "t.csv"
    p.write_text("run_dir,waiting,step_ms,rank\n7,0,,8\nx,3, 12.5 ,16\n")
    cols = (text("run_dir", "run directory"), Col("waiting", "a waiting gauge", missing_ok=False),
            Col("step_ms", "a step time (ms)", "pos"), Col("rank", "a rank", "pos", whole=True),
            Col("absent", "an optional column", required=False))
    df = read_table(p, cols, "the test")
    assert df["run_dir"].tolist() == ["7", "x"]
    assert df["waiting"].tolist() == [0, 3] and np.isnan(df["step_ms"].iloc[0]) and df["step_ms"].iloc[1] == 12.5
    with pytest.raises(TableError, match=r"t\.csv, column step_ms: 0 at row 1 \(line 2\) is not positive"):
        p.write_text("run_dir,waiting,step_ms,rank\n7,0,0,8\n")
        read_table(p, cols, "the test")


def test_nan_rows_still_dropped_with_a_warning_not_refused(tables, tmp_path):
    """A missing (NaN) step time is a documented gap (counter overflow, no step log): the window is left
    out and named in a warning, as before; only impossible values are refused."""
    from calibration.fitting.tables import Vllm085Tables, window_features

    d = corrupt(tables, tmp_path, "step_latency.csv", lambda df: df.assign(
        mean_step_ms=df["mean_step_ms"].where(df.index % 3 != 1)))
    t = Vllm085Tables.read(d, "llama-3.1-8b")
    with pytest.warns(UserWarning, match=r"step_latency\.csv: \d+ of \d+ windows dropped for a missing \(NaN\) value "
                                         r"in mean_step_ms or mean_scheduler_ms"):
        w = window_features(t.step_windows, t.step_runs, "step_latency.csv")
    assert len(w) > 0 and np.isfinite(w["step_ms"]).all()


def test_report_checks_the_tables_before_printing(tables, tmp_path):
    d = corrupt(tables, tmp_path, "step_latency.csv", lambda df: df.drop(columns=["mean_step_ms"]))
    rc, out, err = run_cli(["calibrate", "report", "llama-3.1-8b_h100_vllm085", "--measurements", str(d),
                            "--out-dir", str(tmp_path / "figs")])
    assert rc == 2 and out == "" and "Traceback" not in err
    assert f"twin calibrate report: error: {d / 'step_latency.csv'} lacks the column mean_step_ms" in err, err


# ------------------------------------------------------------------------------------------
# finding 3: --gpu / --reference / --vidur-dir where the format does not use them; unknown names
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("extra,fragment", [
    (["--gpu", "nosuch"], "--gpu nosuch: used only with Vidur operator timings (--format vidur); {d} holds vLLM "
                          "0.8.5 tables of an H100 (--format vllm085), whose fit does not use it: leave --gpu out"),
    (["--gpu", "a40"], "--gpu a40: used only with Vidur operator timings"),
    (["--reference", "nosuch"], "--reference nosuch: used only with Vidur operator timings (--format vidur); {d} "
                                "holds vLLM 0.8.5 tables of an H100"),
    (["--vidur-dir", "{d}"], "--vidur-dir {d}: used only with vLLM 0.5.0 runs on an H100 (--format vllm050)"),
])
def test_options_the_format_does_not_use_are_refused(tables, tmp_path, extra, fragment):
    rc, _, err = fit(tables, tmp_path, *[e.format(d=tables) for e in extra])
    assert rc == 2 and fragment.format(d=tables) in err, err


def test_vidur_gpu_and_reference_names_checked(tmp_path):
    rc, _, err = fit(tmp_path, tmp_path, "--format", "vidur", "--gpu", "nosuch")
    assert rc == 2 and ("--gpu nosuch: unknown GPU of the Vidur operator timings; choose one of a40, a100-80gb, "
                        "a100-48gb, a100-24gb, h100 (a100 = a100-80gb)") in err, err
    rc, _, err = fit(tmp_path, tmp_path, "--format", "vidur", "--reference", "nosuch")
    assert rc == 2 and "--reference nosuch: unknown profile 'nosuch'" in err, err


# ------------------------------------------------------------------------------------------
# finding 4: `twin calibrate` without a subcommand
# ------------------------------------------------------------------------------------------

def test_calibrate_without_subcommand_prints_usage_and_exits_2():
    rc, out, _ = run_cli(["calibrate"])
    assert rc == 2 and out.startswith("usage: twin calibrate")
    rc_configure, _, _ = run_cli(["configure"])
    assert rc == rc_configure


# ------------------------------------------------------------------------------------------
# `twin calibrate bench`: empty lists and --out, options of a part --parts leaves out (read as "all" / the
# current directory / nothing before); resolved without torch
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("argv,fragment", [
    (["--parts", ""], "--parts: empty; give comma-separated names, or leave --parts out for all of them"),
    (["--check-cases", " , "], "--check-cases: empty; give comma-separated names"),
    (["--targets", ""], "--targets: empty; give comma-separated names"),
    (["--out", ""], "--out: empty; give a directory"),
    (["--lora-tokens", "0"], "--lora-tokens: expected positive integers, got '0'"),  # (said --lora_tokens)
    (["--parts", "linear", "--keep-adapters"], "--keep-adapters sets the load part, but --parts linear leaves it out, "
                                               "so it would change nothing; add load to --parts, or leave "
                                               "--keep-adapters out"),
    (["--parts", "linear,lora", "--warm-cache"], "--warm-cache sets the load part, but --parts linear,lora leaves it"),
    (["--parts", "linear", "--slots", "4"], "--slots sets the lora part, but --parts linear leaves it out"),
    (["--parts", "load", "--tokens", "8"], "--tokens sets the linear part, but --parts load leaves it out"),
    (["--parts", "lora", "--step-chunk", "64"], "--step-chunk sets the step part, but --parts lora leaves it out"),
    (["--parts", "step", "--concurrency", "2"], "--concurrency sets the h2d part"),
])
def test_bench_options_refused_before_any_work(tmp_path, argv, fragment):
    from calibration.bench.cli import build_parser
    from calibration.bench.config import resolve_config

    out = ["--out", str(tmp_path / "b")] if "--out" not in argv else []
    args = build_parser().parse_args(["--device", "cpu", *out, *argv])
    with pytest.raises(ValueError) as e:
        resolve_config(args, cuda_available=False)
    assert fragment in str(e.value)
    assert not (tmp_path / "b").exists()


def test_bench_part_options_with_their_part_are_accepted(tmp_path):
    from calibration.bench.cli import build_parser
    from calibration.bench.config import resolve_config

    args = build_parser().parse_args(["--device", "cpu", "--out", str(tmp_path / "b"), "--parts", "linear,load",
                                      "--tokens", "8", "--keep-adapters", "--warm-cache", "--load-repeats", "2"])
    cfg = resolve_config(args, cuda_available=False)
    assert cfg.tokens == (8,) and cfg.keep_adapters and not cfg.cold_cache and cfg.load_repeats == 2


@pytest.mark.parametrize("module", ["split64", "adapter_check", "mixed"])
def test_the_fitting_modules_commands_refuse_a_missing_or_empty_data_directory(module, tmp_path, capsys):
    """``python -m calibration.fitting.<module>``: the shared parser (:func:`calibration.fitting.tables.fitting_parser`)
    and error report (:func:`~calibration.fitting.tables.fitting_error`): exit 2, the module's name and the fix."""
    import importlib

    main_of = importlib.import_module(f"calibration.fitting.{module}").main
    assert main_of(["--data", str(tmp_path / "absent")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"{module}: no calibration directory {tmp_path / 'absent'}; set TWIN_DATA_DIR or pass --data")
    assert main_of(["--data", " "]) == 2
    assert "--data: empty; give the vLLM 0.8.5 calibration directory" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main_of(["--help"])
    out = capsys.readouterr().out
    assert f"python -m calibration.fitting.{module}" in out and "--data DATA" in out
    assert ("--model MODEL" in out and "--json" in out) == (module != "mixed")
