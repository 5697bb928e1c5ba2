"""Optimum labels: the published throughput90 rule, robust, slo; reproduced on the real ml_test runs."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from twin.configurator.labels import features_of, label_scenarios, real_optima, slot_candidates


def _runs(spec, scenario="s", offered_per_adapter=100.0):
    """spec: {slots: [(served, throughput_ratio or None for a failed run, status)]}"""
    rows = []
    for g, runs in spec.items():
        for n, ratio, *status in runs:
            off = offered_per_adapter * n
            st = status[0] if status else "ok"
            rows.append({"scenario": scenario, "adapter_slots": g, "served_adapters": n, "status": st,
                         "offered_tok_s": off, "total_tok_s": (ratio * off) if ratio is not None else math.nan,
                         "slo_attainment": 1.0 - 0.1 * n / 64, "early_stop": False})
    return pd.DataFrame(rows)


def test_walk_keeps_last_passing_and_stops_at_first_failure():
    df = _runs({16: [(16, 1.0), (32, 0.95), (64, 0.8), (96, 0.95)]})
    c = slot_candidates(df)
    assert int(c.iloc[0]["served_adapters"]) == 32  # 96 passes again but the walk stopped at 64
    assert c.iloc[0]["next_ratio"] == pytest.approx(0.8)


def test_first_failure_is_kept():
    df = _runs({16: [(16, 0.5), (32, 0.3)], 32: [(32, 0.4)]})
    lab = label_scenarios(df)
    # both slot values start starving; the higher throughput candidate wins: 16 slots at 16 -> 800, 32 at 32 -> 1280
    assert (lab.iloc[0]["served_adapters"], lab.iloc[0]["adapter_slots"]) == (32, 32)
    assert lab.iloc[0]["margin"] == pytest.approx(0.4 - 0.9)


def test_failed_runs_are_skipped_and_highest_throughput_wins():
    df = _runs({16: [(16, 1.0), (32, None, "failed_port_in_use"), (64, 0.91), (96, 0.5)],
                32: [(32, 1.0), (64, 0.99), (96, 0.7)]})
    lab = label_scenarios(df)
    assert (lab.iloc[0]["served_adapters"], lab.iloc[0]["adapter_slots"]) == (64, 32)  # 0.99*6400 > 0.91*6400


def test_robust_prefers_fewer_slots_within_tolerance():
    df = _runs({16: [(16, 1.0), (64, 0.995), (96, 0.6)], 32: [(32, 1.0), (64, 1.0), (96, 0.5)]})
    assert label_scenarios(df, "throughput90").iloc[0]["adapter_slots"] == 32
    assert label_scenarios(df, "robust").iloc[0]["adapter_slots"] == 16


def test_slo_rule():
    df = _runs({16: [(16, 1.0), (32, 1.0), (64, 0.95)]})
    lab = label_scenarios(df, "slo", slo_share=0.7)  # attainment 1 - 0.1 n / 64: 64 -> 0.9, all >= 0.7
    assert lab.iloc[0]["served_adapters"] == 64
    lab = label_scenarios(df, "slo", slo_share=0.96)  # only 16 (0.975)
    assert lab.iloc[0]["served_adapters"] == 16


def test_slo_rule_with_percentile_slos():
    """Without attainment (a sweep with no [slo]), percentile SLOs on the stored P99s decide; each
    limit binds on its own, and a starving run never qualifies however low its percentiles."""
    df = _runs({16: [(16, 1.0), (32, 1.0), (64, 0.95), (96, 0.5)]})
    df["slo_attainment"] = math.nan
    df["ttft_ms_p99"] = [200.0, 900.0, 4000.0, 100.0]
    df["itl_ms_p99"] = [40.0, 60.0, 90.0, 20.0]
    df["starving"] = [False, False, False, True]
    assert label_scenarios(df, "slo", ttft_p99_s=5.0).iloc[0]["served_adapters"] == 64
    assert label_scenarios(df, "slo", ttft_p99_s=1.0).iloc[0]["served_adapters"] == 32
    assert label_scenarios(df, "slo", ttft_p99_s=5.0, itl_p99_s=0.05).iloc[0]["served_adapters"] == 16
    assert label_scenarios(df, "slo", itl_p99_s=0.01).empty  # no run meets it: no label


def test_slo_rule_errors_name_the_fix():
    df = _runs({16: [(16, 1.0)]})
    df["slo_attainment"] = math.nan
    with pytest.raises(ValueError, match="--ttft-p99-s"):
        label_scenarios(df, "slo")  # no attainment recorded: the message names the percentile option
    with pytest.raises(ValueError, match="slo rule"):
        label_scenarios(df, "throughput90", ttft_p99_s=5.0)
    with pytest.raises(ValueError, match="positive"):
        label_scenarios(df, "slo", ttft_p99_s=-1.0)
    with pytest.raises(ValueError, match="ttft_ms_p99"):
        label_scenarios(df, "slo", ttft_p99_s=5.0)  # the table has no P99 column


def test_early_stopped_run_counts_as_starving():
    df = _runs({16: [(16, 1.0), (32, 1.0)]})
    df.loc[1, ["total_tok_s", "early_stop"]] = [math.nan, True]
    df["tok_s_upper"] = [math.nan, 2000.0]
    c = slot_candidates(df)
    assert int(c.iloc[0]["served_adapters"]) == 16 and c.iloc[0]["next_ratio"] == pytest.approx(2000 / 3200)


def _walk_run_by_run(g, ratio=0.9, strict=False):
    """The published walk, run by run (what slot_candidates did before its vectorised pass): the
    reference of the test below."""
    from twin.configurator.labels import run_ratio

    def passes(row):
        tp, off = row.get("total_tok_s"), row.get("offered_tok_s")
        if tp is None or off is None or not math.isfinite(tp) or not math.isfinite(off):
            return False
        return tp > ratio * off if strict else tp >= ratio * off

    out = []
    for _, sub in g[g["status"] == "ok"].groupby("adapter_slots", sort=True):
        cand = nxt = None
        for _, row in sub.sort_values("served_adapters").iterrows():
            if passes(row):
                cand = row
                continue
            if cand is None:
                cand = row
            else:
                nxt = row
            break
        c = cand.copy()
        c["ratio_at_label"] = run_ratio(cand)[0]
        c["next_served"] = float(nxt["served_adapters"]) if nxt is not None else math.nan
        c["next_ratio"] = run_ratio(nxt)[0] if nxt is not None else math.nan
        out.append(c)
    return pd.DataFrame(out)


@pytest.mark.parametrize("seed", range(20))
def test_slot_candidates_equal_the_walk_run_by_run(seed):
    """Random scenarios: slot values and served adapters in shuffled row order, runs that failed to start,
    runs stopped early (no throughput, an upper bound), throughputs on the line, both line rules."""
    import numpy as np

    rng = np.random.default_rng(seed)
    rows = []
    for g in rng.choice([8, 16, 32, 64, 128], int(rng.integers(1, 5)), replace=False):
        for n in rng.choice([16, 32, 64, 96, 128, 160], int(rng.integers(1, 6)), replace=False):
            off = float(rng.uniform(100, 5000))
            r = float(rng.choice([0.9, 1.0, 0.5, 0.95, 0.85, float(rng.uniform(0.6, 1.1))]))
            early = bool(rng.random() < 0.15)
            rows.append({"scenario": "s", "adapter_slots": int(g), "served_adapters": int(n),
                         "status": "ok" if rng.random() < 0.85 else "failed_oom", "offered_tok_s": off,
                         "total_tok_s": math.nan if early else r * off, "early_stop": early,
                         "tok_s_upper": float(rng.uniform(0, 1) * off) if early else math.nan})
    df = pd.DataFrame(rows).sample(frac=1.0, random_state=seed).reset_index(drop=True)
    for strict in (False, True):
        want = _walk_run_by_run(df, strict=strict)
        got = slot_candidates(df, strict=strict)
        if want.empty:
            assert got.empty
            continue
        pd.testing.assert_frame_equal(got, want, check_dtype=False)


def test_features():
    f = features_of([0.4, 0.05, 0.00625], [8, 16, 32])
    assert f["rate_max"] == 0.4 and f["rank_min"] == 8 and f["rank_mean"] == pytest.approx(56 / 3)
    assert f["rank_std"] == pytest.approx(pd.Series([8, 16, 32]).std(ddof=0))


@pytest.mark.data
def test_throughput90_reproduces_is_optimum_est_on_real_ml_test(real_data):
    from twin.sweep.scenario import load_real

    real = load_real(real_data / "validation" / "vllm085_h100_llama31_8b.csv")
    lab = real_optima(real, "ml_test")
    est = real[(real["source"] == "ml_test") & real["is_optimum_est"].astype(bool)]
    assert len(lab) == 9 and len(est) == 9
    m = lab.merge(est[["scenario", "served_adapters", "adapter_slots"]], on="scenario", suffixes=("", "_real"))
    assert len(m) == 9
    assert (m["served_adapters"] == m["served_adapters_real"]).all()
    assert (m["adapter_slots"] == m["adapter_slots_real"]).all()
