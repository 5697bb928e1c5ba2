"""Loaders for every real format, on small files the tests write in each published schema."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from traces.loaders import TraceFormatError, detect_format, load_trace
from traces.loaders.conversations import Conversation, conversations_to_table
from traces.loaders.tokens import APPROX_NAME, approx_token_count, get_token_counter
from traces.samples import write_sample

FORMATS = ["azure-llm", "azure-functions-2019", "azure-functions-2021", "burstgpt", "sharegpt", "lmsys", "arena",
           "wildchat"]
SUFFIX = {"azure-llm": ".csv", "azure-functions-2019": ".csv", "azure-functions-2021": ".txt", "burstgpt": ".csv",
          "sharegpt": ".json", "lmsys": ".parquet", "arena": ".parquet", "wildchat": ".parquet"}


@pytest.mark.parametrize("fmt", FORMATS)
def test_detect_and_load_every_format(tmp_path, fmt):
    path = write_sample(fmt, tmp_path / f"sample{SUFFIX[fmt]}", n=60, seed=1)
    assert detect_format(path) == fmt
    tab = load_trace(path)
    assert len(tab) > 0 and tab.meta["format"] == fmt
    if tab.has_lengths:
        assert (tab.df["prompt_tokens"] >= 1).all() and (tab.df["output_tokens"] >= 1).all()
    if tab.has_timestamps and "conversation_id" not in tab.df:
        t = tab.df["arrival_s"].to_numpy()
        assert np.all(np.diff(t) >= 0)
        # per-minute counts keep their time of day; the other formats start at their first request
        assert t.min() >= 0.0 if fmt == "azure-functions-2019" else t.min() == 0.0


def test_azure_llm_columns(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n"
                    "2023-11-16 18:15:50.9951690,396,0\n2024-05-10 00:00:00.009930+00:00,5,5\n".replace(
                        "2024-05-10 00:00:00.009930+00:00", "2023-11-16 18:15:51.2224670"))
    tab = load_trace(path)
    assert tab.df["prompt_tokens"].tolist() == [374, 396, 5]
    assert tab.df["output_tokens"].tolist() == [44, 1, 5] and tab.meta["clipped_to_1"] == 1
    assert tab.df["arrival_s"].iloc[1] == pytest.approx(4.314579)


def test_azure_llm_2024_timestamps(tmp_path):
    path = tmp_path / "w.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-10 00:00:00.009930+00:00,10,2\n"
                    "2024-05-10 00:00:01.509930+00:00,20,3\n")
    assert load_trace(path).df["arrival_s"].tolist() == pytest.approx([0.0, 1.5])


def test_schema_error_names_file_and_columns(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("TIMESTAMP,ContextTokens\n2023-11-16 18:15:46,1\n")
    with pytest.raises(TraceFormatError, match=r"bad.csv.*GeneratedTokens"):
        load_trace(path, fmt="azure-llm")
    with pytest.raises(TraceFormatError, match="unrecognised trace format"):
        detect_format(path)


def test_non_numeric_tokens(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,abc,1\n")
    with pytest.raises(TraceFormatError, match="ContextTokens"):
        load_trace(path)


AZ = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
BG = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"


@pytest.mark.parametrize("text,fragment", [
    # a missing or infinite timestamp made every arrival NaN: the trace was re-timed with Poisson arrivals silently
    (AZ + "2023-11-16 18:00:00,374,44\n2023-11-16 18:30:00,100,10\n,100,10\n",
     "column 'TIMESTAMP' has a missing timestamp at data row 3 (empty); fix or drop the row"),
    (BG + "inf,ChatGPT,100,10,110,Conversation log\n", "column 'Timestamp' must be finite seconds (numbers); data row "
                                                        "1 (inf) is not"),
    # token counts: 1.5 was truncated to 1, 1e30 and inf became 1 token, 1e23 overflowed
    (AZ + "2023-11-16 18:15:46,100,44\n2023-11-16 18:15:47,1.5,10\n",
     "column 'ContextTokens' has a value that is not a whole token count in 0..2147483647 at data row 2 (1.5)"),
    (AZ + "2023-11-16 18:15:46,100,1e30\n", "column 'GeneratedTokens' has a value that is not a whole token count"),
    (AZ + "2023-11-16 18:15:46,100,inf\n", "column 'GeneratedTokens' has a value that is not a whole token count"),
    (AZ + "2023-11-16 18:15:46,99999999999999999999999,4\n", "at data row 1 (99999999999999999999999)"),
    (BG + "5,ChatGPT,100.7,10,110,Conversation log\n", "column 'Request tokens' has a value that is not a whole token"),
])
def test_a_corrupt_cell_of_a_raw_trace_is_refused_naming_its_row(tmp_path, text, fragment):
    p = tmp_path / "t.csv"
    p.write_text(text)
    with pytest.raises(TraceFormatError, match="fix or drop the row|whole token count") as e:
        load_trace(p)
    assert fragment in str(e.value)


def test_functions_2019_top_n_and_counts(tmp_path):
    path = write_sample("azure-functions-2019", tmp_path / "invocations_per_function_md.anon.d01.csv", n=100)
    raw = pd.read_csv(path)
    tot = raw[[str(m) for m in range(1, 1441)]].sum(axis=1).to_numpy()
    tab = load_trace(path, n_functions=3, rng=np.random.default_rng(0))
    assert len(tab) == int(np.sort(tot)[::-1][:3].sum())
    per_fn = tab.df["key"].value_counts()
    assert per_fn.iloc[0] == tot.max()
    # arrivals fall inside their minute
    tab2 = load_trace(path, n_functions=1, start_min=10, end_min=20)
    assert tab2.df["arrival_s"].between(600, 1200).all()
    # a directory of day files
    write_sample("azure-functions-2019", tmp_path / "invocations_per_function_md.anon.d02.csv", n=100, seed=3)
    tab3 = load_trace(tmp_path, n_functions=2, days=2)
    assert tab3.df["arrival_s"].max() > 86400


def test_functions_2021_arrival_is_end_minus_duration(tmp_path):
    path = tmp_path / "f.txt"
    path.write_text("app,func,end_timestamp,duration\na,x,10.5,0.5\na,x,12.0,3.0\nb,y,20.0,1.0\n")
    tab = load_trace(path, n_functions=1)
    assert tab.df["arrival_s"].tolist() == [0.0, 1.0]  # starts 9.0 and 10.0
    assert set(tab.df["key"]) == {"a/x"}


def test_burstgpt_drops_failed(tmp_path):
    path = tmp_path / "b.csv"
    path.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                    "5,ChatGPT,472,18,490,Conversation log\n7,GPT-4,100,0,100,API log\n9,ChatGPT,10,5,15,API log\n")
    tab = load_trace(path)
    assert len(tab) == 2 and tab.meta["failed"] == 1 and tab.df["arrival_s"].tolist() == [0.0, 4.0]
    assert len(load_trace(path, keep_failed=True)) == 3
    assert len(load_trace(path, log_type="API log")) == 1


def test_sharegpt_multi_turn_prefix(tmp_path):
    conv = [{"id": "a", "conversations": [
        {"from": "system", "value": "be nice"}, {"from": "human", "value": "x" * 40},
        {"from": "gpt", "value": "y" * 80}, {"from": "human", "value": "z" * 20}, {"from": "gpt", "value": "w" * 8},
        {"from": "human", "value": "dangling"}]},
        {"id": "b", "conversations": [{"from": "gpt", "value": "hello"}]}]
    path = tmp_path / "s.json"
    path.write_text(json.dumps(conv))
    tab = load_trace(path, tokenizer="approx")
    df = tab.df
    assert len(df) == 2 and tab.meta["tokenizer"] == APPROX_NAME and tab.meta["conversations"] == 1
    # turn 0: "be nice\n" + 40 x -> ceil(48/4) = 12 tokens; output 80/4 = 20
    assert df["prompt_tokens"].tolist()[0] == 12 and df["output_tokens"].tolist() == [20, 2]
    assert df["prefix_tokens"].tolist() == [0, 32] and df["prompt_tokens"].tolist()[1] == 32 + 5
    assert df["turn"].tolist() == [0, 1]
    first = load_trace(path, tokenizer="approx", turns="first")
    assert len(first) == 1


def test_wildchat_per_turn_timestamps(tmp_path):
    path = write_sample("wildchat", tmp_path / "w.parquet", n=30)
    tab = load_trace(path, tokenizer="approx")
    assert tab.meta["timestamps"] == "per-turn"
    df = tab.df
    later = df["turn"] > 0
    assert df["arrival_s"].notna().all()
    prev = df.shift(1)
    assert (df.loc[later, "arrival_s"] > prev.loc[later, "arrival_s"]).all()


def test_arena_sides(tmp_path):
    path = write_sample("arena", tmp_path / "a.parquet", n=20)
    a = load_trace(path, tokenizer="approx")
    both = load_trace(path, tokenizer="approx", side="both")
    assert both.meta["conversations"] == 2 * a.meta["conversations"]
    assert a.meta["timestamps"] == "per-conversation"


def test_lmsys_schema_error(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "l.parquet"
    pq.write_table(pa.Table.from_pydict({"conversation_id": ["a"], "conversation": [[{"role": "user",
                                                                                     "content": "hi"}]]}), path)
    with pytest.raises(TraceFormatError, match=r"missing columns \['model'\]"):
        load_trace(path, fmt="lmsys")


def test_token_counters():
    assert approx_token_count("") == 0
    assert approx_token_count("abcd") == 1 and approx_token_count("abcde") == 2
    assert approx_token_count("你好") == 2
    c = get_token_counter("approx")
    assert c.count(["abcdefgh", ""]).tolist() == [2, 0]
    assert get_token_counter("auto").name  # a real tokenizer if installed, else the approximation
    with pytest.raises(ValueError):
        get_token_counter("sentencepiece:x")


def test_conversations_to_table_no_turns():
    with pytest.raises(TraceFormatError):
        conversations_to_table([Conversation(None, None, [("user", "hi", None)])], "mem", "lmsys", "approx")


def test_a_jsonl_file_of_arrays_or_of_too_deep_objects_is_refused_by_name(tmp_path):
    """A .jsonl whose first line is an array was told it was 'a workload file inside a directory'; one nested
    100,000 levels deep raised RecursionError out of the workload sniffing (a traceback)."""
    from traces.registry import get_workload

    arr = tmp_path / "arr.jsonl"
    arr.write_text('[{"arrival_s": 0, "prompt_tokens": 1, "output_tokens": 1}]\n')
    with pytest.raises(ValueError, match="a JSON Lines file holds one JSON object per line, but its first line"):
        get_workload(str(arr))
    deep = tmp_path / "deep.jsonl"
    deep.write_text('{"a":' * 100000 + "1" + "}" * 100000 + "\n")
    with pytest.raises(ValueError, match="deep.jsonl: not a readable trace or workload file"):
        get_workload(str(deep))


def test_a_directory_of_single_file_traces_is_refused_naming_a_file(tmp_path):
    """A directory is read as one dataset's Parquet shards or the Azure Functions 2019 day files; a directory of
    Azure LLM CSVs failed as "[Errno 21] Is a directory", and one of ShareGPT JSON as "no .parquet files". Only the
    directory and the level below it are searched (a broad path walked the whole file tree)."""
    d = tmp_path / "d"
    d.mkdir()
    (d / "a.csv").write_text(AZ + "2023-11-16 18:15:46,100,44\n")
    with pytest.raises(TraceFormatError, match=r"holds azure-llm files \(e.g. .*a.csv\), which are read one file at a "
                                               r"time: give the file"):
        detect_format(d)
    deep = tmp_path / "x" / "y" / "z"
    deep.mkdir(parents=True)
    (deep / "a.csv").write_text(AZ + "2023-11-16 18:15:46,100,44\n")
    with pytest.raises(TraceFormatError, match="directory holds no trace files"):
        detect_format(tmp_path / "x")
