"""``twin.simulate.simulate`` from a notebook: every odd argument is refused before the run, naming
the argument and the fix (a DataFrame workload is checked as a Workload, a mapping of columns as one)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from traces.workload import WorkloadError
from twin.config import EngineConfig
from twin.requests import StartupError
from twin.simulate import simulate


def _df(**cols) -> pd.DataFrame:
    return pd.DataFrame({"arrival_s": [0.0, 0.1, 0.2], "prompt_tokens": [10, 20, 30], "output_tokens": [5, 5, 5],
                         **cols})


def _cols(**cols) -> dict:
    return {"arrival_s": np.array([0.0, 1.0]), "prompt_tokens": np.array([10, 20]),
            "output_tokens": np.array([5, 5]), **cols}


def test_a_dataframe_workload_is_checked_and_sorted_as_a_workload():
    # unsorted rows are sorted (as a Workload sorts them); a plain table without adapter_id is base-model requests
    assert simulate(_df().iloc[::-1].reset_index(drop=True)).summary["requests_finished"] == 3
    cases = [(_df(prefix_token=[0, 1, 2]), "unknown column"),                  # a misspelt column was dropped
             (_df(request_id=[1, 1, 2]), "duplicates"),
             (_df(adapter_id=[0, 0, 1], adapter_rank=[8, 16, 8]), "ranks 8 and 16; one rank per adapter")]
    for df, message in cases:
        with pytest.raises(WorkloadError, match=message):
            simulate(df)


@pytest.mark.parametrize("cols, message", [
    ({"arrival_s": [0.0], "prompt_tokens": [10]}, "lacks output_tokens"),
    (_cols(prefix_token=np.array([0, 1])), "unknown column"),
    (_cols(conversation_id=np.array([3])), "'conversation_id': give 2 integers"),
    (_cols(request_id=np.array([3, 3])), "duplicates"),
    (_cols(adapter_id=np.array([0, 0]), adapter_rank=np.array([8, 16])), "ranks 8 and 16"),
    ({"arrival_s": np.array(["0", "1"]), "prompt_tokens": [1, 2], "output_tokens": [1, 2]}, "'arrival_s': give 2 numbers"),
])
def test_a_mapping_of_columns_is_checked_as_a_table(cols, message):
    with pytest.raises(WorkloadError, match=message):
        simulate(cols)


def test_a_path_as_workload_says_how_to_read_it():
    with pytest.raises(TypeError, match=r"Workload\.load\('trace\.csv'\)"):
        simulate("trace.csv")


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(profile=3), TypeError, "profile: got int"),
    (dict(frontend_s="1"), TypeError, "frontend_s: got '1'"),
    (dict(frontend_s=None), TypeError, "frontend_s: got None"),
    (dict(serving_s_per_running="1"), TypeError, "serving_s_per_running"),
    (dict(scrape_s_per_label="1"), TypeError, "scrape_s_per_label"),
    (dict(rank_tile_cost="2"), TypeError, "rank_tile_cost"),       # was float("2"): accepted silently
    (dict(extra=[1, 2]), TypeError, "extra: got list"),             # was refused after the run
    (dict(extra={"policy": "mine"}), ValueError, "policy would replace"),
    (dict(extra={"requests_finished": 99}), ValueError, "requests_finished would replace"),  # was written over
    (dict(stop_when=5), TypeError, "stop_when: got int"),          # was never called on a short run
    (dict(progress="no"), TypeError, "progress: got 'no'"),         # a true value: drew the bar it was to hide
    (dict(record_steps="false"), TypeError, "record_steps: got 'false'"),
    (dict(check_invariants=1), TypeError, "check_invariants: got 1"),
    (dict(stop_when=lambda e: False, stop_check_s="1"), ValueError, "stop_check_s '1'"),
    (dict(stop_when=lambda e: False, stop_check_s=1e-300), ValueError, "stop_check_s 1e-300"),  # was a hang
    (dict(scrape_s_per_label=1e-3, scrape_period_s=1e-9), ValueError, "scrape_period_s 1e-09: .* >= 0.001"),  # a hang
    (dict(frontend_s=1e12), ValueError, "frontend_s 1000000000000.0: more than 1000 s"),   # latencies of 1e12 s
    (dict(serving_s_per_running=1e6), ValueError, "serving_s_per_running 1000000.0: more than 1 s"),
])
def test_odd_arguments_are_refused_naming_them(kwargs, error, message):
    with pytest.raises(error, match=message):
        simulate(_df(), **kwargs)


def test_a_bool_is_no_number_of_seconds():
    with pytest.raises(TypeError, match="frontend_s: got True"):
        simulate(_df(), frontend_s=True)


def test_a_block_larger_than_the_kv_cache_is_a_startup_error():
    """block_size 1e9 built a list of 1e9 counters at start-up (a hang); now refused by name."""
    with pytest.raises(StartupError, match="block_size 1000000000 exceeds the KV cache"):
        simulate(_df(), config=EngineConfig(block_size=10**9))


def test_arrivals_beyond_the_clock_and_sparse_adapter_ids():
    """Arrivals at 1e15 s ran with TTFT 0 (a float clock loses the steps there); an adapter id of 10**12 in a table
    asked numpy for a 7 TiB array (the ranks check), while the same ids ran through a Workload."""
    from traces.workload import Workload

    with pytest.raises(ValueError, match="the last request arrives at 1e\\+15 s, beyond the 1e\\+08 s"):
        simulate(Workload.from_arrays([1e15, 1e15 + 1], [100, 100], [20, 20]))
    with pytest.raises(ValueError, match="beyond the 1e\\+08 s"):
        simulate(_cols(arrival_s=np.array([0.0, 2e8])))
    res = simulate(_df(adapter_id=[10**12, 0, 10**12], adapter_rank=[8, 16, 8]))
    assert res.summary["requests_finished"] == 3
    with pytest.raises(WorkloadError, match="one rank per adapter"):
        simulate(_cols(adapter_id=np.array([10**12, 10**12]), adapter_rank=np.array([8, 16])))


def test_a_policy_s_counters_cannot_replace_the_run_s_own_figures():
    """A cache's stats() returning requests_arrived / policy replaced the run's own (requests_arrived 0 beside 20
    finished, the policy named 'vllm'), without a word."""
    from policies.fcfs import FCFSScheduler
    from policies.lru import LRUCache

    class Loud(LRUCache):  # (a prefetching cache: its counters join the summary through the extensions)
        name = "loud"

        def prefetch(self, now):
            return [0]

        def stats(self):
            return {"requests_arrived": 0, "policy": "vllm"}

    with pytest.raises(ValueError, match="stats\\(\\) returns policy, requests_arrived, which would replace"):
        simulate(_df(adapter_id=[0, 1, 0], adapter_rank=[8, 8, 8]), scheduler_obj=FCFSScheduler(), cache_obj=Loud())


def test_numpy_integers_in_the_config_run_as_python_ones():
    """An np.int16 block size overflowed in the engine's block arithmetic (OverflowError); the config holds Python
    numbers once checked, so numpy's small integer types run as their values."""
    cfg = EngineConfig(block_size=np.int16(16), max_loras=np.uint8(4), max_num_seqs=np.int64(64))
    res = simulate(_df(adapter_id=[0, 1, 2], adapter_rank=[8, 8, 8]), config=cfg)
    assert res.summary["requests_finished"] == 3 and type(cfg.block_size) is int and type(cfg.max_loras) is int


def test_requests_after_the_horizon_are_counted_as_not_arrived():
    """A horizon shorter than the workload: the requests past it are counted (summary and console), so that every
    request of the workload is accounted for."""
    from tests.helpers import constant_profile
    from traces.workload import Workload
    from twin.cli import format_summary

    w = Workload.from_arrays(np.arange(10, dtype=float), [10] * 10, [3] * 10)
    res = simulate(w, constant_profile(), EngineConfig(), horizon_s=4.5)
    s = res.summary
    assert s["requests_not_arrived"] == (res.requests["outcome"] == "not_arrived").sum() == 5
    assert s["requests_arrived"] + s["requests_not_arrived"] == 10
    assert "(5 more of the workload arrive after the horizon, not simulated)" in format_summary(s, "")
    assert simulate(w, constant_profile(), EngineConfig()).summary["requests_not_arrived"] == 0


def test_collect_run_garbage_frees_each_run_s_engine():
    """The runs of a sweep's walk: every call frees the previous run's engine (its reference cycles), also after
    the first call froze the survivors (in a child process: the freeze is process-wide)."""
    import subprocess
    import sys

    code = """
import gc, weakref
import numpy as np
from twin.simulate import collect_run_garbage, simulate
w = {"arrival_s": np.array([0.0, 0.5]), "prompt_tokens": np.array([64, 64]), "output_tokens": np.array([8, 8]),
     "adapter_id": np.array([0, 1]), "adapter_rank": np.array([8, 8])}
gc.disable()  # (only the helper collects)
frozen = []
for _ in range(3):
    res = simulate(w, horizon_s=10.0)
    assert res.summary["requests_finished"] == 2
    engine = weakref.ref(res.engine)
    del res
    collect_run_garbage()
    assert engine() is None, "the run's engine survived the collection"
    frozen.append(gc.get_freeze_count())
assert min(frozen) > 0, frozen
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_no_nothing_admitted_note_while_the_offered_request_waits_for_its_swap_ins():
    """FastLibra copies a waiting request's adapter in the background (NOT_READY): at a horizon that falls during
    the copy nothing was admitted, yet the scheduler offered the request; the note blamed its schedule_waiting
    (stop 67's liveness fuzz). The same run without the horizon finishes every request."""
    from traces.registry import get_workload

    w = get_workload("fastlibra-translation", rps=2.0, duration=10.0, adapters=8, seed=732)
    cfg = EngineConfig(kv_capacity_tokens=1500, max_model_len=1500, max_num_seqs=256, max_num_batched_tokens=512,
                       block_size=8, max_loras=2)
    r = simulate(w, "llama-2-7b_a100-80gb_vidur", cfg, scheduler="sjf", cache="fastlibra-wom", system="vllm",
                 horizon_s=1.7384, cache_opts={"interval_s": 0.015625})
    assert r.summary["requests_finished"] == 0 and r.engine.adapters.loading
    assert "no request was admitted" not in (r.summary.get("note") or "")
