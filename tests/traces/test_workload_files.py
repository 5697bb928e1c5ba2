"""Workloads from CSV and JSON Lines files (issue 16, item 3): the same table as a saved
Parquet workload, optional columns with their defaults, unsorted rows sorted, and errors that
name the file, the row and the column."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from traces.registry import get_workload
from traces.workload import COLUMNS, Workload, WorkloadError, read_workload_file


def _workload() -> Workload:
    return get_workload("synthetic", duration=20, adapters=5, ranks=[8, 16], seed=1)


def test_csv_jsonl_and_parquet_give_the_same_workload(tmp_path):
    w = _workload()
    w.save(tmp_path / "w.parquet")
    w.df.to_csv(tmp_path / "w.csv", index=False)
    with open(tmp_path / "w.jsonl", "w") as fh:
        for rec in w.df.to_dict(orient="records"):
            fh.write(json.dumps({k: (v.item() if hasattr(v, "item") else v) for k, v in rec.items()}) + "\n")
    frames = [read_workload_file(tmp_path / f"w.{ext}").df for ext in ("parquet", "csv", "jsonl")]
    for df in frames:
        pd.testing.assert_frame_equal(df, w.df, check_exact=True)
    for ext in ("csv", "jsonl"):  # and through the trace registry (twin run --trace FILE)
        pd.testing.assert_frame_equal(get_workload(str(tmp_path / f"w.{ext}")).df, w.df, check_exact=True)


def test_optional_columns_take_their_defaults_and_rows_are_sorted(tmp_path):
    (tmp_path / "w.csv").write_text("arrival_s,prompt_tokens,output_tokens,adapter_id,adapter_rank\n"
                                    "2.5,100,10,,\n1.0,30,10,3,8\n0.2,50,5,3,8\n")
    df = read_workload_file(tmp_path / "w.csv").df
    assert list(df.columns) == list(COLUMNS)
    assert df["arrival_s"].tolist() == [0.2, 1.0, 2.5]
    assert df["request_id"].tolist() == [2, 1, 0]  # ids follow the file's rows
    assert df["adapter_id"].tolist() == [3, 3, -1] and df["adapter_rank"].tolist() == [8, 8, 0]
    assert (df["conversation_id"] == -1).all() and (df["prefix_tokens"] == 0).all()


def test_a_workload_csv_runs(tmp_path, capsys):
    from twin.cli import main

    (tmp_path / "w.csv").write_text("arrival_s,prompt_tokens,output_tokens,adapter_id,adapter_rank\n"
                                    "0.0,100,10,0,8\n0.5,300,20,1,16\n0.7,50,5,-1,0\n")
    assert main(["run", "--trace", str(tmp_path / "w.csv"), "--json", "--no-progress"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["requests_arrived"] == s["requests_finished"] == 3


@pytest.mark.parametrize("name,text,fragment", [
    ("m.csv", "arrival_s,output_tokens\n0,1\n", "missing column(s) prompt_tokens"),
    ("u.csv", "arrival_s,prompt_tokens,output_tokens,lora\n0,1,1,2\n", "unknown column(s) lora"),
    ("h.csv", "arrival_s,prompt_tokens,output_tokens\n", "the file holds no requests"),
    ("e.csv", "", "the file is empty"),
    ("n.csv", "arrival_s,prompt_tokens,output_tokens\n0,1,1\n1,x,1\n", "row 2 (line 3), column prompt_tokens: 'x' is "
                                                                       "not a number"),
    ("neg.csv", "arrival_s,prompt_tokens,output_tokens\n0,1,1\n1,1,-2\n", "row 2 (line 3), column output_tokens: "
                                                                          "'-2' is below the minimum 1"),
    ("inf.csv", "arrival_s,prompt_tokens,output_tokens\ninf,1,1\n", "row 1 (line 2), column arrival_s: 'inf' is not "
                                                                    "a finite number"),
    ("big.csv", "arrival_s,prompt_tokens,output_tokens\n0,1e30,1\n", "column prompt_tokens: '1e30' is too large; the "
                                                                     "values of prompt_tokens must be below 2**53"),
    ("bigint.csv", "arrival_s,prompt_tokens,output_tokens\n0,1,99999999999999999999\n", "'99999999999999999999' is "
                                                                                        "too large"),
    # (read through a float it became 2**53, and a file with both ids was refused as repeating one)
    ("id53.csv", "arrival_s,prompt_tokens,output_tokens,request_id\n0,1,1,9007199254740993\n",
     "column request_id: '9007199254740993' is too large"),
    ("half.csv", "arrival_s,prompt_tokens,output_tokens\n0,1.5,1\n", "column prompt_tokens: '1.5' is not an integer"),
    ("dup.jsonl", '{"arrival_s": 0, "prompt_tokens": 1, "output_tokens": 1, "arrival_s": 5}\n',
     "line 1: the key 'arrival_s' is given twice; give each column once per object"),
    ("hdr.jsonl", "arrival_s,prompt_tokens,output_tokens\n0,1,1\n", "line 1: not valid JSON (Expecting value); it "
                                                                     "reads like a CSV header: name the file hdr.csv"),
    ("pre.csv", "arrival_s,prompt_tokens,output_tokens,prefix_tokens\n0,10,1,10\n", "column prefix_tokens: 10 is not "
                                                                                    "below prompt_tokens (10)"),
    ("j.jsonl", '{"arrival_s": 0, "prompt_tokens": 1, "output_tokens": 1}\n\n{"arrival_s": null, "prompt_tokens": 1, '
                '"output_tokens": 1}\n', "row 2 (line 3), column arrival_s: empty (the column is required)"),
    ("k.jsonl", '{"arrival_s": 0, "prompt_tokens": [1], "output_tokens": 1}\n', "column prompt_tokens: [1] is a list, "
                                                                                  "not a number"),
    ("w.txt", "arrival_s,prompt_tokens,output_tokens\n0,1,1\n", "unknown workload file type '.txt'"),
    # conversations: turns and prefixes of no conversation, a turn before the one it follows (accepted and run)
    ("t.csv", "arrival_s,prompt_tokens,output_tokens,turn\n0,10,5,0\n", "row 1 (line 2), column turn: 0 on a request "
                                                                       "of no conversation (conversation_id -1)"),
    ("p.csv", "arrival_s,prompt_tokens,output_tokens,prefix_tokens\n0,10,5,3\n", "column prefix_tokens: 3 on a "
                                                                                  "request of no conversation"),
    ("o.csv", "arrival_s,prompt_tokens,output_tokens,conversation_id,turn\n0,10,5,1,5\n1,10,5,1,0\n",
     "row 2 (line 3), column turn: turn 0 of conversation 1 arrives at or after its turn 5 (row 1 (line 2))"),
    ("r.csv", "arrival_s,prompt_tokens,output_tokens,conversation_id,turn\n0,10,5,1,0\n1,10,5,1,0\n",
     "turn 0 of conversation 1 arrives at or after its turn 0"),
])
def test_bad_workload_files_name_the_file_row_and_column(tmp_path, name, text, fragment):
    p = tmp_path / name
    p.write_text(text)
    with pytest.raises(WorkloadError) as e:
        read_workload_file(p)
    assert str(p) in str(e.value) and fragment in str(e.value), str(e.value)


def test_a_parquet_without_metadata_is_checked_like_a_csv(tmp_path):
    pd.DataFrame({"arrival_s": [0.0, 1.0], "prompt_tokens": [10, 0], "output_tokens": [1, 1]}).to_parquet(
        tmp_path / "w.parquet", index=False)
    with pytest.raises(WorkloadError, match="row 2, column prompt_tokens: 0 is below the minimum 1"):
        read_workload_file(tmp_path / "w.parquet")
    pd.DataFrame({"arrival_s": [1.0, 0.0], "prompt_tokens": [10, 20], "output_tokens": [1, 2]}).to_parquet(
        tmp_path / "v.parquet", index=False)
    df = read_workload_file(tmp_path / "v.parquet").df
    assert df["prompt_tokens"].tolist() == [20, 10] and np.all(df["adapter_id"] == -1)


@pytest.mark.parametrize("change, fragment", [
    ({"request_id": [-5, 1]}, "row 1, column request_id: -5 is not an id >= 0"),
    ({"prefix_tokens": [0, 5000]}, "row 2, column prefix_tokens: 5000 is not below prompt_tokens"),
    ({"adapter_rank": [8, 0]}, "row 1, column adapter_rank: 8 is a rank on a base-model request"),
    ({"output_tokens": [True, True]}, "column output_tokens holds true/false values; give numbers"),
    ({"prompt_tokens": [100, None]}, "workload column 'prompt_tokens' has missing values"),
])
def test_a_saved_workload_is_checked_like_a_text_file(tmp_path, change, fragment):
    """A Parquet file with the workload metadata and columns (what Workload.save writes) skipped the cell checks
    of the text files: a negative id, a prefix past its prompt, a rank on a base-model request and true/false token
    counts ran; an error did not name the file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    cols = {"request_id": [0, 1], "arrival_s": [0.0, 1.0], "prompt_tokens": [100, 200], "output_tokens": [10, 20],
            "adapter_id": [-1, -1], "adapter_rank": [0, 0], "conversation_id": [1, 1], "turn": [0, 1],
            "prefix_tokens": [0, 150]}
    p = tmp_path / "w.parquet"
    pq.write_table(pa.table({**cols, **change}).replace_schema_metadata({b"lora_twin": b"{}"}), p)
    with pytest.raises(WorkloadError, match="w.parquet: ") as e:
        read_workload_file(p)
    assert fragment in str(e.value)
    pq.write_table(pa.table(cols).replace_schema_metadata({b"lora_twin": b"{}"}), p)
    assert len(read_workload_file(p).df) == 2


def test_a_table_with_columns_outside_the_schema_is_refused_not_dropped(tmp_path):
    """Workload(df) refuses a column outside the schema, as the file readers and Workload.from_arrays do
    (it dropped it silently: a misspelt optional column took its default); a saved workload with an added
    column is refused naming the file."""
    df = pd.DataFrame({"arrival_s": [0.0, 1.0], "prompt_tokens": [10, 20], "output_tokens": [5, 5],
                       "adapter_id": [0, -1], "adapter_rank": [8, 0], "prefix_token": [0, 3], "user": [1, 2]})
    with pytest.raises(WorkloadError) as e:
        Workload(df)
    assert str(e.value) == ("workload table: unknown column(s) prefix_token, user; the workload columns are "
                            f"{', '.join(COLUMNS)}; rename a misspelt one, or drop the others first "
                            "(df.drop(columns=['prefix_token', 'user']))")
    assert list(Workload(df.drop(columns=["prefix_token", "user"])).df.columns) == list(COLUMNS)
    import pyarrow as pa
    import pyarrow.parquet as pq

    _workload().save(tmp_path / "w.parquet")
    table = pq.read_table(tmp_path / "w.parquet")
    table = table.append_column("user", pa.array(np.zeros(table.num_rows, np.int64)))
    pq.write_table(table, tmp_path / "x.parquet")  # (the lora_twin metadata kept)
    assert b"lora_twin" in pq.read_schema(tmp_path / "x.parquet").metadata
    with pytest.raises(WorkloadError, match=f"{tmp_path / 'x.parquet'}: unknown column\\(s\\) user; the workload "
                                            f"columns are request_id"):
        read_workload_file(tmp_path / "x.parquet")


def test_a_table_without_adapter_id_is_base_model_requests():
    """A table without ``adapter_id`` is base-model requests, as a file without the column (it was refused).
    (A prefix as long as the prompt and a rank on a base-model request stay accepted in memory: the offline
    replay and the FastLibra tests build such tables; the file readers refuse them.)"""
    base = {"arrival_s": [0.0, 1.0], "prompt_tokens": [10, 20], "output_tokens": [5, 5]}
    assert (Workload(pd.DataFrame(base)).df["adapter_id"] == -1).all()

@pytest.mark.parametrize("options", [{"rps": 10.0}, {"duration": 4.0}, {"adapters": 3}, {"ranks": [8]},
                                     {"window_start": 2.0, "duration": 10.0}])
def test_options_on_a_workload_file_keep_its_request_ids(tmp_path, options):
    """Rescaled, windowed or given new adapters, a file's requests keep the file's ids (they were numbered
    0, 1, 2 again, so the results no longer joined back to the file); a window records how many rows it kept."""
    path = tmp_path / "w.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens,request_id\n5,100,10,50\n1,200,10,10\n3,300,10,30\n")
    w = get_workload(str(path), **options)
    ids = w.df["request_id"].tolist()
    assert set(ids) <= {10, 30, 50} and ids == sorted(ids)  # (arrival order: 1 s, 3 s, 5 s)
    assert (w.meta["rows_kept"], w.meta["rows_in_file"]) == (len(ids), 3)


def test_a_window_of_a_workload_file_is_noted_by_twin_run(tmp_path, capsys):
    from twin.cli import main

    path = tmp_path / "w.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n5,100,10\n1,200,10\n3,300,10\n")
    assert main(["run", "--no-progress", "--trace", str(path), "--duration", "4"]) == 0
    assert "window keeps 2 of the 3 requests of" in capsys.readouterr().err
    assert main(["run", "--no-progress", "--trace", str(path), "--duration", "10"]) == 0
    assert "window keeps" not in capsys.readouterr().err


def test_a_run_s_per_request_results_are_named_as_such(tmp_path):
    """``twin run --out D`` then ``twin run --trace D/requests.parquet`` said "unknown column(s) outcome, ..."; the
    file is now named as a run's results, with the way to replay the run (its summary.json as --config)."""
    from twin.simulate import simulate
    from traces.workload import COLUMNS, RUN_RESULT_MARKERS

    res = simulate(Workload.from_arrays([0.0, 0.5], [20, 30], [4, 5], [0, 1], [8, 16]), "embedded")
    cols = set(res.requests.columns)
    assert RUN_RESULT_MARKERS <= cols and not RUN_RESULT_MARKERS & set(COLUMNS)  # (the twin's table, no workload's)
    res.requests.to_parquet(tmp_path / "requests.parquet", index=False)
    with pytest.raises(WorkloadError, match=r"a twin run's per-request results .* replay the run with its scenario, "
                                            r"`twin run --config .*summary\.json`"):
        Workload.load(tmp_path / "requests.parquet")
