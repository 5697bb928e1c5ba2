"""The metrics added for issue 16: per-request adapter hits, the request-level hit rate, GPU busy
fraction and link utilization, the run progress bar during the drain, and the run figures."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from tests.helpers import random_workload
from traces.workload import Workload
from twin.config import EngineConfig
from twin.simulate import simulate


def _run(w, slots=4, **kw):
    return simulate(w, None, EngineConfig(max_loras=slots), **kw)


def test_request_hits_by_hand():
    """Adapter 0: request 0 loads it (miss); request 1 arrives while request 0 runs (no new
    activation, hit); request 2 arrives long after both finished and finds it still in its slot
    (an activation and a hit). Adapter 1: request 3 is admitted in the same step as request 4 of
    the same adapter: the step loads it, so both miss."""
    w = Workload.from_arrays([0.0, 0.05, 500.0, 600.0, 600.0], [100, 100, 100, 100, 100], [200, 200, 20, 20, 20],
                             [0, 0, 0, 1, 1], [8, 8, 8, 8, 8])
    res = _run(w)
    hit = res.requests["adapter_hit"]
    assert str(hit.dtype) == "boolean"
    assert hit.tolist() == [False, True, True, False, False]
    s = res.summary
    assert s["adapter_activations"] == 3 and math.isclose(s["adapter_hit_rate"], 1 / 3)
    assert math.isclose(s["adapter_hit_rate_requests"], 2 / 5)


def test_request_hits_agree_with_load_waits():
    """On a random workload: a request that missed and is the one whose admission started the
    load waited for it; a request that hit never waited for an adapter load; requests never
    admitted have no value."""
    w = random_workload(n=400, rps=6.0, adapters=30, seed=3)
    res = _run(w, slots=4, horizon_s=40.0)
    r = res.requests
    admitted = np.isfinite(r["first_scheduled_s"].to_numpy())
    hit = r["adapter_hit"]
    assert hit[~admitted].isna().all() and hit[admitted].notna().all()
    h = hit[admitted].astype(bool).to_numpy()
    waited = r["load_wait_s"].to_numpy()[admitted] > 0
    assert not (h & waited).any(), "a request counted as a hit waited for an adapter load"
    assert waited.sum() > 0 and h.sum() > 0
    assert math.isclose(res.summary["adapter_hit_rate_requests"], h.mean())


def test_busy_fraction_and_link_utilization():
    w = random_workload(n=200, rps=3.0, adapters=40, seed=1)
    res = _run(w, slots=4)
    s, st = res.summary, res.steps
    busy = float((st["t_end"] - st["t_start"]).sum()) / s["simulated_s"]
    assert math.isclose(s["gpu_busy_fraction"], min(1.0, busy), rel_tol=1e-9)
    assert 0 < s["gpu_busy_fraction"] <= 1
    assert 0 < s["link_utilization"] < s["gpu_busy_fraction"]
    assert math.isclose(s["link_utilization"], res.engine.link.busy_s / s["simulated_s"])
    # a lighter load keeps the engine idle longer
    light = _run(random_workload(n=200, rps=0.3, adapters=40, seed=1), slots=4).summary
    assert light["gpu_busy_fraction"] < s["gpu_busy_fraction"]


def test_progress_bar_counts_finished_requests_through_the_drain(monkeypatch):
    """Without a horizon the bar counts finished requests, so past the last arrival (the drain)
    it shows what is left instead of sitting at 100 %."""
    pytest.importorskip("tqdm")
    import twin.recorder as recorder

    clock = iter(range(1, 1000))
    monkeypatch.setattr(recorder.time, "perf_counter", lambda: float(next(clock)))
    rec = recorder.Recorder()
    rec.progress_requests = 10
    rec.progress(5.0, float("inf"), 2)
    rec.progress(500.0, float("inf"), 7)  # long after the last arrival: 7 of 10 done
    assert rec._bar.n == 7 and rec._bar.total == 10
    rec.close_progress()
    rec = recorder.Recorder()
    rec.progress(30.0, 60.0, 0)  # with a horizon: simulated seconds up to it
    assert rec._bar.total == 60.0 and rec._bar.n == 30.0
    rec.close_progress()


def test_run_figures(tmp_path):
    pytest.importorskip("matplotlib")
    from twin.figures import LATENCY_PNG, TIMELINE_PNG, waiting_curve, write_run_figures

    w = random_workload(n=150, rps=4.0, adapters=20, seed=2)
    res = _run(w, slots=4)
    paths = write_run_figures(tmp_path, res.requests, res.steps, res.summary)
    assert [p.name for p in paths] == [LATENCY_PNG, TIMELINE_PNG]
    assert all(p.stat().st_size > 10_000 for p in paths)
    t, n = waiting_curve(res.requests)
    assert n.min() >= 0 and n[-1] == 0  # everyone waiting was admitted in the end


def test_compare_writes_under_runs_and_says_where(tmp_path, monkeypatch, capsys):
    """Without --out, twin compare writes its table, figure and sustained rates under
    runs/compare/<trace> (ignored by git), never into results/, and prints the paths."""
    pytest.importorskip("matplotlib")
    from twin.cli import main

    monkeypatch.chdir(tmp_path)
    rc = main(["compare", "--policies", "vllm", "--rps", "1,2", "--duration", "10", "--slo", "1",
               "--no-progress"])
    out = capsys.readouterr().out
    assert rc == 0
    where = tmp_path / "runs" / "compare" / "synthetic"
    assert {p.name for p in where.iterdir()} == {"compare.csv", "compare.png", "sustained.json"}
    assert not (tmp_path / "results").exists()
    assert "wrote runs/compare/synthetic/compare.csv" in out
    assert "hit rate req." in out and "hit rate act." in out


def test_compare_says_why_requests_were_rejected(tmp_path, capsys):
    """A policy on S-LoRA refuses the prompts longer than its server's limit: the comparison prints, under
    its table, how many per swept rate and why, with the option that sets the limit, and the CSV keeps the
    reasons per row; a policy that rejected nothing gets no line, and none is printed when nobody rejected."""
    pytest.importorskip("matplotlib")
    import pandas as pd

    from twin.cli import main

    argv = ["compare", "--rps", "1,2", "--duration", "20", "--slo", "1", "--no-progress", "--out", str(tmp_path)]
    assert main([*argv, "--policies", "vllm,slora"]) == 0
    out = capsys.readouterr().out
    rows = pd.read_csv(tmp_path / "compare.csv")
    rej = rows[rows["policy"] == "slora"]
    assert (rej["rejected"] > 0).all() and (rows[rows["policy"] == "vllm"]["rejected"] == 0).all()
    lines = out.split("rejected up front (not served, and not in the latencies):\n")[1].split("\n\n")[0].splitlines()
    counts = ", ".join(f"{int(r.rejected)} of {int(r.requests)} at {r.rps:g} req/s" for r in rej.itertuples())
    assert lines == [f"  slora rejected {counts}: prompt longer than the S-LoRA server's max prompt length "
                     "[--slora-max-prompt-len]"]
    assert all(str(v).endswith(": prompt longer than the S-LoRA server's max prompt length")
               for v in rej["reject_reasons"])
    assert "serving systems: vllm on vllm, slora on slora" in out
    assert json.loads((tmp_path / "sustained.json").read_text())["systems"] == {"vllm": "vllm", "slora": "slora"}
    assert main([*argv, "--policies", "vllm", "--trace-opt", "max_prompt=1000"]) == 0
    out = capsys.readouterr().out
    assert "rejected up front" not in out and "serving systems" not in out  # (one system: nothing to say)


def test_compare_progress_bar_counts_the_runs(capsys):
    """The compare progress bar (stderr) counts the unloaded reference run and every
    (policy, rate) run."""
    pytest.importorskip("tqdm")
    from twin.compare import CompareConfig, compare
    from twin.scenario import RunConfig

    rows, sustained, slo = compare(RunConfig(duration=10.0), CompareConfig(policies=["vllm"], rps=[1.0, 2.0]),
                                   progress=True)
    err = capsys.readouterr().err
    assert len(rows) == 2 and slo > 0
    assert "0/3 [" in err  # 1 unloaded reference + 2 runs
    assert "unloaded reference" in err and "vllm at 2 req/s" in err


def test_offered_rate_is_the_arrivals_over_the_span_they_arrived_in():
    """``offered_rps``: the requests that arrived over the horizon, or over the last arrival's time when the run
    drains without one (the drain offers nothing)."""
    w = Workload.from_arrays([0.0, 1.0, 2.0, 8.0], [100] * 4, [50] * 4, [0, 1, 0, 1], [8, 8, 8, 8])
    s = _run(w).summary
    assert s["requests_arrived"] == 4 and s["offered_rps"] == 4 / 8.0 and s["simulated_s"] > 8.0
    s = _run(w, horizon_s=5.0).summary
    assert s["requests_arrived"] == 3 and s["offered_rps"] == 3 / 5.0


def test_every_copy_into_a_slot_is_a_started_load_and_every_one_past_the_slots_an_eviction():
    """vLLM's activation order evicts adapters of the batch and copies them back within a step
    (``adapter_reloads_in_batch``): each is a load (``adapter_loads``, the steps' ``loads_started``, ``link_bytes``)
    and an eviction, so evictions = loads - the adapters resident at the end (they were counted as loads only)."""
    from traces.registry import get_workload

    w = get_workload("synthetic", rps=3.0, duration=60.0, seed=1)
    res = simulate(w, None, EngineConfig(max_loras=8), policy="vllm")
    s, st = res.summary, res.steps
    assert s["adapter_reloads_in_batch"] > 0  # (the case in question)
    assert int(st["loads_started"].sum()) == s["adapter_loads"]
    assert st["link_bytes"].sum() / 1e9 == pytest.approx(s["link_gb"])
    assert s["adapter_evictions"] == s["adapter_loads"] - 8


def test_the_timeline_draws_the_engine_idle_between_steps():
    """Rows are steps; the engine idles between two rows when nothing runs. The step function drops to 0 there
    (it held the last step's batch through the idle time)."""
    from twin.figures import with_idle_gaps

    t0, t1 = np.array([0.0, 1.0, 5.0]), np.array([1.0, 2.0, 6.0])
    x, y = with_idle_gaps(t0, t1, np.array([3, 2, 4]))
    assert x.tolist() == [0.0, 1.0, 2.0, 5.0, 6.0] and y.tolist() == [3.0, 2.0, 0.0, 4.0, 0.0]
    x, y = with_idle_gaps(np.zeros(0), np.zeros(0), np.zeros(0))
    assert len(x) == len(y) == 0


# --------------------------------------------------------------------------- edge cases of the accounting
def test_slora_steps_count_every_decode_token():
    """The S-LoRA engine's first decode after a prefill gives its stalled requests their own ITL samples; its
    steps row counted only the others' tokens as ``decode_tokens`` (7 % of the tokens missing from the steps
    table). Every emitted token past a request's first is a decode token of one step, as on the vLLM engine."""
    w = random_workload(n=150, rps=8.0, adapters=12, seed=5, max_prompt=800, max_out=120)
    for system in ("slora", "vllm"):
        res = simulate(w, None, EngineConfig(max_loras=4), system=system)
        r, st = res.requests, res.steps
        fin = r["outcome"] == "finished"
        assert fin.all()
        want = int((r.loc[fin, "tokens_emitted"] - 1).sum())
        assert int((st["decode_tokens"] * st["n_steps"]).sum()) == want, system


def test_a_run_that_spent_no_time_has_no_rates():
    """Every request at t = 0 and rejected (longer than the model): nothing ran, so the run has no window. Its
    rates were divided by a 1 s stand-in (simulated_s 1.0, throughput 0.0 req/s); they are None now, and the SLO
    attainment of no sent request is None, not 0 % (none met or missed the SLO)."""
    w = Workload.from_arrays([0.0, 0.0], [5000, 6000], [10, 10], [0, 1], [8, 8])
    s = simulate(w, None, EngineConfig(max_loras=2, max_model_len=2048), ttft_slo_s=1.0).summary
    assert s["requests_rejected"] == 2 and s["simulated_s"] == 0.0
    for k in ("throughput_rps", "input_tok_s", "output_tok_s", "total_tok_s", "goodput_rps", "gpu_busy_fraction",
              "link_utilization", "disk_utilization", "slo_attainment"):
        assert s[k] is None, k
    from twin.cli import format_summary  # (the console prints them as "-")

    assert "offered / throughput (req/s)             all at t=0 / -" in format_summary(s)


def test_an_arrival_at_the_horizon_has_not_arrived():
    """The engine stops at the horizon before it takes in the arrivals due then: a request arriving exactly at
    the horizon was counted as arrived and unfinished, and the note blamed the scheduler for never admitting it.
    It has not arrived (as `twin run --horizon` says: nothing arrives before the horizon)."""
    w = Workload.from_arrays([1.0, 5.0, 6.0], [50, 50, 50], [5, 5, 5], [0, 0, 0], [8, 8, 8])
    s = simulate(w, None, EngineConfig(max_loras=2), horizon_s=5.0).summary
    assert (s["requests_arrived"], s["requests_finished"], s["requests_not_arrived"]) == (1, 1, 2)
    assert "note" not in s
    s = simulate(w, None, EngineConfig(max_loras=2), horizon_s=5.0, system="slora").summary
    assert (s["requests_arrived"], s["requests_not_arrived"]) == (1, 2)


def test_slora_refuses_lora_switched_off():
    """vLLM rejects every LoRA request with enable_lora=False; S-LoRA has no such switch and served them all
    (the two engines applied different rules to one configuration). It is refused on S-LoRA, naming the fix."""
    from twin.config import ConfigError

    w = Workload.from_arrays([0.0, 1.0], [50, 50], [5, 5], [0, 1], [8, 8])
    with pytest.raises(ConfigError, match="enable_lora=False with the S-LoRA engine.*use the vLLM engine"):
        simulate(w, None, EngineConfig(enable_lora=False), system="slora")
