"""Bad cells and headers of the raw trace loaders are refused naming the row/column and the fix, before any
work is done (each used to be read silently as something else, or to end in a traceback)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from traces.loaders import TraceFormatError, load_trace
from traces.registry import MAX_REQUESTS, get_workload

MINUTES = [str(m) for m in range(1, 1441)]


def _functions_2019(path: Path, rows: dict[str, list]) -> Path:
    """A one-day Azure Functions 2019 file: function name -> its first minute cells (the rest 0)."""
    lines = [",".join(["HashOwner", "HashApp", "HashFunction", "Trigger"] + MINUTES)]
    for name, cells in rows.items():
        minute = [str(c) for c in cells] + ["0"] * (1440 - len(cells))
        lines.append(",".join(["o", "a", name, "http"] + minute))
    path.write_text("\n".join(lines) + "\n")
    return path


# ---------------------------------------------------------------- 1. Azure Functions 2019 minute cells
@pytest.mark.parametrize("cells,fragment", [
    (["abc", 2, 1], "minute column '1': 'abc' is not a whole invocation count >= 0"),   # was read as 0 (6 requests)
    ([2.7, 1, 1], "minute column '1': 2.7 is not a whole invocation count >= 0"),      # was truncated to 2 (7)
    ([1, "", 1], "minute column '2': an empty (or NA) cell is not a whole invocation count"),  # was read as 0
    ([1, 1, "nan"], "minute column '3': an empty (or NA) cell"),
    ([-2, 1, 1], "minute column '1': -2 is not a whole invocation count >= 0"),      # was a bare numpy message
    ([1, "inf", 1], "minute column '2': inf is not a whole invocation count"),
    ([1e12, 1, 1], "more than the 5,000,000 invocations a run may generate"),        # was a 7.28 TiB allocation
])
def test_functions_2019_bad_minute_cell_is_refused_naming_function_and_minute(tmp_path, cells, fragment):
    path = _functions_2019(tmp_path / "invocations_per_function_md.anon.d01.csv", {"f": cells, "g": [3]})
    with pytest.raises(TraceFormatError) as e:
        load_trace(path, n_functions=2)
    msg = str(e.value)
    assert fragment in msg and "function o/a/f (data row 1)" in msg and "fix the cell or drop the row" in msg
    assert str(path) in msg
    with pytest.raises(ValueError, match="function o/a/f"):  # through the registry: the same message, no traceback
        get_workload(str(path))


def test_the_loaders_cap_is_the_registrys():
    from traces.loaders import base

    assert base.MAX_REQUESTS == MAX_REQUESTS


def test_functions_2019_whole_counts_still_load(tmp_path):
    path = _functions_2019(tmp_path / "invocations_per_function_md.anon.d01.csv", {"f": [3, 2.0, 1], "g": [3]})
    assert len(load_trace(path, n_functions=2)) == 9


def test_functions_2019_total_above_the_request_cap_is_refused_before_allocating(tmp_path):
    """1e12 invocations in one minute asked numpy for 7.28 TiB (a traceback in `twin traces show`); many
    minutes just under the per-cell cap add up beyond the run's cap and are refused too, with the fix."""
    cell = MAX_REQUESTS // 4
    path = _functions_2019(tmp_path / "invocations_per_function_md.anon.d01.csv", {"f": [cell] * 6, "g": [3]})
    with pytest.raises(ValueError, match=r"the 2 most-invoked functions hold 7,500,003 invocations in minutes "
                                         r"\[0, 1440\), more than the 5,000,000 a run may generate; narrow the minute "
                                         r"window \(start_min/end_min"):
        load_trace(path, n_functions=2)
    # a window that fits is read
    assert len(load_trace(path, n_functions=2, start_min=5, end_min=6)) == cell


# ---------------------------------------------------------------- 2. Azure Functions 2021 end/duration
F21 = "app,func,end_timestamp,duration\n"


@pytest.mark.parametrize("rows,fragment", [
    # an inf end time made the registry re-time the whole trace as Poisson ([0.82, 1.01, 1.33])
    ("a,f,10.5,0.5\na,f,inf,0.1\nb,g,12,1\n", "column 'end_timestamp' must be finite seconds; data row 2 (inf) is "
                                             "not; fix or drop the row"),
    ("a,f,10.5,0.5\na,f,,0.1\n", "column 'end_timestamp' has a missing or non-numeric value at data row 2 (empty)"),
    # a negative duration put the arrival after the end (end + 50)
    ("a,f,10.5,0.5\nb,g,12,-50\n", "column 'duration' must be finite seconds >= 0 (the invocation's run time; its "
                                   "arrival is end_timestamp - duration); data row 2 (-50"),
    ("a,f,10.5,inf\n", "column 'duration' must be finite seconds >= 0"),
    ("a,f,10.5,abc\n", "column 'duration' has a missing or non-numeric value at data row 1 ('abc')"),
])
def test_functions_2021_non_finite_end_or_negative_duration_is_refused_naming_the_row(tmp_path, rows, fragment):
    path = tmp_path / "f.txt"
    path.write_text(F21 + rows)
    with pytest.raises(TraceFormatError) as e:
        load_trace(path, n_functions=10)
    assert fragment in str(e.value)
    with pytest.raises(ValueError, match="fix or drop the row"):
        get_workload(str(path))


def test_functions_2021_zero_duration_is_kept(tmp_path):
    path = tmp_path / "f.txt"
    path.write_text(F21 + "a,f,10.5,0\na,f,12,1\n")
    assert load_trace(path).df["arrival_s"].tolist() == [0.0, 0.5]


# ---------------------------------------------------------------- 3. epoch units by magnitude
AZ = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


@pytest.mark.parametrize("base,step,unit", [
    (1_700_000_000, 1, "s"),                      # epoch seconds, as before
    (1_700_000_000_000, 1_000, "ms"),             # were read as seconds: arrivals [0, 1000, 2000]
    (1_700_000_000_000_000, 1_000_000, "us"),
    (1_700_000_000_000_000_000, 1_000_000_000, "ns"),  # (exact: the offsets are taken in integers)
    (0, 1, "s"),                                  # seconds from the start
])
def test_numeric_epoch_timestamps_are_read_in_the_unit_their_magnitude_gives(tmp_path, base, step, unit):
    path = tmp_path / "t.csv"
    path.write_text(AZ + "".join(f"{base + k * step},10,5\n" for k in (0, 1, 2)))
    tab = load_trace(path)
    assert tab.df["arrival_s"].tolist() == pytest.approx([0.0, 1.0, 2.0])
    assert tab.meta["timestamp_unit"] == unit


def test_datetime_timestamps_record_their_unit(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text(AZ + "2023-11-16 18:15:46.5,10,5\n2023-11-16 18:15:47.5,10,5\n")
    assert load_trace(path).meta["timestamp_unit"] == "datetime"


@pytest.mark.parametrize("values", [(5, 1_700_000_000_000), (1_700_000_000_000, 1_700_000_000_000_000)])
def test_a_column_mixing_epoch_units_is_refused(tmp_path, values):
    path = tmp_path / "t.csv"
    path.write_text(AZ + "".join(f"{v},10,5\n" for v in values))
    with pytest.raises(TraceFormatError, match=r"column 'TIMESTAMP' mixes timestamp magnitudes, data row 1 .* and "
                                               r"data row 2 .*give every timestamp in one unit"):
        load_trace(path)


# ---------------------------------------------------------------- 4. BurstGPT: every row failed
BG = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"


def test_burstgpt_all_failed_rows_say_so_and_the_fix(tmp_path):
    path = tmp_path / "b.csv"
    path.write_text(BG + "5,ChatGPT,472,0,472,Conversation log\n7,GPT-4,100,0,100,API log\n")
    fragment = ("every one of its 2 rows is a failed request (Response tokens 0), and failed requests are dropped, "
                "so no request is left; give keep_failed=true")
    with pytest.raises(TraceFormatError) as e:
        load_trace(path)
    assert fragment in str(e.value)
    with pytest.raises(ValueError) as e2:  # (was: "the trace holds no requests (a header but no rows?)")
        get_workload(str(path))
    assert fragment in str(e2.value) and "header but no rows" not in str(e2.value)
    assert len(load_trace(path, keep_failed=True)) == 2
    with pytest.raises(TraceFormatError, match="every one of its 1 rows of Log Type 'API log' is a failed request"):
        load_trace(path, log_type="API log")


def test_burstgpt_unknown_log_type_names_the_types(tmp_path):
    path = tmp_path / "b.csv"
    path.write_text(BG + "5,ChatGPT,472,3,475,Conversation log\n")
    with pytest.raises(TraceFormatError, match=r"no row has Log Type 'api' \(its 1 rows have 'Conversation log'\)"):
        load_trace(path, log_type="api")


# ---------------------------------------------------------------- 5. repeated columns, true/false cells
@pytest.mark.parametrize("text,fragment", [
    # the second TIMESTAMP was ignored
    ("TIMESTAMP,ContextTokens,GeneratedTokens,TIMESTAMP\n2023-11-16 18:15:46,10,5,2023-11-16 19:00:00\n",
     "column 'TIMESTAMP' appears 2 times in the header (columns 1, 4)"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens, ContextTokens\n2023-11-16 18:15:46,10,5,7\n",
     "column 'ContextTokens' appears 2 times in the header (columns 2, 4)"),
    (BG.strip() + ",Response tokens\n5,ChatGPT,1,2,3,API log,4\n", "column 'Response tokens' appears 2 times"),
    (F21.strip() + ",duration\na,f,1,0,0\n", "column 'duration' appears 2 times"),
])
def test_a_column_named_twice_in_the_header_is_refused(tmp_path, text, fragment):
    _refused(tmp_path, text, "remove or rename the extra column", fragment)


def _refused(tmp_path, text: str, fix: str, fragment: str) -> None:
    """The trace ``text`` (a .txt when it is an Azure Functions 2021 file, else a .csv) is refused saying ``fix``
    and ``fragment``."""
    path = tmp_path / ("t.txt" if text.startswith("app") else "t.csv")
    path.write_text(text)
    with pytest.raises(TraceFormatError, match=fix) as e:
        load_trace(path)
    assert fragment in str(e.value)


def test_a_repeated_column_the_loader_does_not_read_is_no_error(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens,note,note\n2023-11-16 18:15:46,10,5,x,y\n")
    assert len(load_trace(path)) == 1


@pytest.mark.parametrize("text,fragment", [
    (AZ + "2023-11-16 18:15:46,true,5\n", "column 'ContextTokens' holds true/false at data row 1 (True), not a token "
                                          "count"),  # was read as 1 token
    (AZ + "2023-11-16 18:15:46,5,False\n", "column 'GeneratedTokens' holds true/false"),
    (AZ + "true,5,5\n", "column 'TIMESTAMP' holds true/false at data row 1 (True), not a timestamp"),
    (BG + "5,ChatGPT,true,3,4,API log\n", "column 'Request tokens' holds true/false"),
    (F21 + "a,f,true,0\n", "column 'end_timestamp' holds true/false at data row 1 (True), not seconds"),
])
def test_a_true_false_cell_is_refused_not_read_as_one(tmp_path, text, fragment):
    _refused(tmp_path, text, "fix or drop the row", fragment)


def test_functions_2019_true_false_cell_is_refused(tmp_path):
    path = _functions_2019(tmp_path / "invocations_per_function_md.anon.d01.csv", {"f": [1, "true"]})
    with pytest.raises(TraceFormatError, match="minute column '2': True is not a whole invocation count"):
        load_trace(path)


def test_sample_traces_still_load(tmp_path):
    """The sample files of every CSV format pass the new checks unchanged."""
    from traces.samples import write_sample

    for fmt, name in (("azure-llm", "a.csv"), ("azure-functions-2019", "invocations_per_function_md.anon.d01.csv"),
                      ("azure-functions-2021", "f.txt"), ("burstgpt", "b.csv")):
        tab = load_trace(write_sample(fmt, tmp_path / name, n=40, seed=2))
        assert len(tab) > 0 and np.isfinite(tab.df["arrival_s"]).all()
