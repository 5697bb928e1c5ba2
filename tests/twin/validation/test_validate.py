"""``twin validate`` on small synthetic tables (no real data needed): SMAPE, run re-creation,
the start-up check, the client's in-flight cap, subsets, outputs and the CLI."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from tests.helpers import constant_profile
from traces.workload import Workload
from twin import validation as V
from twin.config import EngineConfig
from twin.registry import make_cache, make_scheduler
from twin.simulate import simulate


# --------------------------------------------------------------------------- SMAPE
def test_smape_published_convention():
    # |t - r| / (|t| + |r|): 10 vs 12 -> 2/22; 0 vs 0 -> 0; NaN pairs are skipped
    assert V.smape([10.0, 0.0, np.nan], [12.0, 0.0, 5.0]) == pytest.approx(100 * (2 / 22) / 2)
    assert V.smape([1.0], [1.0]) == 0.0
    assert V.smape([2.0], [0.0]) == pytest.approx(100.0)  # the convention's maximum
    assert np.isnan(V.smape([np.nan], [1.0]))
    t = V.smape_terms(np.array([3.0, 1.0]), np.array([1.0, 3.0]))
    assert t.tolist() == [0.5, 0.5]


# --------------------------------------------------------------------------- run re-creation
def _row(**kw) -> dict:
    d = dict(model="llama-3.1-8b-instruct", source="dt_modelling", scenario="rank_16_rates_0.1_0.05_0.025",
             run_dir="_8_32_16_", ranks="8-16", rates="0.1-0.05-0.025", served_adapters=32, adapter_slots=8,
             max_lora_rank=16, max_cpu_loras=32, max_num_seqs=2048, benchmark_time_s=3600, status="ok",
             pool_mean_input_tokens=222.0, pool_mean_output_tokens=196.0, offered_req_s=1.9, requests_sent=np.nan)
    d.update(kw)
    d["run_id"] = f"{d['source']}/{d['scenario']}/{d['run_dir']}"
    return d


def test_workload_follows_the_run_configuration():
    spec = V.spec_from_row(_row())
    wl, basis = V.build_workload(spec)
    df = wl.df
    assert basis == "nominal"
    assert df["arrival_s"].between(0, 3600).all()
    # ranks round-robin over the adapters: even ids rank 8, odd ids rank 16
    ranks = df.groupby("adapter_id")["adapter_rank"].first()
    assert (ranks[ranks.index % 2 == 0] == 8).all() and (ranks[ranks.index % 2 == 1] == 16).all()
    assert df["adapter_id"].max() < 32
    # per-adapter rates: 11 x 0.1, 11 x 0.05, 10 x 0.025 (round-robin), total 1.9 req/s
    per = df.groupby("adapter_id").size() / 3600
    assert len(df) == pytest.approx(1.9 * 3600, rel=0.05)
    top = per.sort_values(ascending=False)
    assert top.iloc[:11].mean() == pytest.approx(0.1, rel=0.2)
    assert top.iloc[-10:].mean() == pytest.approx(0.025, rel=0.35)
    # the rates are shuffled independently of the ranks: the fast adapters are not all even
    fast = set(top.index[:11])
    assert any(a % 2 for a in fast) and any(a % 2 == 0 for a in fast)
    # ShareGPT-like lengths with the pool means and the real runs' filters
    assert df["prompt_tokens"].mean() == pytest.approx(222, rel=0.05)
    assert df["output_tokens"].mean() == pytest.approx(196, rel=0.05)
    assert (df["prompt_tokens"] >= 4).all() and (df["prompt_tokens"] <= 1024).all()
    assert ((df["prompt_tokens"] + df["output_tokens"]) <= 2048).all()
    # deterministic per run
    wl2, _ = V.build_workload(V.spec_from_row(_row()))
    assert wl2.df.equals(df)


def test_requests_sent_fixes_the_offered_count():
    spec = V.spec_from_row(_row(requests_sent=5000.0))
    wl, basis = V.build_workload(spec)
    assert basis == "requests_sent" and len(wl) == 5000
    spec = V.spec_from_row(_row(requests_sent=5000.0), use_sent=False)
    assert V.build_workload(spec)[1] == "nominal"
    assert spec.nominal_requests == pytest.approx(1.9 * 3600)


def test_engine_settings_of_the_runs():
    cfg = V.build_config(V.spec_from_row(_row(adapter_slots=16, max_cpu_loras=64, served_adapters=64)))
    assert (cfg.max_num_batched_tokens, cfg.max_num_seqs, cfg.max_loras, cfg.max_cpu_loras, cfg.max_lora_rank,
            cfg.served_adapters, cfg.max_model_len) == (2048, 2048, 16, 64, 16, 64, None)


def test_startup_check_predicts_memory_failures():
    prof = V.cached_profile(None)
    ok, kv, _ = V.predict_startup(V.spec_from_row(_row()), prof)
    assert ok and kv > prof.model.max_model_len
    ok, kv, msg = V.predict_startup(V.spec_from_row(_row(adapter_slots=384, served_adapters=384, max_cpu_loras=384,
                                                         max_lora_rank=32)), prof)
    assert not ok and "refuse to start" in msg
    out = V.simulate_run(V.spec_from_row(_row(adapter_slots=384, served_adapters=384, max_cpu_loras=384,
                                              max_lora_rank=32)))
    assert out["twin_status"] == "start_failure"


# --------------------------------------------------------------------------- the client's in-flight cap
CAPPED = "fcfs+client-cap"


def test_client_cap_is_a_registered_scheduler():
    from policies.client_cap import CLIENT_MAX_INFLIGHT, ClientCappedFCFS
    from policies.fcfs import FCFSScheduler

    s = make_scheduler(CAPPED)
    assert isinstance(s, ClientCappedFCFS) and isinstance(s, FCFSScheduler)
    assert s.get_params() == {"client_cap": CLIENT_MAX_INFLIGHT, "preload_cpu": True, "preload_gpu": False}
    assert CLIENT_MAX_INFLIGHT == 28232
    assert make_scheduler(CAPPED, client_cap=None, preload_cpu=False).get_params() == {"client_cap": None,
                                                                                       "preload_cpu": False,
                                                                                       "preload_gpu": False}


def test_client_cap_drops_arrivals_beyond_the_cap():
    """10 requests at once, a cap of 4: the last 6 fail at the client and stay unfinished."""
    prof = constant_profile(c0=0.01, cpu_s=0.0, disk_s=0.0)
    w = Workload.from_arrays(np.linspace(0, 0.001, 10), [10] * 10, [5] * 10, [0, 1] * 5, [8] * 10)
    sched = make_scheduler(CAPPED, client_cap=4)
    res = simulate(w, prof, EngineConfig(max_loras=2), scheduler_obj=sched, cache_obj=make_cache("lru"))
    r = res.requests
    assert sched.n_dropped == 6
    assert (r["outcome"] == "finished").sum() == 4
    assert (r["outcome"] == "unfinished").sum() == 6
    # unfinished requests count as the window in the published twin's TTFT
    assert res.summary["ttft_ms_incl_unfinished"] > res.summary["ttft_ms_mean"]
    # each of them says why: nothing is lost silently
    from policies.client_cap import CLIENT_CAP_REASON

    assert r["drop_reason"].tolist() == [""] * 4 + [CLIENT_CAP_REASON] * 6
    assert res.summary["requests_dropped"] == 6 and res.summary["drop_reasons"] == {CLIENT_CAP_REASON: 6}


def test_a_run_without_drops_says_none():
    prof = constant_profile(c0=0.01, cpu_s=0.0, disk_s=0.0)
    w = Workload.from_arrays(np.linspace(0, 0.001, 10), [10] * 10, [5] * 10, [0, 1] * 5, [8] * 10)
    res = simulate(w, prof, EngineConfig(max_loras=2), policy="vllm")
    assert (res.requests["drop_reason"] == "").all()
    assert res.summary["requests_dropped"] == 0 and res.summary["drop_reasons"] == {}


def _random_workload(seed: int, n: int, window_s: float, max_output: int, adapters: int) -> Workload:
    """``n`` uniform arrivals over ``window_s`` with random lengths and adapters (rank 8)."""
    rng = np.random.default_rng(seed)
    return Workload.from_arrays(np.sort(rng.uniform(0, window_s, n)), rng.integers(5, 300, n),
                                rng.integers(2, max_output, n), rng.integers(0, adapters, n), np.full(n, 8))


def test_client_cap_matches_no_cap_below_the_cap():
    prof = constant_profile(c0=0.01, c_prefill=1e-5, cpu_s=0.001, disk_s=0.01)
    w = _random_workload(3, 300, 60, 50, 6)
    cfg = EngineConfig(max_loras=2, max_num_seqs=64)
    a = simulate(w, prof, cfg, scheduler_obj=make_scheduler(CAPPED, client_cap=10_000, preload_cpu=False),
                 cache_obj=make_cache("lru"))
    b = simulate(w, prof, cfg, policy="vllm")
    pd.testing.assert_frame_equal(a.requests, b.requests)


def test_client_cap_never_exceeded():
    prof = constant_profile(c0=0.02, c_prefill=1e-5, cpu_s=0.001, disk_s=0.0)
    n = 2000
    w = _random_workload(4, n, 20, 80, 8)
    seen = []

    class Probe(type(make_scheduler(CAPPED))):
        def on_arrivals(self, lo, hi):
            super().on_arrivals(lo, hi)
            seen.append(self.engine.n_waiting + len(self.engine.running))

    probe = Probe(client_cap=50)
    res = simulate(w, prof, EngineConfig(max_loras=3, max_num_seqs=32), scheduler_obj=probe,
                   cache_obj=make_cache("lru"))
    assert max(seen) <= 50 and probe.n_dropped > 0
    s = res.summary
    assert s["requests_finished"] + s["requests_unfinished"] == n


def test_waiting_ids_leave_out_the_requests_the_client_dropped():
    """``waiting_ids`` (what Chameleon's victim and plug-ins read) lists the waiting requests only: it listed
    the arrivals the client cap dropped, which a scheduler must not offer (380 of 400 here)."""
    prof = constant_profile(c0=0.02, c_prefill=1e-5, cpu_s=0.001, disk_s=0.0)
    w = _random_workload(6, 400, 4, 80, 8)
    checked = []

    class Probe(type(make_scheduler(CAPPED))):
        def on_arrivals(self, lo, hi):
            super().on_arrivals(lo, hi)
            e = self.engine
            ids = e.waiting_ids()
            assert not np.frombuffer(self.dropped, np.uint8)[ids].any()
            assert len(ids) == e.n_waiting
            checked.append(len(ids))

    probe = Probe(client_cap=20)
    simulate(w, prof, EngineConfig(max_loras=3, max_num_seqs=8), scheduler_obj=probe, cache_obj=make_cache("lru"),
             check_invariants=True)
    assert probe.n_dropped > 300 and checked


def test_client_cap_range_drops_match_the_general_drops():
    """The cap's usual case (every arrival of the step valid: the last ones dropped as a range,
    each of their adapters' heads moved once, in set order) gives exactly the general path (the valid
    arrivals found one by one, adapters taken in sorted order), which a probe forces."""
    from array import array

    prof = constant_profile(c0=0.02, c_prefill=1e-5, cpu_s=0.001, disk_s=0.0)
    w = _random_workload(5, 2000, 20, 80, 8)
    capped = type(make_scheduler(CAPPED))

    class General(capped):
        def bind(self, engine):
            super().bind(engine)
            self.ok_cum = array("q", range(0, 2 * (engine.n + 1), 2))  # never "all valid"

    cfg = EngineConfig(max_loras=3, max_num_seqs=32)
    a = simulate(w, prof, cfg, scheduler_obj=capped(client_cap=40), cache_obj=make_cache("lru"))
    general = General(client_cap=40)
    b = simulate(w, prof, cfg, scheduler_obj=general, cache_obj=make_cache("lru"))
    assert general.n_dropped > 100
    assert (a.requests["drop_reason"] != "").sum() == general.n_dropped == a.summary["requests_dropped"]
    pd.testing.assert_frame_equal(a.requests, b.requests, check_exact=True)
    pd.testing.assert_frame_equal(a.steps, b.steps, check_exact=True)


def test_preloaded_cpu_tier_means_no_disk_loads():
    prof = constant_profile(c0=0.01, cpu_s=0.001, disk_s=0.5)
    w = Workload.from_arrays([0.0, 1.0, 2.0], [10] * 3, [2] * 3, [0, 1, 2], [8] * 3)
    res = simulate(w, prof, EngineConfig(max_loras=1, max_cpu_loras=3),
                   scheduler_obj=make_scheduler(CAPPED, client_cap=None), cache_obj=make_cache("lru"))
    assert res.summary["adapter_loads_from_disk"] == 0 and res.summary["adapter_loads_from_cpu"] == 3
    res = simulate(w, prof, EngineConfig(max_loras=1, max_cpu_loras=3), policy="vllm")
    assert res.summary["adapter_loads_from_disk"] == 3


# --------------------------------------------------------------------------- the whole command
def _tables(tmp_path):
    rows = [
        _row(run_dir="_2_2_16_", served_adapters=2, adapter_slots=2, max_cpu_loras=2, rates="0.5-0.25",
             benchmark_time_s=60, requests_sent=44.0),
        _row(run_dir="_2_4_16_", served_adapters=4, adapter_slots=2, max_cpu_loras=4, rates="0.5-0.25",
             benchmark_time_s=60),
        _row(run_dir="_384_384_32_", served_adapters=384, adapter_slots=384, max_cpu_loras=384, max_lora_rank=32,
             status="failed_kv_insufficient", benchmark_time_s=60),
        _row(run_dir="_8_8_16_", status="failed_port_in_use", benchmark_time_s=60),
    ]
    real = pd.DataFrame(rows).drop(columns=["run_id"])
    # real figures: made up, what matters is that they are scored
    real.loc[:1, "request_throughput"] = [0.6, 0.7]
    real.loc[:1, "total_tok_s"] = [250.0, 300.0]
    real.loc[:1, "mean_itl_ms"] = [15.0, 16.0]
    real.loc[:1, "mean_tpot_ms"] = [15.0, 16.0]
    real.loc[:1, "mean_ttft_ms"] = [40.0, 45.0]
    real.loc[:1, "median_ttft_ms"] = [35.0, 40.0]
    real.loc[:1, "p99_ttft_ms"] = [80.0, 90.0]
    real.loc[:1, "ttft_ms_incl_unfinished"] = [2000.0, np.nan]
    real_csv = tmp_path / "vllm085_h100_test_8b.csv"
    real.to_csv(real_csv, index=False)
    peer = real.iloc[:2][list(V.RUN_KEYS)].copy()
    peer["total_tok_s"] = [260.0, 280.0]
    peer["itl_ms"] = [20.0, 18.0]
    peer["ttft_ms_incl_unfinished"] = [2100.0, 3000.0]
    peer["finished_requests"] = [2100, 2400]
    peer.to_csv(tmp_path / "peer_twin_test_8b.csv", index=False)
    return real_csv


def test_run_validation_end_to_end(tmp_path):
    real_csv = _tables(tmp_path)
    assert V.default_peer_csv(real_csv) == tmp_path / "peer_twin_test_8b.csv"
    res = V.run_validation(real_csv, jobs=1)
    s = res.summary
    for key in ("runs", "smape_throughput", "smape_itl", "smape_ttft_mean", "smape_ttft_incl_unfinished",
                "peer_smape_throughput", "peer_smape_itl", "peer_smape_ttft_incl_unfinished",
                "start_failures_predicted"):
        assert key in s
    assert s["runs"] == 2
    assert s["start_failures_predicted"] == 1.0
    assert s["start_failures"]["not_scored"] == {"failed_port_in_use": 1}
    runs = res.runs.set_index("run_dir")
    assert runs.loc["_2_2_16_", "load_basis"] == "requests_sent" and runs.loc["_2_4_16_", "load_basis"] == "nominal"
    assert runs.loc["_2_2_16_", "twin_requests"] == 44
    # SMAPE of the published twin on the same runs: tok/s 250 vs 260, 300 vs 280
    exp = 100 * np.mean([10 / 510, 20 / 580])
    assert s["peer_smape_throughput"] == pytest.approx(exp)
    # ours, recomputed from the per-run table
    ok = res.runs[res.runs["scored"]]
    assert s["smape_itl"] == pytest.approx(V.smape(ok["twin_itl"], ok["real_itl"]))
    # subsets: one run with requests_sent (kept up: 44 >= 0.95 * 0.75 * 60), one unknown
    assert s["subsets"]["kept_up"]["scored"] == 1 and s["subsets"]["sent_unknown"]["scored"] == 1
    # outputs
    paths = V.write_outputs(res, tmp_path / "out")
    names = {p.name for p in paths}
    assert {"per_run.csv", "summary.json", "fig7_dt_modelling.png", "scatter_twin_vs_real.png"} <= names
    assert "itl_over_tpot.png" not in names  # (the table has no running-requests gauge)
    per = pd.read_csv(tmp_path / "out" / "per_run.csv")
    assert {"real_throughput", "twin_throughput", "peer_throughput", "err_itl", "load_basis"} <= set(per.columns)
    js = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert js["runs"] == 2
    text = V.format_report(res)
    assert "kept_up" in text and "start-up failures" in text


def test_cli_validate(tmp_path, capsys):
    from twin.cli import main

    real_csv = _tables(tmp_path)
    rc = main(["validate", "--real", str(real_csv), "--jobs", "1", "--json", "--filter", "served_adapters <= 4"])
    assert rc == 0
    js = json.loads(capsys.readouterr().out)
    assert js["runs"] == 2 and js["start_failures"]["real_failures"] == 0
    rc = main(["validate", "--real", str(real_csv), "--jobs", "2", "--peer", "none", "--limit", "2",
               "--client-cap", "none", "--no-preload"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "twin validate:" in out


def test_cli_validate_refuses_top_with_json(tmp_path, capsys, monkeypatch):
    """`twin validate --json --top 3` exited 0: the JSON summary lists no largest errors, so --top did nothing.
    Refused before any run; without --json the table still lists --top (default 8) errors."""
    import twin.validation.cli as vcli
    from twin.cli import main

    def no_run(*a, **k):
        raise AssertionError("ran the validation")

    monkeypatch.setattr(vcli, "run_validation", no_run)
    assert main(["validate", "--limit", "1", "--json", "--top", "3"]) == 2
    cap = capsys.readouterr()
    assert not cap.out and "Traceback" not in cap.err
    assert cap.err.startswith("twin validate: error: --top 3 with --json: --top sets the largest errors listed in "
                              "the table, and --json prints the JSON summary instead of the table; leave one of them "
                              "out")
    assert main(["validate", "--limit", "1", "--json", "--top", "8"]) == 2  # (explicit, even at the default's value)
    capsys.readouterr()
    tops = []
    monkeypatch.setattr(vcli, "run_validation", lambda *a, **k: None)
    monkeypatch.setattr(vcli, "json_summary", lambda res: "{}")
    monkeypatch.setattr(vcli, "format_report", lambda res, top: tops.append(top) or "table")
    assert main(["validate", "--limit", "1", "--json"]) == 0
    assert main(["validate", "--limit", "1"]) == 0
    assert main(["validate", "--limit", "1", "--top", "3"]) == 0
    assert tops == [vcli.TOP_DEFAULT, 3] and vcli.TOP_DEFAULT == 8
    assert main(["validate", "--limit", "1", "--top", "-1"]) == 2
    assert "--top -1: must be >= 0" in capsys.readouterr().err


def test_select_runs():
    real = pd.DataFrame([_row(run_dir=f"_{i}_", served_adapters=8 * (i + 1)) for i in range(10)])
    assert len(V.select_runs(real, "served_adapters > 40")) == 5
    assert len(V.select_runs(real, "_3_")) == 1
    lim = V.select_runs(real, None, 4)
    assert len(lim) == 4 and lim.index[0] == 0 and lim.index[-1] == 9


def test_profile_follows_the_runs_model():
    assert V.profile_for_model("llama-3.1-8b-instruct") == "llama-3.1-8b_h100_vllm085_adaptercheck"
    assert V.profile_for_model("qwen-2.5-7b-instruct") == "qwen-2.5-7b_h100_vllm085"
    assert V.profile_for_model("no-such-model") is None
    real = pd.DataFrame([_row(model="qwen-2.5-7b-instruct")])
    with pytest.raises(ValueError, match="calibrated profile"):
        V.check_profile_model(V.cached_profile("llama-3.1-8b_h100_vllm085"), real)


def test_model_names_are_normalised_to_the_profiles_tags():
    """A checkpoint name in any usual spelling finds its calibrated profile."""
    for name in ("Qwen/Qwen2.5-7B-Instruct", "qwen2.5-7b-instruct", "Qwen-2.5-7B-Instruct", "qwen-2.5-7b"):
        assert V.profile_for_model(name) == "qwen-2.5-7b_h100_vllm085", name
    assert V.profile_for_model("meta-llama/Meta-Llama-3.1-8B-Instruct") == "llama-3.1-8b_h100_vllm085_adaptercheck"
    qwen = pd.DataFrame([_row(model="Qwen/Qwen2.5-7B-Instruct")])
    V.check_profile_model(V.cached_profile("qwen-2.5-7b_h100_vllm085"), qwen)  # the same model: accepted
    with pytest.raises(ValueError, match="pass --profile qwen-2.5-7b_h100_vllm085"):
        V.check_profile_model(V.cached_profile("llama-3.1-8b_h100_vllm085"), qwen)


@pytest.mark.parametrize("model, match", [(None, "column is missing"), (np.nan, "column is empty"),
                                          ("mistral-7b-instruct", "no calibrated profile")])
def test_runs_without_a_known_model_are_refused_with_the_fix(model, match):
    from twin.validation.profiles import profile_of_runs

    rows = pd.DataFrame([_row(model=model)])
    if model is None:
        rows = rows.drop(columns="model")
    with pytest.raises(ValueError, match=match) as e:
        profile_of_runs(rows, None)
    assert "--profile" in str(e.value)
    assert profile_of_runs(rows, "llama-3.1-8b_h100_vllm085") == "llama-3.1-8b_h100_vllm085"  # given: used


def test_a_start_failure_the_twin_misses_is_not_simulated():
    """A real run that failed to start records no pool lengths; when the twin's check says it starts,
    it is a missed failure (``starts``), not an error and not an hour simulated from empty cells."""
    row = _row(status="failed_kv_insufficient", pool_mean_input_tokens=np.nan, pool_mean_output_tokens=np.nan)
    out = V.simulate_run(V.spec_from_row(row))
    assert out["twin_starts"] and out["twin_status"] == "starts"


def test_step_at_real_mix_is_the_model_at_the_runs_composition():
    """A saturated run whose ITL is the profile's step at the composition that ITL implies scores 1;
    a slower real run scores its slowdown; runs with the KV cache not full are left out."""
    from twin.perf.profile import load_profile

    prof = load_profile("llama-3.1-8b_h100_vllm085")
    run = {"run_id": "r", "model": "llama-3.1-8b-instruct", "ranks": "8-16", "rates": "0.4,0.2,0.1",
           "served_adapters": 96, "adapter_slots": 32, "max_lora_rank": 16,
           "ts_mean_kv_usage": 0.97, "ts_mean_running": 600.0, "ts_mean_waiting": 5000.0, "ts_preemptions": 3600.0,
           "input_tok_s": 6000.0, "output_tok_s": 5200.0, "twin_kv_tokens": 250_000, "pool_mean_input_tokens": 222.0,
           "pool_mean_output_tokens": 196.0, "benchmark_time_s": 3600.0}
    ad = np.array([0.4, 0.2, 0.1])[np.arange(96) % 3]
    A = min(32.0, float(np.sum(1 - (1 - ad / ad.sum()) ** 600.0)))
    itl = 0.1
    for _ in range(60):  # fixed point: the step at the composition of that step
        P = (6000.0 + 1.0 * (222.0 + 98.0)) * itl
        D = 5200.0 * itl
        base = prof.backbone_s(P, D, 0.97 * 250_000)
        comp = base + prof.lora_s(base, A, 16, P + D, 32, 600.0)
        if prof.mixed_s is not None:  # the profile's per-adapter cost of a step with a prefill
            comp = comp + prof.mixed_s(P, A, 32)
        itl = prof.scheduler_s(600.0, 5000.0, 32, 96) + comp
    light = dict(run, run_id="light", ts_mean_kv_usage=0.5)
    runs = pd.DataFrame([dict(run, real_itl=itl * 1000), dict(run, run_id="slow", real_itl=itl * 1000 * 1.5), light])
    runs["real_itl"] = runs["real_itl"].fillna(itl * 1000)
    out = V.step_at_real_mix(runs, prof).set_index("run_id")
    assert list(out.index) == ["r", "slow"]
    assert out.loc["r", "ratio"] == pytest.approx(1.0, rel=1e-9)
    assert out.loc["r", "model_step_ms"] == pytest.approx(itl * 1000, rel=1e-9)
    assert 1.0 < out.loc["slow", "ratio"] < 1.5  # a longer ITL also implies a bigger step mix
    assert out.loc["r", "adapters"] == pytest.approx(32.0)
    assert out.loc["r", "blocked_waiting"] == pytest.approx(5000.0 * (1 - 32 / 96))  # adapters beyond the slots
    from twin.validation.diagnostics import _saturated_summary

    summ = _saturated_summary(out.reset_index())
    (name, b), = summ["by_blocked_waiting"].items()
    assert name == "blocked 1,000-15,000" and b["runs"] == 2 and b["median"] == pytest.approx(out["ratio"].median(), rel=1e-3)
    assert b["median_gap_ms"] == pytest.approx((out["real_itl_ms"] - out["model_step_ms"]).median(), abs=0.01)


@pytest.mark.data
def test_a_real_table_without_a_measured_figures_column_names_what_is_not_scored(real_data, tmp_path):
    """A real-run table without ``total_tok_s`` validated without a word, every throughput row "n 0 / -": the figures
    it cannot score are named in a warning (none at all: nothing is scored)."""
    import warnings

    from twin.validation.metrics import METRICS
    from twin.validation.specs import UnscoredFigureWarning, warn_unscored_figures

    real = pd.read_csv(real_data / "validation" / "vllm085_h100_llama31_8b.csv", nrows=5)
    with pytest.warns(UnscoredFigureWarning, match=r"r.csv: no column total_tok_s: that figure is not scored"):
        assert warn_unscored_figures(real.drop(columns=["total_tok_s"]), "r.csv") == ["total_tok_s"]
    with pytest.warns(UnscoredFigureWarning, match=r"no measured figure \(none of the columns total_tok_s, "):
        warn_unscored_figures(real.drop(columns=[m.real for m in METRICS if m.real]), "r.csv")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert warn_unscored_figures(real, "r.csv") == []


def test_cli_validate_refuses_no_figures_without_out(capsys):
    """--no-figures without --out did nothing (the figures are drawn only into --out): refused before any run."""
    from twin.cli import main

    assert main(["validate", "--no-figures", "--limit", "1"]) == 2
    err = capsys.readouterr().err
    assert "twin validate: error: --no-figures without --out" in err and "Traceback" not in err
