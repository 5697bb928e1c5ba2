"""Re-timing, missing timestamps, saved multi-turn workloads, ``n_requests`` of conversations,
``adapters_from=key`` and the fitted rate profile under conversations (``traces.registry``,
``traces.synth``): each test names the defect it pins."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from traces.conversations import ConversationConfig
from traces.loaders import load_burstgpt
from traces.loaders.base import TraceTable
from traces.registry import (BUILTINS, OptionError, _table_to_workload, check_size, expected_requests,
                             get_workload)
from traces.samples import write_sample, write_sample_data_dir
from traces.synth import OPTIONS, ArrivalConfig, SynthConfig, align_warmup, generate_arrivals
from traces.workload import WorkloadError


@pytest.fixture(scope="module")
def sample_dir(tmp_path_factory):
    return write_sample_data_dir(tmp_path_factory.mktemp("data"), n=200)


def _pairs(w) -> Counter:
    return Counter(zip(w.df["prompt_tokens"], w.df["output_tokens"]))


# ----------------------------------------------------------------------------- re-timed single requests: the window
def test_retimed_single_requests_cover_the_duration_window(tmp_path):
    """arrival=poisson draws arrivals from 0 s for --duration seconds at --rps (it drew one per request of
    the trace, whatever the duration: 19,366 over 9,590 s for splitwise at rps=2, duration=60)."""
    path = write_sample("azure-llm", tmp_path / "t.csv", n=500, seed=3)
    trace = get_workload(str(path))
    w = get_workload(str(path), arrival="poisson", rps=2.0, duration=60.0)
    t = w.df["arrival_s"].to_numpy()
    assert t.min() >= 0 and t.max() < 60.0
    assert 80 <= len(w) <= 160  # Poisson(120)
    arr = w.meta["transform"]["arrivals"]
    assert arr["process"] == "poisson" and arr["rps"] == 2.0 and "reused_requests" not in arr
    # each arrival takes a distinct request of the trace (its lengths), in a seeded order
    assert not (_pairs(w) - _pairs(trace))
    again = get_workload(str(path), arrival="poisson", rps=2.0, duration=60.0)
    assert again.df.equals(w.df)
    other = get_workload(str(path), arrival="poisson", rps=2.0, duration=60.0, seed=1)
    assert not other.df["prompt_tokens"].equals(w.df["prompt_tokens"])


def test_retimed_window_longer_than_the_trace_reuses_requests(tmp_path):
    path = write_sample("azure-llm", tmp_path / "t.csv", n=100, seed=4)
    trace = get_workload(str(path))
    w = get_workload(str(path), arrival="gamma", rps=10.0, duration=60.0)
    assert w.df["arrival_s"].max() < 60.0 and len(w) > 300
    assert w.meta["transform"]["arrivals"]["reused_requests"] is True
    assert set(_pairs(w)) <= set(_pairs(trace))


def test_retimed_default_rate_and_window(tmp_path):
    """Without --rps and --duration: 4 req/s for 300 s (the registry's documented defaults)."""
    path = write_sample("azure-llm", tmp_path / "t.csv", n=300, seed=5)
    w = get_workload(str(path), arrival="poisson")
    assert w.df["arrival_s"].max() < 300.0 and abs(len(w) / 300.0 - 4.0) / 4.0 < 0.15


def test_retimed_with_an_unsupported_process_is_refused_before_reading(tmp_path):
    path = write_sample("azure-llm", tmp_path / "t.csv", n=50, seed=5)
    with pytest.raises(OptionError, match="re-timing a trace supports arrival=poisson or gamma"):
        get_workload(str(path), arrival="onoff")


def test_retimed_size_is_checked_before_drawing(tmp_path):
    path = write_sample("azure-llm", tmp_path / "t.csv", n=50, seed=5)
    with pytest.raises(OptionError, match="more than the 5,000,000"):
        get_workload(str(path), arrival="poisson", rps=1000.0, duration=1e5)


@pytest.mark.data
def test_run_splitwise_retimed_keeps_the_run_window(real_data):
    """``twin run --trace splitwise --trace-opt arrival=poisson``: its 600 s at 2.2 req/s (README 'Defaults')."""
    from twin.scenario import RunConfig, build_workload

    w = build_workload(RunConfig(trace="splitwise", trace_options=[("arrival", "poisson")]))
    assert w.df["arrival_s"].max() < 600.0 and abs(len(w) / 600.0 - 2.2) / 2.2 < 0.1


# ----------------------------------------------------------------------------- partly missing timestamps
def _arena_with_missing(d, rows: list[int]) -> None:
    f = next((d / BUILTINS["chatbot-arena"].file).rglob("*.parquet"))
    tab = pq.read_table(f).to_pydict()
    for r in rows:
        tab["tstamp"][r] = None
    pq.write_table(pa.Table.from_pydict(tab), f)


def test_partly_missing_conversation_starts_are_refused_naming_them(tmp_path):
    """One missing Arena tstamp replaced every recorded time by Poisson arrivals (4 req/s, 300 s, conversations
    reused, window_start ignored) without a word."""
    d = write_sample_data_dir(tmp_path / "data", n=120)
    intact = get_workload("chatbot-arena", data_dir=d, tokenizer="approx")
    assert "arrivals" not in intact.meta["transform"]
    _arena_with_missing(d, [5, 17])
    with pytest.raises(WorkloadError, match=r"2 of the 120 conversations .* no timestamp .*conversations 5, 17 "
                                            r".*drop those conversations.*arrival=poisson"):
        get_workload("chatbot-arena", data_dir=d, tokenizer="approx")
    with pytest.raises(WorkloadError, match="conversations 5, 17"):
        get_workload("chatbot-arena", data_dir=d, tokenizer="approx", window_start=100.0, duration=50.0)
    # re-timed explicitly: its starts are drawn, as asked
    w = get_workload("chatbot-arena", data_dir=d, tokenizer="approx", arrival="poisson", rps=2.0, duration=100.0)
    assert w.meta["transform"]["arrivals"]["process"] == "poisson" and w.df["arrival_s"].max() < 100.0


def test_a_timed_dataset_without_any_timestamp_is_refused(tmp_path):
    d = write_sample_data_dir(tmp_path / "data", n=30)
    _arena_with_missing(d, list(range(30)))
    with pytest.raises(WorkloadError, match="no conversation of this arena trace has a timestamp.*arrival=poisson"):
        get_workload("chatbot-arena", data_dir=d, tokenizer="approx")


def test_untimed_datasets_still_get_drawn_starts(sample_dir):
    for name in ("sharegpt", "lmsys"):
        w = get_workload(name, data_dir=sample_dir, tokenizer="approx", rps=3.0, duration=200.0)
        assert w.meta["transform"]["arrivals"]["process"] == "poisson"
        assert w.df["arrival_s"].min() >= 0 and w.df["arrival_s"].max() < 200.0


def test_partly_missing_request_times_are_refused_naming_the_rows():
    df = pd.DataFrame({"arrival_s": [0.0, np.nan, 2.0, np.nan, 4.0], "prompt_tokens": [10] * 5,
                       "output_tokens": [5] * 5})
    table = TraceTable(df, {"format": "azure-llm", "path": "t.csv"})
    cfg = SynthConfig(arrivals=ArrivalConfig(rps=None))
    cfg.lengths.dist = "trace"
    with pytest.raises(WorkloadError, match=r"t.csv: 2 of the 5 requests .* rows 2, 4 .*arrival=poisson"):
        _table_to_workload(table, cfg, {}, {}, None)


# ----------------------------------------------------------------------------- saved multi-turn workloads
def test_new_adapters_on_a_saved_multiturn_workload_keep_one_per_conversation(tmp_path):
    """New adapters were drawn per request, so a conversation's later turns reused KV history of another LoRA."""
    w = get_workload("multiturn-synth", duration=300.0)
    path = w.save(tmp_path / "w.parquet")

    def split(x) -> int:
        df = x.df[x.df["conversation_id"] >= 0]
        return int((df.groupby("conversation_id")["adapter_id"].nunique() > 1).sum())

    assert split(w) == 0
    for opts in ({"adapters": 10}, {"popularity": "uniform"}, {"adapters": 7, "popularity": "zipf:1.0"}):
        re = get_workload(str(path), **opts)
        assert split(re) == 0, opts
        assert re.df["adapter_id"].nunique() > 1
        assert (re.df["prefix_tokens"] == w.df["prefix_tokens"]).all()
    assert get_workload(str(path), adapters=10).df.equals(get_workload(str(path), adapters=10).df)


def test_new_adapters_on_a_saved_single_request_workload_are_drawn_per_request(tmp_path):
    w = get_workload("synthetic", duration=120.0)
    re = get_workload(str(w.save(tmp_path / "w.parquet")), adapters=5)
    assert set(re.df["adapter_id"]) == set(range(5))


# ----------------------------------------------------------------------------- n_requests of conversations
def test_n_requests_of_conversations_counts_their_turns_in_the_size_check():
    """n_requests counts conversations there; the size check counted them as requests (38 M requests passed)."""
    cfg = SynthConfig(arrivals=ArrivalConfig(n_requests=1000),
                      conversations=ConversationConfig(enabled=True, mean_turns=3.0))
    assert expected_requests(cfg) == pytest.approx(1000 * cfg.conversations.expected_turns())
    big = SynthConfig(arrivals=ArrivalConfig(n_requests=4_000_000),
                      conversations=ConversationConfig(enabled=True, mean_turns=10.0, max_turns=30))
    with pytest.raises(OptionError, match=r"n_requests=4000000 counts conversations, of 9.\d+ turns each"):
        check_size(big, "x")
    with pytest.raises(OptionError, match="counts conversations"):
        get_workload("multiturn-synth", n_requests=4_000_000, mean_turns=10.0, max_turns=30)
    plain = SynthConfig(arrivals=ArrivalConfig(n_requests=4_000_000))
    check_size(plain, "x")  # (single requests: n_requests requests)
    assert "conversations" in OPTIONS["n_requests"][3]


def test_n_requests_of_a_replayed_dataset_counts_its_turns(sample_dir):
    w = get_workload("sharegpt", data_dir=sample_dir, tokenizer="approx", arrival="poisson", n_requests=50)
    assert w.df["conversation_id"].nunique() == 50 and len(w) > 50
    with pytest.raises(OptionError, match="counts conversations"):
        get_workload("sharegpt", data_dir=sample_dir, tokenizer="approx", arrival="poisson", n_requests=4_000_000)


# ----------------------------------------------------------------------------- adapters_from=key
def test_adapters_from_key_drops_before_rescaling_and_records_it(sample_dir):
    """The requests of unmapped keys were dropped after --rps: 227 of 298 rows at 0.765 req/s, nothing recorded."""
    full = get_workload("burstgpt", data_dir=sample_dir)
    n_top = int(load_burstgpt(sample_dir / BUILTINS["burstgpt"].file).df["key"].value_counts().iloc[0])
    w = get_workload("burstgpt", data_dir=sample_dir, adapters_from="key", adapters=1, rps=1.0)
    t = w.df["arrival_s"].to_numpy()
    assert len(w) == n_top < len(full)
    assert len(t) / (t.max() - t.min()) == pytest.approx(1.0, rel=1e-9)
    tr = w.meta["transform"]
    assert tr["dropped_by_adapters_from_key"] == len(full) - n_top
    assert "adapters=1" in tr["adapters_from_key_reason"] and tr["adapter_keys"] == ["ChatGPT"]
    assert set(w.df["adapter_id"]) == {0}
    # nothing dropped: counted as 0
    both = get_workload("burstgpt", data_dir=sample_dir, adapters_from="key", adapters=2)
    assert both.meta["transform"]["dropped_by_adapters_from_key"] == 0 and len(both) == len(full)


def test_adapters_from_key_with_no_adapter_is_refused(sample_dir):
    with pytest.raises(ValueError, match="adapters_from=key with adapters=0 .* give adapters >= 1"):
        get_workload("burstgpt", data_dir=sample_dir, adapters_from="key", adapters=0)


# ----------------------------------------------------------------------------- fitted profile under conversations
def _profile_lag0_corr(w, fit) -> float:
    t = w.df.loc[w.df["turn"] <= 0, "arrival_s"].to_numpy()
    prof = np.asarray(fit["arrivals"]["profile"][:58])
    counts = np.bincount((t[t < 58 * 60.0] // 60.0).astype(int), minlength=58)[:58]
    return float(np.corrcoef(counts, prof)[0, 1])


def test_fitted_profile_starts_at_the_window_with_conversations():
    """With conversations the fitted profile started at -warm-up (750 s early): correlation -0.03 at lag 0."""
    from traces.lengths import load_fitted

    fit = load_fitted("splitwise_conv_fit")
    plain = get_workload("splitwise-synth")
    conv = get_workload("splitwise-synth", conversations=True, mean_turns=1.0)
    assert _profile_lag0_corr(plain, fit) > 0.95
    assert _profile_lag0_corr(conv, fit) > 0.95
    # (the warm-up, 750 s, is no whole number of the fit's 60 s bins: the profile starts at an offset, not rotated)
    assert conv.meta["arrivals_info"]["profile_starts_at_s"] == ConversationConfig(enabled=True).warmup_s() == 750.0


def test_align_warmup_keeps_fitted_warmups_as_they_are():
    """The profile used to be rotated by whole bins, so the warm-up was rounded up to them (750 -> 780 s); a start
    offset into the periodic profile (traces.test_fitted_period) takes any warm-up."""
    fitted = ArrivalConfig(process="fitted", fit="splitwise_conv_fit", rps=None)
    assert align_warmup(fitted, 750.0) == 750.0 and align_warmup(fitted, 0.0) == 0.0
    assert align_warmup(ArrivalConfig(), 750.0) == 750.0
    t, _, info = generate_arrivals(ArrivalConfig(process="fitted", fit="splitwise_conv_fit", rps=None,
                                                 duration_s=100.0), 1, np.random.default_rng(0), lead_s=30.0)
    assert info["profile_starts_at_s"] == 30.0 and t.size and t.max() < 100.0
    # without a warm-up the draw is unchanged
    a = ArrivalConfig(process="fitted", fit="splitwise_conv_fit", rps=None, duration_s=600.0)
    t0, _, _ = generate_arrivals(a, 1, np.random.default_rng(0))
    t1, _, _ = generate_arrivals(a, 1, np.random.default_rng(0), lead_s=0.0)
    np.testing.assert_array_equal(t0, t1)
