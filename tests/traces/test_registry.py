"""Named traces and ``get_workload``: every name loads, every option reaches the statistic it promises."""

from __future__ import annotations

import numpy as np
import pytest

from traces.adapters import top_k_share
from traces.arrivals import interarrival_cv, rate_profile
from traces.registry import BUILTINS, get_workload, list_traces, regenerate, seed_acts
from traces.samples import write_sample, write_sample_data_dir
from traces.workload import Workload


@pytest.fixture(scope="module")
def sample_dir(tmp_path_factory):
    return write_sample_data_dir(tmp_path_factory.mktemp("data"), n=120)


def test_synthetic_default():
    w = get_workload()
    df = w.df
    assert w.meta["source"] == "synthetic" and w.meta["seed"] == 0
    assert abs(len(df) / 300.0 - 1.0) < 0.2 and df["arrival_s"].max() < 300.0  # README "Defaults"
    assert df["adapter_id"].nunique() > 60 and set(df["adapter_rank"].unique()) == {8, 16, 32}
    assert 900 < df["prompt_tokens"].mean() < 1400          # Splitwise-like lengths (conv mean 1155)


def test_same_seed_same_workload_and_regenerate(tmp_path):
    a = get_workload("synthetic", rps=7.0, popularity="zipf:1.1", seed=3, lengths="sharegpt", mean_in=222)
    b = get_workload("synthetic", rps=7.0, popularity="zipf:1.1", seed=3, lengths="sharegpt", mean_in=222)
    assert a.df.equals(b.df)
    path = a.save(tmp_path / "w.parquet")
    loaded = Workload.load(path)
    assert loaded.meta["options"]["popularity"] == "zipf:1.1"
    assert regenerate(loaded.meta).df.equals(a.df)
    c = get_workload("synthetic", rps=7.0, popularity="zipf:1.1", seed=4, lengths="sharegpt", mean_in=222)
    assert not c.df["arrival_s"].equals(a.df["arrival_s"])


def test_seed_acts_on_a_workload_file_only_when_it_draws_adapters(tmp_path):
    """A saved workload is replayed as written: another seed changes it only when new adapters are drawn
    (which ``seed_acts`` says, so ``twin run --seed`` on such a file can be refused as having no effect)."""
    path = get_workload("synthetic", duration=20.0, seed=1).save(tmp_path / "w.parquet")
    assert not seed_acts(str(path)) and not seed_acts(str(path), options=["rps", "ranks", "duration"])
    assert get_workload(str(path), seed=5, rps=3.0).df.equals(get_workload(str(path), seed=6, rps=3.0).df)
    for opt in ("adapters", "popularity"):
        assert seed_acts(str(path), options=[opt])
    a, b = (get_workload(str(path), seed=s, adapters=40).df for s in (5, 6))
    assert not a["adapter_id"].equals(b["adapter_id"])
    assert seed_acts("synthetic") and seed_acts("synthetic", options=[])


def test_target_rps_within_tolerance():
    w = get_workload("synthetic", rps=50.0, duration=200.0)
    assert abs(len(w) / 200.0 - 50.0) / 50.0 < 0.03


def test_gamma_cv_from_options():
    w = get_workload("synthetic", arrival="gamma", cv=3.0, rps=20.0, duration=2000.0)
    assert abs(interarrival_cv(w.df["arrival_s"].to_numpy()) - 3.0) / 3.0 < 0.1


def test_onoff_from_options():
    w = get_workload("synthetic", arrival="onoff", rps=5.0, on_s=5.0, off_s=20.0, duration=3000.0)
    assert interarrival_cv(w.df["arrival_s"].to_numpy()) > 1.5


def test_zipf_top1_share_through_registry():
    w = get_workload("synthetic", adapters=50, popularity="zipf:1.0", rps=100.0, duration=400.0)
    expected = 1.0 / np.sum(1.0 / np.arange(1, 51))
    assert abs(top_k_share(w.df["adapter_id"].to_numpy(), 1) - expected) < 0.015


def test_adapter_twin_per_adapter_rates():
    w = get_workload("adapter-twin", adapters=30, duration=2000.0)
    rates = np.asarray(w.meta["arrivals_info"]["adapter_rates"])
    counts = np.bincount(w.df["adapter_id"], minlength=30)
    for r in (0.1, 0.05, 0.025):
        assert abs(counts[rates == r].sum() / (10 * 2000.0) - r) / r < 0.1
    assert set(w.df["adapter_rank"].unique()) == {8, 16, 32}
    df = w.df
    assert abs(df["prompt_tokens"].mean() - 222) / 222 < 0.02 and abs(df["output_tokens"].mean() - 196) / 196 < 0.02


def test_per_adapter_rps_scales_rates():
    w = get_workload("adapter-twin", adapters=30, rps=6.0, duration=1000.0)
    assert abs(len(w) / 1000.0 - 6.0) / 6.0 < 0.05


@pytest.mark.parametrize("name", [n for n, s in BUILTINS.items() if s.kind == "synthetic"])
def test_every_synthetic_name_loads(name):
    w = get_workload(name, duration=60.0)
    assert len(w) > 0 and w.meta["name"] == name
    assert w.df["arrival_s"].max() < 60.0


def test_splitwise_synth_matches_fitted_statistics():
    from traces.lengths import load_fitted

    fit = load_fitted("splitwise_conv_fit")
    w = get_workload("splitwise-synth")
    t = w.df["arrival_s"].to_numpy()
    assert abs(len(t) / 3600.0 - fit["arrivals"]["mean_rps"]) / fit["arrivals"]["mean_rps"] < 0.05
    assert abs(interarrival_cv(t) - fit["arrivals"]["raw_cv"]) < 0.1
    for col, key in (("prompt_tokens", "prompt"), ("output_tokens", "output")):
        assert abs(w.df[col].median() - fit["lengths"][key]["p50"]) / fit["lengths"][key]["p50"] < 0.05
    # the rate over time follows the fitted profile (2-minute bins of the first 58 minutes)
    got = rate_profile(t[t < 3480.0], 120.0, 3480.0)
    fitted = np.asarray(fit["arrivals"]["profile"][:58]).reshape(-1, 2).mean(axis=1)
    assert np.corrcoef(got, fitted)[0, 1] > 0.95 and np.abs(got - fitted).mean() < 0.06


def test_multiturn_synth_prefixes():
    w = get_workload("multiturn-synth", duration=600.0)
    df = w.df.sort_values(["conversation_id", "turn"]).reset_index(drop=True)
    prev = df.shift(1)
    # pairs whose previous turn is in the window (turns of conversations begun before t=0 may lack it)
    pair = (df["turn"] > 0) & (prev["conversation_id"] == df["conversation_id"]) & (prev["turn"] == df["turn"] - 1)
    assert pair.sum() > 200
    assert (df.loc[pair, "prefix_tokens"] == prev.loc[pair, "prompt_tokens"] + prev.loc[pair, "output_tokens"]).all()
    assert (df.loc[df["turn"] == 0, "prefix_tokens"] == 0).all()
    assert df.groupby("conversation_id")["adapter_id"].nunique().max() == 1
    assert abs(len(w) / 600.0 - 4.0) / 4.0 < 0.15


def test_length_options():
    w = get_workload("synthetic", length_scale=0.5, max_total=1024, max_prompt=900)
    df = w.df
    assert (df["prompt_tokens"] <= 900).all() and ((df["prompt_tokens"] + df["output_tokens"]) <= 1024).all()
    w2 = get_workload("synthetic", lengths="fixed:small")
    assert (w2.df["prompt_tokens"] == 23).all() and (w2.df["output_tokens"] == 27).all()


def test_unknown_name_lists_names():
    with pytest.raises(KeyError, match="splitwise-synth"):
        get_workload("no-such-trace")


def test_unknown_option():
    with pytest.raises(TypeError, match=r"unknown workload option 'colour'; valid: adapters, "):
        get_workload("synthetic", colour="red")


def test_missing_real_file_names_file_dir_and_fetch(tmp_path):
    with pytest.raises(FileNotFoundError) as e:
        get_workload("splitwise", data_dir=tmp_path)
    msg = str(e.value)
    assert "traces/AzureLLMInferenceTrace_conv.csv" in msg and str(tmp_path) in msg
    assert "twin traces fetch splitwise" in msg


def test_list_traces(sample_dir, tmp_path):
    rows = {r["name"]: r for r in list_traces(sample_dir)}
    assert {"splitwise", "splitwise-code", "azure-functions", "lmsys", "sharegpt", "wildchat", "burstgpt",
            "synthetic", "splitwise-synth"} <= set(rows)
    assert all(r["available"] for r in rows.values())
    empty = {r["name"]: r for r in list_traces(tmp_path)}
    assert not empty["splitwise"]["available"] and empty["synthetic"]["available"]
    assert empty["splitwise"]["fetch"] == "twin traces fetch splitwise"


@pytest.mark.parametrize("name", [n for n, s in BUILTINS.items() if s.kind == "real"])
def test_every_real_name_loads_from_sample_dir(sample_dir, name):
    text = BUILTINS[name].fmt in ("sharegpt", "lmsys", "arena", "wildchat")
    w = get_workload(name, data_dir=sample_dir, **({"tokenizer": "approx"} if text else {}))
    assert len(w) > 0 and w.meta["kind"] == "real" and w.meta["name"] == name
    assert (w.df["adapter_id"] >= 0).all()
    if BUILTINS[name].fmt in ("sharegpt", "lmsys", "arena", "wildchat"):
        assert w.meta["loader"]["tokenizer"]
        df = w.df.sort_values(["conversation_id", "turn"])
        assert df.groupby("conversation_id")["adapter_id"].nunique().max() == 1


def test_functions_map_top_n_to_adapters(sample_dir):
    w = get_workload("azure-functions", data_dir=sample_dir, adapters=3)
    counts = np.bincount(w.df["adapter_id"])
    assert counts.size == 3 and np.all(np.diff(counts) <= 0)        # adapter 0 = most invoked function
    assert w.meta["transform"]["adapter_keys"][0]


def test_replay_rescale_and_window(tmp_path):
    path = write_sample("azure-llm", tmp_path / "t.csv", n=2000, seed=5)
    base = get_workload(str(path))
    t0 = base.df["arrival_s"].to_numpy()
    w = get_workload(str(path), rps=20.0)
    t = w.df["arrival_s"].to_numpy()
    assert abs(len(t) / t.max() - 20.0) < 1e-6
    assert interarrival_cv(t) == pytest.approx(interarrival_cv(t0), rel=1e-9)
    np.testing.assert_allclose(rate_profile(t, t.max() / 10), rate_profile(t0, t0.max() / 10), atol=1e-9)
    win = get_workload(str(path), rps=20.0, duration=30.0, window_start=10.0)
    assert win.df["arrival_s"].max() < 30.0 and abs(len(win) - ((t >= 10) & (t < 40)).sum()) == 0
    # lengths kept, ranks from the options
    assert sorted(base.df["prompt_tokens"]) == sorted(w.df["prompt_tokens"])
    w3 = get_workload(str(path), adapters=10, ranks=[8, 16], popularity="distinct")
    assert w3.df["adapter_id"].nunique() == 10 and set(w3.df["adapter_rank"]) == {8, 16}


def test_real_trace_retimed_and_lengths_replaced(tmp_path):
    path = write_sample("azure-llm", tmp_path / "t.csv", n=3000, seed=6)
    w = get_workload(str(path), arrival="gamma", cv=2.5, rps=50.0, duration=60.0)  # (drawn for the window)
    assert w.df["arrival_s"].max() < 60.0 and abs(len(w) / 60.0 - 50.0) / 50.0 < 0.25
    assert abs(interarrival_cv(w.df["arrival_s"].to_numpy()) - 2.5) < 0.3
    w2 = get_workload(str(path), lengths="sharegpt", mean_in=222, mean_out=196)
    assert abs(w2.df["prompt_tokens"].mean() - 222) / 222 < 0.01
    w3 = get_workload(str(path), length_scale=0.5, max_total=1000)
    assert ((w3.df["prompt_tokens"] + w3.df["output_tokens"]) <= 1000).all() and len(w3) < 3000
    assert w3.meta["transform"]["dropped_by_length_filter"] == 3000 - len(w3)


def test_empirical_lengths_from_a_trace(tmp_path):
    path = write_sample("azure-llm", tmp_path / "t.csv", n=500, seed=7)
    src = get_workload(str(path))
    w = get_workload("synthetic", lengths=f"empirical:{path}")
    pairs = set(zip(src.df["prompt_tokens"], src.df["output_tokens"]))
    assert set(zip(w.df["prompt_tokens"], w.df["output_tokens"])) <= pairs


def test_saved_workload_path_rescale(tmp_path):
    w = get_workload("synthetic", rps=10.0)
    p = w.save(tmp_path / "w.parquet")
    same = get_workload(str(p))
    assert same.df.equals(w.df)
    fast = get_workload(str(p), rps=20.0)
    assert abs(len(fast) / fast.df["arrival_s"].max() - 20.0) < 1e-6
    assert fast.meta["derived_from"]["source"] == "synthetic"


def test_conversation_dataset_poisson_starts(sample_dir):
    w = get_workload("sharegpt", data_dir=sample_dir, tokenizer="approx", rps=6.0, duration=500.0)
    assert abs(len(w) / 500.0 - 6.0) / 6.0 < 0.2
    assert w.meta["transform"]["arrivals"]["process"] == "poisson"


# ----------------------------------------------------------------------------- real data (skip when absent)
@pytest.mark.data
def test_real_splitwise_conv(real_data):
    w = get_workload("splitwise", data_dir=real_data)
    assert len(w) == 19366
    assert w.duration_s == pytest.approx(3501.72, abs=0.05)
    assert interarrival_cv(w.df["arrival_s"].to_numpy()) == pytest.approx(1.094, abs=0.005)
    assert w.df["prompt_tokens"].mean() == pytest.approx(1154.70, abs=0.01)
    assert w.df["adapter_id"].nunique() == 100


@pytest.mark.data
def test_real_splitwise_code_rescaled(real_data):
    w = get_workload("splitwise-code", data_dir=real_data, rps=10.0, duration=300.0)
    base = get_workload("splitwise-code", data_dir=real_data)
    assert len(base) == 8819
    assert 0 < len(w) and w.df["arrival_s"].max() < 300.0
    full = get_workload("splitwise-code", data_dir=real_data, rps=10.0)
    t = full.df["arrival_s"].to_numpy()
    assert abs(len(t) / t.max() - 10.0) < 1e-6
    assert interarrival_cv(t) == pytest.approx(interarrival_cv(base.df["arrival_s"].to_numpy()), rel=1e-9)


def test_lognormal_fitted_on_a_trace_and_code_lengths(tmp_path):
    path = write_sample("azure-llm", tmp_path / "t.csv", n=800, seed=8)
    w = get_workload("synthetic", lengths=f"lognormal:{path}", mean_in=300.0, rps=40.0, duration=200.0)
    assert abs(w.df["prompt_tokens"].mean() - 300.0) / 300.0 < 0.1
    code = get_workload("synthetic", lengths="splitwise-code", rps=40.0, duration=100.0)
    assert code.df["output_tokens"].median() < 40          # the code trace's outputs are short (median 13)


def test_real_options_rejected_for_synthetic():
    with pytest.raises(TypeError, match="real traces"):
        get_workload("synthetic", window_start=5.0)


@pytest.mark.parametrize("kw, named", [
    ({"adapters": 2.5}, "adapters = 2.5: 2.5 is not a whole number"),   # was truncated to 2 adapters
    ({"adapters": True}, "adapters = True: True is a flag"),            # was taken as 1 adapter
    ({"n_requests": 2.5}, "n_requests = 2.5"),
    ({"max_total": 1e3 + 0.5}, "max_total = 1000.5"),
    ({"rps": True}, "rps = True: True is a flag"),
    ({"adapters": "many"}, "adapters = 'many'"),
    ({"seed": 1.5}, "seed = 1.5: 1.5 is not a whole number"),            # was seed 1
    ({"seed": "x"}, "seed = 'x'"),
])
def test_numeric_options_are_not_truncated(kw, named):
    with pytest.raises(ValueError) as e:
        get_workload("synthetic", duration=10, **kw)
    assert named in str(e.value)


def test_whole_numbers_given_as_floats_or_text_are_taken():
    a = get_workload("synthetic", duration=30, adapters=4.0, seed=2.0)
    b = get_workload("synthetic", duration=30, adapters="4", seed=np.int64(2))
    assert a.df.equals(b.df) and a.df["adapter_id"].max() < 4


def test_new_ranks_for_a_saved_workload_keep_its_adapters(tmp_path):
    """--ranks with a workload file drew every request's adapter again (default popularity, 100 adapters),
    silently discarding the file's popularity; now only the ranks change (cycled over the file's ids)."""
    w = get_workload("synthetic", duration=60, adapters=12, popularity="zipf:1.2", seed=4)
    p = w.save(tmp_path / "w.parquet")
    r = get_workload(str(p), ranks=[8, 64])
    assert r.df["adapter_id"].equals(w.df["adapter_id"])
    ids = r.df["adapter_id"].to_numpy()
    assert (r.df["adapter_rank"].to_numpy() == np.where(ids % 2 == 0, 8, 64)).all()
    new = get_workload(str(p), adapters=5)  # new adapters: drawn again, ranks the default
    assert new.df["adapter_id"].max() < 5 and set(new.df["adapter_rank"]) <= {8, 16, 32, 64, 128}
