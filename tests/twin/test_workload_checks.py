"""The workload's columns are checked where the engine's request table is built (``twin.requests.workload_columns``):
a Workload changed after it was built, unsigned columns beyond int64, token counts whose sum would overflow, adapters
without ranks are refused with a message naming the problem, before any simulation work; and a run with a horizon
whose scheduler abandoned requests says so, as a run without one does."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest

from policies.fcfs import FCFSScheduler
from policies.lru import LRUCache
from tests.helpers import ListQueueScheduler, random_workload
from traces.schema import MAX_REQUEST_TOKENS
from traces.workload import Workload, WorkloadError
from twin.config import EngineConfig
from twin.requests import RequestTable, workload_columns
from twin.simulate import NothingAdmittedWarning, simulate


def _cols(n: int = 20) -> dict[str, np.ndarray]:
    wl = random_workload(n=n)
    return {c: wl.df[c].to_numpy().copy() for c in ("arrival_s", "prompt_tokens", "output_tokens", "adapter_id",
                                                      "adapter_rank")}


# 1. a Workload changed after it was built ------------------------------------------------------------------------

@pytest.mark.parametrize("change, match", [
    (lambda df: df.__setitem__("arrival_s", df["arrival_s"].where(df.index != 2, np.nan)),
     r"'arrival_s' must be finite and >= 0"),                              # (hung the run)
    (lambda df: df.__setitem__("arrival_s", df["arrival_s"].to_numpy()[::-1].copy()),
     r"must be sorted by arrival_s"),                                      # (ran with wrong TTFTs)
    (lambda df: df.__setitem__("prompt_tokens", df["prompt_tokens"].where(df.index != 2, -5)),
     r"'prompt_tokens' must be >= 1 \(row 2 has -5\)"),                    # (finished)
    (lambda df: df.__setitem__("adapter_rank", df["adapter_rank"].where(df.index != 2, 0)),
     r"need adapter_rank >= 1"),
    (lambda df: df.__setitem__("adapter_rank", df["adapter_rank"].where(df.index != 2, 64)),
     r"one rank per adapter"),
    (lambda df: df.__setitem__("request_id", np.zeros(len(df), np.int64)), r"'request_id' has duplicates"),
    (lambda df: df.__delitem__("output_tokens"), r"lacks output_tokens"),
])
def test_a_workload_changed_after_it_was_built_is_checked_again(change, match):
    wl = Workload.from_arrays(**_cols())
    change(wl.df)
    with pytest.raises(ValueError, match=match) as err:
        simulate(wl)
    assert "changed after it was built" in str(err.value)


def test_a_workload_changed_in_place_with_loc_is_refused_not_hung():
    wl = Workload.from_arrays(**_cols())
    wl.df.loc[2, "arrival_s"] = np.nan
    with pytest.raises(ValueError, match=r"'arrival_s' must be finite"):
        RequestTable(wl)  # (before: the engine's clock never advanced past the NaN)


def test_an_unchanged_workload_passes_and_columns_added_to_its_table_are_ignored():
    wl = random_workload(n=50)
    cols = workload_columns(wl)
    assert all(np.shares_memory(cols[c], wl.df[c].to_numpy()) for c in ("arrival_s", "prompt_tokens"))
    wl.df["label"] = "mine"
    assert simulate(wl).summary["requests_finished"] == 50


# 2. unsigned columns beyond int64 --------------------------------------------------------------------------------

@pytest.mark.parametrize("col, value, match", [
    ("adapter_id", 2**63 + 3, r"'adapter_id': row 3 has 9223372036854775811, beyond the int64 range"),
    ("adapter_id", 2**64 - 1, r"'adapter_id': row 3 has 18446744073709551615, beyond the int64 range"),  # (was -1)
    ("output_tokens", 2**63, r"'output_tokens': row 3 has 9223372036854775808 tokens, above"),
    ("prompt_tokens", 2**63 + 5, r"'prompt_tokens': row 3 has 9223372036854775813 tokens, above"),  # (memoryview)
    ("adapter_rank", 2**64 - 8, r"'adapter_rank': row 3 has 18446744073709551608, beyond the int64 range"),
    ("request_id", 2**64 - 1, r"'request_id': row 3 has 18446744073709551615, beyond the int64 range"),  # (was -1)
])
@pytest.mark.parametrize("how", ["mapping", "workload", "dataframe"])
def test_unsigned_values_beyond_int64_are_refused_not_wrapped(col, value, match, how):
    cols = _cols()
    if col == "request_id":
        cols[col] = np.arange(20, dtype=np.uint64)
    cols[col] = cols[col].astype(np.uint64)
    cols[col][3] = np.uint64(value)
    with pytest.raises(WorkloadError, match=match):
        if how == "mapping":
            simulate(cols)
        elif how == "dataframe":
            simulate(pd.DataFrame(cols))
        else:
            Workload(pd.DataFrame(cols))


def test_unsigned_columns_within_range_run_as_their_int64_values():
    cols = _cols()
    u = {k: (v.astype(np.uint64) if k != "arrival_s" else v) for k, v in cols.items()}
    a, b = simulate(cols), simulate(u)
    assert a.summary["requests_finished"] == b.summary["requests_finished"] == 20
    assert (a.requests["ttft_s"].to_numpy() == b.requests["ttft_s"].to_numpy()).all()


# 3. token counts whose sum would overflow ------------------------------------------------------------------------

@pytest.mark.parametrize("value", [2**63 - 1, 2**62, MAX_REQUEST_TOKENS + 1])
def test_token_counts_beyond_the_bound_are_refused_up_front(value):
    cols = _cols()
    cols["prompt_tokens"] = np.full(20, value, np.int64)  # (prompt + output wrapped: 20 requests never finished)
    with pytest.raises(WorkloadError, match=r"'prompt_tokens': row 0 has .* tokens, above the 9007199254740991"):
        Workload.from_arrays(**cols)
    with pytest.raises(WorkloadError, match=r"prompt \+ output must not overflow"):
        simulate(cols)


def test_the_largest_token_count_is_rejected_for_max_model_len_as_2_40_is():
    for value in (2**40, MAX_REQUEST_TOKENS):
        cols = _cols()
        cols["prompt_tokens"] = np.full(20, value, np.int64)
        cols["output_tokens"] = np.full(20, value, np.int64)
        s = simulate(Workload.from_arrays(**cols)).summary
        assert s["requests_rejected"] == 20 and "note" not in s


# 4. adapters without ranks ---------------------------------------------------------------------------------------

def test_adapters_without_a_rank_column_are_named_as_a_missing_column():
    cols = _cols()
    del cols["adapter_rank"]
    want = r"requests name adapters \(column adapter_id\) but the .* has no adapter_rank column; add each adapter's " \
           r"LoRA rank \(e\.g\. 8\), or use adapter_id -1 for base-model requests"
    with pytest.raises(WorkloadError, match=want):
        Workload.from_arrays(**cols)
    with pytest.raises(WorkloadError, match=want):
        simulate(cols)
    with pytest.raises(WorkloadError, match=want):
        Workload(pd.DataFrame(cols))
    cols["adapter_id"] = np.full(20, -1)  # base-model requests need no rank
    assert len(Workload.from_arrays(**cols)) == 20 and simulate(cols).summary["requests_finished"] == 20


# 5. a horizon run whose scheduler abandoned requests -------------------------------------------------------------

class _DropsPreempted(ListQueueScheduler):
    """Queues arrivals, but does not queue a preempted request again (it is lost)."""

    name = "t-drops-preempted"

    def on_preempt(self, rid):
        pass


def _preempting_run(scheduler, horizon_s):
    rng = np.random.default_rng(0)
    n = 30
    w = Workload.from_arrays(np.cumsum(rng.exponential(0.05, n)), rng.integers(100, 400, n),
                             rng.integers(200, 400, n), rng.integers(0, 4, n), np.full(n, 8))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r = simulate(w, None, EngineConfig(max_loras=4, kv_capacity_tokens=3000, max_model_len=2048),
                     scheduler_obj=scheduler, cache_obj=LRUCache(), horizon_s=horizon_s)
    return r, [c for c in caught if issubclass(c.category, NothingAdmittedWarning)]


def test_a_horizon_run_names_the_requests_its_scheduler_abandoned():
    r, warned = _preempting_run(_DropsPreempted(), None)  # (the run without a horizon had the note already)
    lost = r.summary["requests_unfinished"]
    assert lost > 0 and r.engine.preempt_d and "never finished" in r.summary["note"] and warned
    r, warned = _preempting_run(_DropsPreempted(), 3600.0)  # (before: unfinished, no note)
    assert r.summary["requests_unfinished"] == lost
    assert f"{lost} request(s) ({lost} of them preempted) were left waiting at the horizon (3600 s)" in r.summary["note"]
    assert "scheduler 't-drops-preempted'" in r.summary["note"] and warned


def test_a_horizon_that_cuts_a_busy_run_gets_no_note():
    full, _ = _preempting_run(FCFSScheduler(), None)
    assert full.summary["requests_unfinished"] == 0 and "note" not in full.summary
    end = float(np.nanmax(full.engine.finish))
    for h in (end / 4, end / 2, end * 0.99, end * 2):  # (FCFS queues preempted requests again: never stranded)
        r, warned = _preempting_run(FCFSScheduler(), h)
        assert "note" not in r.summary and not warned, h
