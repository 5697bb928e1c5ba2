"""The metrics scrape's stall of the client-observed path (issue 17): twin/scrape_stall.py and its fit."""

from __future__ import annotations

import argparse

import numpy as np
import pytest

from tests.helpers import random_workload, real_run_row
from twin.config import EngineConfig
from twin.scrape_stall import (client_times, delay_past_stalls, label_times, merged_gaps, stall_windows,
                                step_end_times)
from twin.simulate import simulate
from twin.validation.specs import SCRAPE_S_PER_LABEL, spec_from_row


def test_label_times_count_new_waiting_running_pairs():
    """Adapter 0 arrives (waiting {0}), runs (running {0}), adapter 1 arrives and runs, both
    finish; the second round of adapter 0 repeats pairs already seen, so it adds none."""
    arrival = np.array([0.0, 2.0, 10.0])
    first = np.array([1.0, 3.0, 11.0])
    finish = np.array([5.0, 4.0, 12.0])
    adapter = np.array([0, 1, 0])
    t = label_times(arrival, first, finish, adapter, horizon=100.0)
    # pairs (waiting, running): t0 ({0},{}), t1 ({},{0}), t2 ({1},{0}), t3 ({},{0,1}), t4 ({},{0}) seen,
    # t5 ({},{}) new; t10 ({0},{}) seen, t11 ({},{0}) seen, t12 ({},{}) seen
    np.testing.assert_array_equal(t, [0.0, 1.0, 2.0, 3.0, 5.0])
    # requests without adapter and events after the horizon do not count
    t2 = label_times(arrival, first, finish, np.array([-1, 1, 0]), horizon=3.5)
    np.testing.assert_array_equal(t2, [2.0, 3.0])


def _label_times_plain(arrival, first_token, finish, adapter, horizon):
    """The plain walk over every event (what label_times computed before it walked the count
    changes alone): the reference of the test below."""
    n = len(arrival)
    has = (adapter >= 0) & (arrival <= horizon)
    ev = sorted((t[i], kind, int(adapter[i])) for kind, t in enumerate((arrival, first_token, finish))
                for i in range(n) if has[i] and np.isfinite(t[i]) and t[i] <= horizon)
    waiting: dict[int, int] = {}
    running: dict[int, int] = {}
    seen, new = set(), []
    i = 0
    while i < len(ev):
        t = ev[i][0]
        while i < len(ev) and ev[i][0] == t:
            _, kind, a = ev[i]
            if kind == 0:
                waiting[a] = waiting.get(a, 0) + 1
            elif kind == 1:
                waiting[a] -= 1
                running[a] = running.get(a, 0) + 1
            else:
                running[a] -= 1
            i += 1
        key = (frozenset(a for a, c in waiting.items() if c), frozenset(a for a, c in running.items() if c))
        if key not in seen:
            seen.add(key)
            new.append(t)
    return np.asarray(new, float)


@pytest.mark.parametrize("seed", range(12))
def test_label_times_equal_the_plain_walk_over_every_event(seed):
    """Random runs on a coarse clock (many events share an instant: arrivals, first tokens and
    finishes of one step), adapters and base-model requests, requests unfinished or past the horizon."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 400))
    arrival = np.round(rng.uniform(0, 50, n), 0 if seed % 2 else 1)
    first = arrival + np.round(rng.exponential(2.0, n), 0 if seed % 3 else 1)
    finish = first + np.round(rng.exponential(5.0, n), 0 if seed % 2 else 1)
    first[rng.random(n) < 0.1] = np.nan  # still waiting at the end
    finish[np.isnan(first) | (rng.random(n) < 0.1)] = np.nan
    adapter = rng.integers(-1, int(rng.integers(1, 80)), n)
    horizon = float(rng.choice([np.inf, 40.0, 25.5]))
    np.testing.assert_array_equal(label_times(arrival, first, finish, adapter, horizon),
                                  _label_times_plain(arrival, first, finish, adapter, horizon))
    assert len(label_times(arrival[:0], first[:0], finish[:0], adapter[:0], horizon)) == 0


def test_stall_windows_grow_with_the_series_seen():
    labels = np.array([0.5, 1.0, 1.5, 3.0])
    s, e = stall_windows(labels, s_per_label=0.1, period_s=2.0, until=7.0)
    # t=0: 0 series -> no stall; next at 2.0: 3 series -> 0.3 s; next at 4.3: 4 series -> 0.4 s; 6.7: 0.4 s
    np.testing.assert_allclose(s, [0.0, 2.0, 4.3, 6.7])
    np.testing.assert_allclose(e - s, [0.0, 0.3, 0.4, 0.4])
    moved = delay_past_stalls(np.array([1.9, 2.0, 2.1, 2.3, 4.5, np.nan]), s, e)
    np.testing.assert_allclose(moved, [1.9, 2.3, 2.3, 2.3, 4.7, np.nan])


def test_client_times_move_arrivals_and_tokens_past_stalls():
    """A request arriving inside a stall enters at its end (its engine timeline moves with it);
    a first token inside a stall reaches the client at the stall's end; then the front-end latency."""
    # adapters 0..8 one after the other: 3 new series for the first, 2 for each next one, 19 before
    # 2.0 s -> the scrape at 2.0 s stalls 19 x 0.05 = 0.95 s; 2 more series at 2.1 and 2.11 s
    # (adapter 1 still waiting), so the scrapes at 4.95 and 8.0 s stall 1.05 s each
    arrival = np.concatenate([np.arange(9) * 0.1 + 0.05, [2.1, 1.8, 9.5]])
    first = arrival + 0.01
    first[10] = 2.2  # its first token falls into the stall [2.0, 2.95)
    finish = first + 0.02
    adapter = np.concatenate([np.arange(9), [0, 1, 2]])
    ft, fn, stats = client_times(arrival, first, finish, adapter, 10.0, 0.005, 0.05, 2.0)
    assert stats["scrape_label_series"] == 21 and stats["scrape_stall_max_ms"] == pytest.approx(1050)
    assert ft[9] == pytest.approx(2.95 + 0.01 + 0.005)  # arrived at 2.1, in the stall: enters at 2.95
    assert fn[9] == pytest.approx(2.95 + 0.03 + 0.005)
    assert ft[10] == pytest.approx(2.95 + 0.005)       # first token at 2.2 held until 2.95
    assert fn[10] == pytest.approx(2.95 + 0.005)       # its finish (2.22) too
    assert ft[11] == pytest.approx(9.51 + 0.005)       # outside every stall: only the front end
    np.testing.assert_allclose(ft[:9], first[:9] + 0.005)
    ft0, fn0, st0 = client_times(arrival, first, finish, adapter, 10.0, 0.005, 0.0, 2.0)
    np.testing.assert_array_equal(ft0, first + 0.005)
    np.testing.assert_array_equal(fn0, finish + 0.005)
    assert st0 == {}


def _pair(s_per_label: float):
    w = random_workload(n=400, rps=4.0, adapters=40, seed=7, max_prompt=600, max_out=120)
    cfg = EngineConfig(max_loras=40, max_cpu_loras=40)
    a = simulate(w, None, cfg, frontend_s=0.0075)
    b = simulate(w, None, cfg, frontend_s=0.0075, scrape_s_per_label=s_per_label)
    return a, b


def test_the_stall_lengthens_ttft_and_leaves_the_engine_alone():
    a, b = _pair(3e-4)
    sa, sb = a.summary, b.summary
    for k in ("engine_steps", "requests_finished", "preemptions", "adapter_loads", "total_tok_s"):
        assert sa[k] == sb[k]
    assert sb["scrape_us_per_label"] == pytest.approx(300.0) and "scrape_us_per_label" not in sa
    assert sb["scrape_label_series"] > 100 and sb["scrape_stall_max_ms"] > 20
    ra, rb = a.requests, b.requests
    fin = (ra["outcome"] == "finished").to_numpy()
    d = (rb["ttft_s"] - ra["ttft_s"]).to_numpy()[fin]
    assert (d >= -1e-12).all() and (d > 1e-4).sum() > 5
    assert sb["ttft_ms_p99"] > sa["ttft_ms_p99"] and sb["ttft_ms_mean"] > sa["ttft_ms_mean"]
    np.testing.assert_allclose(rb["ttft_s"], rb["first_token_s"] - rb["arrival_s"], atol=1e-12)


def test_zero_stall_is_the_run_without_it_exactly():
    a, b = _pair(0.0)
    assert a.summary == {**b.summary, "wall_s": a.summary["wall_s"], "x_realtime": a.summary["x_realtime"]}


@pytest.mark.parametrize("kw", [dict(scrape_s_per_label=-1e-6), dict(scrape_s_per_label=float("nan")),
                                dict(scrape_s_per_label=float("inf")), dict(scrape_period_s=0.0),
                                dict(scrape_period_s=float("nan"))])
def test_bad_scrape_settings_are_refused(kw):
    with pytest.raises(ValueError, match="scrape_"):
        simulate(random_workload(n=5, seed=1), None, EngineConfig(max_loras=4), **kw)


def test_spec_and_cli_carry_the_constant():
    from twin.validation.cli import check_args, register_cli

    row = real_run_row()
    assert spec_from_row(row).scrape_s_per_label == SCRAPE_S_PER_LABEL
    assert spec_from_row(row, scrape_s_per_label=0.0).scrape_s_per_label == 0.0
    assert 1e-6 < SCRAPE_S_PER_LABEL < 1e-4  # microseconds per series written
    parser = argparse.ArgumentParser(prog="twin")
    register_cli(parser.add_subparsers(dest="command"))
    assert parser.parse_args(["validate"]).scrape_us == pytest.approx(SCRAPE_S_PER_LABEL * 1e6)
    for bad in ("-1", "nan"):
        with pytest.raises(ValueError, match="--scrape-us"):
            check_args(parser.parse_args(["validate", "--scrape-us", bad]))
    check_args(parser.parse_args(["validate", "--scrape-us", "0"]))


@pytest.mark.data
def test_fit_runs_are_fit_split_runs_without_a_queue(real_data):
    from twin.validation.scrape_stall import scrape_fit_runs
    from twin.validation.specs import load_real

    real = load_real(real_data / "validation" / "vllm085_h100_llama31_8b.csv")
    runs = scrape_fit_runs(real)
    assert len(runs) == 18
    assert set(runs["source"]) == {"dt_modelling"} and (runs["ts_max_waiting"] == 0).all()
    assert sorted(set(runs["served_adapters"])) == [8, 16, 32, 64, 128]
    # the ml_test rows do not change the selection
    assert scrape_fit_runs(real[real["source"] == "dt_modelling"])["run_id"].tolist() == runs["run_id"].tolist()


def _merged_brute(ft, fn, shift, starts, ends, step_end, outputs, chunk_size=128):
    """One request at a time, one token at a time: a token emitted at a step end inside a stall
    (in the request's shifted time) at a step of at most ``chunk_size`` outputs joins that stall's
    chunk; every other token is a chunk of its own. Merged gaps = tokens - chunks."""
    lost = np.zeros(len(ft), np.int64)
    for r in range(len(ft)):
        if not (np.isfinite(ft[r]) and np.isfinite(fn[r])):
            continue
        keys = []
        for t, o in zip(step_end, outputs):
            if not ft[r] <= t <= fn[r]:
                continue
            tc = t + shift[r]
            k = [i for i in range(len(starts)) if starts[i] <= tc < ends[i]]
            keys.append(("stall", k[0]) if k and o <= chunk_size else ("token", t))
        lost[r] = len(keys) - len(set(keys))
    return lost


@pytest.mark.parametrize("seed", range(6))
def test_merged_gaps_equal_token_by_token_delivery(seed):
    rng = np.random.default_rng(seed)
    step_end = np.cumsum(rng.uniform(0.01, 0.08, 400))
    outputs = rng.choice([3, 60, 128, 129, 300], size=len(step_end), p=[0.3, 0.3, 0.1, 0.1, 0.2])
    starts = np.sort(rng.uniform(0, step_end[-1], 6))
    ends = starts + rng.uniform(0.0, 0.5, 6)
    ends = np.minimum(ends, np.append(starts[1:], np.inf))  # windows do not overlap
    n = 60
    i0 = rng.integers(0, len(step_end) - 1, n)
    i1 = np.minimum(i0 + rng.integers(0, 80, n), len(step_end) - 1)
    ft, fn = step_end[i0].copy(), step_end[i1].copy()
    ft[:3] = np.nan  # never got a first token / never finished
    fn[3:5] = np.nan
    shift = np.where(rng.random(n) < 0.3, rng.uniform(0, 0.3, n), 0.0)
    got = merged_gaps(ft, fn, shift, starts, ends, step_end, outputs)
    np.testing.assert_array_equal(got, _merged_brute(ft, fn, shift, starts, ends, step_end, outputs))
    assert got.sum() > 0
    # steps with more than 128 outputs: the output handler yields between slices, nothing merges
    assert not merged_gaps(ft, fn, shift, starts, ends, step_end, np.full(len(step_end), 129)).any()
    assert not merged_gaps(ft, fn, None, np.zeros(0), np.zeros(0), step_end, outputs).any()


def test_step_end_times_keep_each_segments_end_exactly():
    t0 = np.array([0.0, 0.1, 0.35])
    t1 = np.array([0.1, 0.35, 0.36])
    k = np.array([1, 3, 1])
    e = step_end_times(t0, t1, k)
    np.testing.assert_allclose(e, [0.1, 0.1 + 0.25 / 3, 0.1 + 0.5 / 3, 0.35, 0.36])
    assert e[3] == t1[1] and e[4] == t1[2]


def test_merged_chunks_raise_the_clients_mean_itl_only():
    """The stall merges chunks: the client's mean ITL = sum(E2E - TTFT) / (gaps - merged); the
    engine, the TPOT and the ITL percentiles are those of the run without merging; the steps'
    rows are not needed (segments kept when the rows are off)."""
    a, b = _pair(2e-4)
    sa, sb = a.summary, b.summary
    assert "itl_merged_gap_share" not in sa and 0.0 < sb["itl_merged_gap_share"] < 0.5
    assert sb["itl_ms_mean"] > sa["itl_ms_mean"]
    rq = b.requests
    fin = (rq["outcome"] == "finished") & (rq["output_tokens"] > 1)
    gaps = float((rq.loc[fin, "e2e_s"] - rq.loc[fin, "ttft_s"]).sum())
    n = float((rq.loc[fin, "output_tokens"] - 1).sum())
    assert sb["itl_ms_mean"] == pytest.approx(gaps / (n * (1 - sb["itl_merged_gap_share"])) * 1000, rel=1e-9)
    for k in ("itl_ms_p50", "itl_ms_p99", "engine_steps"):
        assert sa[k] == sb[k]
    w = random_workload(n=400, rps=4.0, adapters=40, seed=7, max_prompt=600, max_out=120)
    c = simulate(w, None, EngineConfig(max_loras=40, max_cpu_loras=40), frontend_s=0.0075, scrape_s_per_label=2e-4,
                 record_steps=False)
    assert c.summary["itl_ms_mean"] == sb["itl_ms_mean"]
    assert c.summary["itl_merged_gap_share"] == sb["itl_merged_gap_share"]


def test_itl_over_tpot_diagnostic_bins_runs_by_running_and_served():
    import pandas as pd

    from twin.validation.diagnostics import itl_over_tpot

    runs = pd.DataFrame({"real_itl": [11.0, 10.0, 20.0, 30.0], "real_tpot": [10.0, 10.0, 20.0, 31.0],
                         "twin_itl": [10.5, 10.0, 21.0, 30.0], "twin_tpot": [10.0, 10.0, 20.0, 30.0],
                         "served_adapters": [192, 8, 200, 300], "ts_mean_running": [50.0, 5.0, 100.0, 400.0]})
    out = itl_over_tpot(runs)
    few = out["running <= 128"]
    assert few["served 1-16"] == {"runs": 1, "real_median": 1.0, "twin_median": 1.0}
    assert few["served > 128"] == {"runs": 2, "real_median": 1.05, "twin_median": 1.05}
    assert out["running > 128"]["served > 128"]["real_median"] == pytest.approx(30 / 31, abs=1e-4)
    assert itl_over_tpot(runs.drop(columns=["twin_tpot"])) == {}


def test_itl_over_tpot_figure_is_written(tmp_path):
    import pandas as pd

    from twin.validation.figures import itl_over_tpot

    runs = pd.DataFrame({"real_itl": [11.0, 10.0, 30.0], "real_tpot": [10.0, 10.0, 31.0],
                         "twin_itl": [10.5, 10.0, 30.0], "twin_tpot": [10.0, 10.0, 30.0],
                         "served_adapters": [192, 8, 300], "ts_mean_running": [50.0, 5.0, 400.0]})
    p = itl_over_tpot(runs, tmp_path)
    assert p.name == "itl_over_tpot.png" and p.stat().st_size > 1000
