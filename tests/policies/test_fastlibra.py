"""FastLibra's corrections (issue 15, item 4) on small hand-made cases: a KV node's own visit
frequency, BS as the mean batch of the last 5 s, the unit of the time decay, asynchronous
swap-in, the vLLM baseline's host swapping with LRU and block 32, and the paper's workloads."""

from __future__ import annotations

import numpy as np
import pytest

import policies  # noqa: F401
from policies.fastlibra import DEFAULT_DECAY_UNIT_S, FastLibraCache, lora_eval, node_eval
from tests.helpers import constant_profile
from traces.arrivals import interarrival_cv
from traces.registry import get_workload
from traces.workload import Workload
from twin.config import EngineConfig
from twin.engine import Engine
from twin.prefix_kv import HistoryNode
from twin.registry import make_cache, make_scheduler
from twin.simulate import simulate


#: the profile's own LoRA term (none in the constant profile), so that step times stay c0 and the
#: expected times are by hand; FastLibra's paged LoRA compute is tested in tests/twin/test_paged_lora.py
HAND = {"lora_compute": "profile"}


def _engine(cache, workload, kv_tokens=200_000, **cfg):
    prof = constant_profile(c0=0.01, kv_tokens=kv_tokens, disk_s=0.5, cpu_s=0.1)
    c = make_cache(cache) if isinstance(cache, str) else cache
    return Engine(workload, prof, EngineConfig(max_loras=4, max_model_len=4096, **cfg), make_scheduler("fcfs"), c)


def _conversations(n_conv=2, adapter=0):
    """``n_conv`` one-turn conversations of one adapter, plus 8 other requests (10 arrivals in 0..0.9 s)."""
    n = 10
    conv = [i if i < n_conv else -1 for i in range(n)]
    return Workload.from_arrays(np.arange(n) * 0.1, [100] * n, [10] * n, [adapter] * n_conv + [1] * (n - n_conv),
                                [8] * n, conversation_id=conv, turn=[0] * n, prefix_tokens=[0] * n)


def _kv(conv, adapter=0, last=0.5, tier="hbm"):
    return HistoryNode(conv=conv, adapter=adapter, tokens=160, blocks=10, turn=0, created=0.0, last_access=last,
                       tier=tier)


def test_kv_node_probability_is_its_own_visit_frequency():
    """Two history nodes of the same adapter: the one visited three times in the window has three
    times the probability of the one visited once (visits / requests arrived in the window); the
    old rule gave both the adapter's probability halved."""
    e = _engine("fastlibra", _conversations())
    c, store = e.cache, e.history
    e.arr_ptr = 10                      # 10 requests arrived in the window
    a, b = _kv(0), _kv(1)
    store.visit_times = {0: [0.1, 0.4, 0.8], 1: [0.7]}
    assert c.node_prob(a, 1.0) == pytest.approx(3 / 10)
    assert c.node_prob(b, 1.0) == pytest.approx(1 / 10)
    # its value uses it: Eval = cost * prob * (1 - sigmoid(t)), LoRA_Eval = 1 for KV nodes
    t = (1.0 - a.last_access) / c.decay_unit_s
    assert c.values(1.0, [("kv", a)])[0] == pytest.approx(node_eval(1.0, store.transfer_s(160), 0.3, t))
    # visits older than the window no longer count
    # window (0.75, 60.75]: one visit (0.8) over the two requests that arrived in it (0.8, 0.9)
    assert c.node_prob(a, 60.75) == pytest.approx(1 / 2)
    e2 = _engine(make_cache("fastlibra", window_s=0.5), _conversations())
    e2.arr_ptr = 10
    e2.history.visit_times = {0: [0.1, 0.4, 0.8]}
    # window (0.5, 1.0]: one visit (0.8) over the 5 requests that arrived in it (0.5 .. 0.9)
    assert e2.cache.node_prob(_kv(0), 1.0) == pytest.approx(1 / 5)


def test_visits_are_recorded_once_per_request_by_the_store():
    """A conversation's turns each visit its history path once: turn 0 creates it, turn 1 matches it."""
    prof = constant_profile(c0=0.01, kv_tokens=40_000, disk_s=0.0, cpu_s=0.0)
    w = Workload.from_arrays([0.0, 5.0], [1000, 1500], [11, 5], [0, 0], [8, 8], conversation_id=[7, 7],
                             turn=[0, 1], prefix_tokens=[0, 1011])
    res = simulate(w, prof, EngineConfig(max_loras=2, max_num_seqs=8, max_model_len=4096), policy="fastlibra",
                   check_invariants=True)
    store = res.engine.history
    assert len(store.visit_times[7]) == 2 and store.lookups == 2 and store.hits == 1


def test_bs_is_the_mean_batch_size_over_the_last_5_s():
    e = _engine("fastlibra", _conversations())
    c = e.cache
    for t, b in ((0.0, 2), (1.0, 4), (3.0, 6), (6.0, 0)):
        e.running = dict.fromkeys(range(b))
        c.sample_batch_size(t)
    # window (1, 6]: samples 6 (t=3) and 0 (t=6): mean 3, not the current batch (0 -> 1)
    assert c.recent_batch_size() == pytest.approx(3.0)
    e.arr_ptr = 10
    prob = c.probs(6.0)
    want = lora_eval(prob, 3.0, e.adapters.n_resident)
    assert want != lora_eval(prob, 1.0, e.adapters.n_resident)
    a = 1
    t = (6.0 - c.last_use.get(a, 0.0)) / c.decay_unit_s
    cost = c._cpu[a] + (0.0 if a in e.adapters.cpu else c._disk[a])
    assert c.values(6.0, [("lora", a)])[0] == pytest.approx(node_eval(want, cost, float(prob[a]), t))
    with pytest.raises(ValueError, match="bs_window_s"):
        make_cache("fastlibra", bs_window_s=0)


def test_decay_unit_changes_the_ranking():
    """Node A: probability 0.5, idle 20 s; node B: probability 0.05, idle 1 s, same cost. With t in
    seconds the decay alone decides (B first: pure recency); with t in minutes (the default) the
    ten times more frequent node A ranks first."""
    def rank(unit):
        a = node_eval(1.0, 0.01, 0.5, 20.0 / unit)
        b = node_eval(1.0, 0.01, 0.05, 1.0 / unit)
        return "A" if a > b else "B"
    assert rank(1.0) == "B"
    assert rank(DEFAULT_DECAY_UNIT_S) == "A"
    # over the same pair, the ranking flips once as the unit grows
    flips = [rank(u) for u in (1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 600.0)]
    assert flips == sorted(flips, reverse=True) and flips[0] == "B" and flips[-1] == "A"
    # and through the policy: the parameter reaches values()
    for unit, first in ((1.0, "B"), (60.0, "A")):
        e = _engine(make_cache("fastlibra", decay_unit_s=unit), _conversations())
        e.arr_ptr = 10
        e.history.visit_times = {0: [0.0] * 10, 1: [19.0]}  # A: 10 visits, B: 1
        na, nb = _kv(0, last=0.0), _kv(1, last=19.0)
        va, vb = e.cache.values(20.0, [("kv", na), ("kv", nb)])
        assert ("A" if va > vb else "B") == first


def _swap_workload():
    """Request 0 (adapter 0) decodes for 100 steps; request 1 (adapter 1, not in HBM) arrives at
    0.1 s; request 2 (adapter 0) at 0.15 s."""
    return Workload.from_arrays([0.0, 0.1, 0.15], [10, 10, 10], [100, 2, 2], [0, 1, 0], [8, 8, 8])


class _SyncFastLibra(FastLibraCache):
    """FastLibra with synchronous swap-in (the copies on the admitting step), for comparison."""

    name = "test-fastlibra-sync"
    async_swap_in = False


def _swap_run(cache):
    prof = constant_profile(c0=0.01, kv_tokens=200_000, disk_s=0.0, cpu_s=0.3)
    cfg = EngineConfig(max_loras=4, max_model_len=4096)
    for mrs in (None, 1):  # exact: the same with decode-run skipping and one step at a time
        r = simulate(_swap_workload(), prof, cfg, scheduler_obj=make_scheduler("fcfs"), cache_obj=cache(),
                     check_invariants=True, max_run_steps=mrs)
        if mrs is None:
            fast = r
    assert fast.requests["ttft_s"].tolist() == r.requests["ttft_s"].tolist()
    assert fast.requests["e2e_s"].tolist() == r.requests["e2e_s"].tolist()
    return fast


def test_async_swap_in_lets_a_ready_request_run_while_another_waits():
    """Adapter 0 is copied for request 0 in [0, 0.3]; request 1's adapter 1 queues behind it on
    the host link, [0.3, 0.6]. Asynchronous: request 2 (adapter 0, ready at 0.3) runs at once
    -- first token at 0.31, TTFT 0.16 s -- and request 0's decode steps never wait for adapter 1.
    Synchronous: adapter 1's copy sits on the step that admits request 1, stalling the batch."""
    idle = {"idle": 0.0, **HAND}  # no swapper prefetch: only the demand path
    a = _swap_run(lambda: FastLibraCache(**idle))
    s = _swap_run(lambda: _SyncFastLibra(**idle))
    ra, rs = a.requests, s.requests
    assert ra.loc[2, "ttft_s"] == pytest.approx(0.3 + 0.01 - 0.15, abs=1e-9)
    assert ra.loc[1, "ttft_s"] == pytest.approx(0.6 + 0.01 - 0.1, abs=1e-9)
    assert ra.loc[1, "load_wait_s"] == pytest.approx(0.5, abs=1e-9)  # waited from 0.1 to 0.6
    assert rs.loc[2, "ttft_s"] > ra.loc[2, "ttft_s"] + 0.25               # stuck behind adapter 1's copy
    # request 0: 100 decode steps of 10 ms after its first token, none stalled with async swap-in
    assert ra.loc[0, "e2e_s"] - ra.loc[0, "ttft_s"] == pytest.approx(99 * 0.01, abs=1e-6)
    assert rs.loc[0, "e2e_s"] - rs.loc[0, "ttft_s"] > 99 * 0.01 + 0.25
    assert a.summary["swap_waits"] == 3 and a.summary["swap_in_adapters"] == 2
    # the requests that waited for their adapter count as misses
    assert a.summary["adapter_hit_rate_requests"] == 0.0 and a.summary["adapter_hit_rate"] == 0.0


def test_async_swap_in_of_history_kv():
    """A conversation's history KV swapped to host is copied back in the background while the
    next turn waits; another request runs meanwhile."""
    prof = constant_profile(c0=0.01, kv_tokens=200_000, disk_s=0.0, cpu_s=0.0)
    w = Workload.from_arrays([0.0, 5.0, 5.0], [1000, 1500, 10], [11, 5, 3], [0, 0, 0], [8, 8, 8],
                             conversation_id=[7, 7, -1], turn=[0, 1, 0], prefix_tokens=[0, 1011, 0])
    cfg = EngineConfig(max_loras=2, max_num_seqs=8, max_model_len=4096)
    eng = Engine(w, prof, cfg, make_scheduler("fcfs"), make_cache("fastlibra", idle=0.0, **HAND), check_invariants=True)
    node_store = eng.history

    def to_host(t):  # at 4 s the swapper would have swapped the idle conversation out
        for n in list(node_store.hbm_nodes()):
            node_store.swap_out(n, t)
    eng.push_event(4.0, to_host)
    eng.run()
    copy_s = node_store.transfer_s(1010)
    assert node_store.host_hits == 0 and node_store.hits == 1     # served from HBM after the swap-in
    assert eng.extensions.swap_in_kv == 1
    ttft1 = eng.first_token[1] - 5.0
    ttft2 = eng.first_token[2] - 5.0
    assert ttft2 == pytest.approx(0.01, abs=1e-9)                 # the ready request did not wait
    assert ttft1 >= copy_s


def test_ttft_breakdown_separates_lora_and_kv_cold_starts():
    """FastLibra §8 breaks TTFT into queueing, LoRA cold start and KV cold start. The adapter
    case: requests 0-2 each wait for an adapter copy (0.3 + 0.5 + 0.15 s, their load waits), no
    KV. The history case: turn 1 of conversation 7 finds its KV in host memory and waits for the
    copy back (a KV cold start, although ``prefix_host_hits`` stays 0: the hit is served from HBM
    after the asynchronous swap-in)."""
    res = _swap_run(lambda: FastLibraCache(idle=0.0, **HAND))
    a = res.summary
    assert a["lora_cold_starts"] == 3 and a["kv_cold_starts"] == 0 and a["kv_cold_start_s"] == 0.0
    assert a["lora_cold_start_s"] == pytest.approx(0.3 + 0.5 + 0.15, abs=1e-9)
    assert a["lora_cold_start_s"] == pytest.approx(res.requests["load_wait_s"].sum(), abs=1e-9)
    prof = constant_profile(c0=0.01, kv_tokens=200_000, disk_s=0.0, cpu_s=0.0)
    w = Workload.from_arrays([0.0, 5.0, 5.0], [1000, 1500, 10], [11, 5, 3], [0, 0, 0], [8, 8, 8],
                             conversation_id=[7, 7, -1], turn=[0, 1, 0], prefix_tokens=[0, 1011, 0])
    eng = Engine(w, prof, EngineConfig(max_loras=2, max_num_seqs=8, max_model_len=4096), make_scheduler("fcfs"),
                 make_cache("fastlibra", idle=0.0, **HAND), check_invariants=True)
    eng.push_event(4.0, lambda t: [eng.history.swap_out(n, t) for n in list(eng.history.hbm_nodes())])
    eng.run()
    st = eng.extensions.stats()
    wait = float(eng.load_wait[1])
    assert st["kv_cold_starts"] == 1 and st["prefix_host_hits"] == 0
    assert st["lora_cold_starts"] == 1 and st["lora_cold_start_s"] == 0.0   # turn 0's adapter (0 s copies here)
    assert st["kv_cold_start_s"] == pytest.approx(wait) and wait >= eng.history.transfer_s(1010)


def test_vllm_partition_swaps_history_kv_to_host_lru_and_back():
    """vllm-partition: blocks of 32 tokens, 20 % of the pool for LoRA slots. Two conversations
    leave history KV; a long request needs the KV part: the least recently used history (A)
    goes to host memory, not away; A's next turn copies it back (a host hit), B's is an HBM hit."""
    prof = constant_profile(c0=0.01, kv_tokens=10_000, disk_s=0.0, cpu_s=0.001)
    w = Workload.from_arrays([0.0, 1.0, 2.0, 3.0, 3.5], [1000, 1000, 6500, 1500, 1500], [10, 10, 5, 5, 5],
                             [0, 0, 1, 0, 0], [8, 8, 8, 8, 8], conversation_id=[0, 1, -1, 0, 1],
                             turn=[0, 0, 0, 1, 1], prefix_tokens=[0, 0, 0, 1010, 1010])
    cfg = EngineConfig(max_loras=2, max_num_seqs=8, max_model_len=7000)
    res = simulate(w, prof, cfg, policy="vllm-partition", check_invariants=True)
    s = res.summary
    assert s["kv_block_size"] == 32 and res.engine.block_size == 32
    assert s["kv_capacity_tokens"] == 8000                       # 80 % of the 10,000-token pool
    assert s["history_dropped"] == 0 and s["history_stored"] == 4
    assert s["prefix_hits"] == 2 and s["prefix_host_hits"] == 1
    per_tok = 131072
    assert s["kv_swapped_out_gb"] == pytest.approx(1009 * per_tok / 1e9)   # only A's node went out
    assert s["kv_swapped_in_gb"] == pytest.approx(1009 * per_tok / 1e9)    # and came back on reuse
    r = res.requests
    # A's turn waits for the synchronous copy, B's does not
    assert r.loc[3, "load_wait_s"] > 0 and r.loc[4, "load_wait_s"] == 0


def test_fastlibra_workloads_statistics():
    """The named workloads carry the statistics they document."""
    w = get_workload("fastlibra-chatbot", duration=1200.0, rps=2.0, seed=0)
    df = w.df
    new = (df["prompt_tokens"] - df["prefix_tokens"]).to_numpy()
    assert abs(new.mean() / 69.5 - 1) < 0.15 and abs(df["output_tokens"].mean() / 214.5 - 1) < 0.15
    first = df[df["turn"] == 0]
    early = first[first["arrival_s"] < 600]["conversation_id"]
    turns = df[df["conversation_id"].isin(early)].groupby("conversation_id")["turn"].max() + 1
    assert abs(turns.mean() - 2.0) < 0.25
    assert (df["prefix_tokens"][df["turn"] > 0] > 0).all()         # every later turn resends the history
    assert set(df["adapter_rank"].unique()) <= {32, 64} and df["adapter_id"].nunique() <= 50
    assert get_workload("fastlibra-chatbot", duration=300.0, adapters=20, seed=0).df["adapter_id"].nunique() <= 20
    assert get_workload("fastlibra-chatbot", duration=300.0, adapters=100, seed=0).df["adapter_id"].nunique() > 50
    t = get_workload("fastlibra-translation", duration=600.0, seed=0).df
    assert "conversation_id" not in t or (t["conversation_id"] < 0).all() or t["turn"].max() == 0
    assert abs(interarrival_cv(t["arrival_s"].to_numpy()) - 2.0) < 0.4   # bursty, Azure-Functions-like
    top = t["adapter_id"].value_counts(normalize=True)
    assert top.iloc[0] > 0.1 and top.iloc[0] > 5 * top.iloc[-1]         # a skewed per-function popularity
    g = get_workload("fastlibra-agent", duration=1200.0, seed=0).df
    starts = g[(g["turn"] == 0) & (g["arrival_s"] < 300)]["conversation_id"]
    agent_turns = g[g["conversation_id"].isin(starts)].groupby("conversation_id")["turn"].max() + 1
    assert agent_turns.mean() > 2 * turns.mean()                        # the longest conversations


def test_swaps_update_a_node_last_used_time():
    """FastLibra §4.1: a node's metadata (last-used time) updates when it is created, matched or
    swapped. A KV node created at 0.5 s and swapped out at 3 s is last used at 3 s; its swap-in,
    ending at 7 s + the copy, moves it again; an adapter swapped out at 4 s is last used at 4 s.
    The swap-in ranking sees it: t in Eval counts from the swap, not from the creation."""
    e = _engine("fastlibra", _conversations())
    c, store = e.cache, e.history
    e.run()
    node = next(iter(store.nodes.values()))
    assert node.tier == "hbm" and node.last_access < 3.0
    store.swap_out(node, 3.0)
    assert node.tier == "host" and node.last_access == 3.0
    e.arr_ptr = 10
    store.visit_times[node.conv] = [2.0]
    v = c.values(3.5, [("kv", node)])[0]
    assert v == pytest.approx(node_eval(1.0, store.transfer_s(node.tokens), c.node_prob(node, 3.5),
                                        0.5 / c.decay_unit_s))
    assert store.swap_in(node, 7.0)
    store._swapped_in(node, 7.25)
    assert node.tier == "hbm" and node.last_access == 7.25
    a = next(x for x in e.adapters.evictable())
    e.adapters.evict(a, 4.0)
    assert c.last_use[a] == 4.0
    # stores of other policies (vllm-partition's LRU) keep last use = last real use
    e2 = _engine("partition-lru", _conversations())
    e2.run()
    n2 = next(iter(e2.history.nodes.values()))
    t_used = n2.last_access
    e2.history.swap_out(n2, 3.0)
    assert n2.last_access == t_used


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

NOW = 100.0
#: a KV node: (visits in the window, visits before it, idle seconds (50000 s: the decay underflows to 0), tokens)
_NODE = st.tuples(st.integers(0, 3), st.integers(0, 2), st.sampled_from([0.5, 30.0, 600.0, 50_000.0]),
                  st.sampled_from([16, 160, 1600]))


def _tree_state(cache: str, nodes: list, lora_idle: list[float]):
    """Adapters 0..3 in HBM and idle, 20 requests of adapters 0..2 in the window (3's only request is
    older: ``prob`` 0), and the history KV ``nodes`` in HBM (adapters 0..3 in turn)."""
    n = 21
    w = Workload.from_arrays([0.0] + [NOW - 10.0 + i * 0.5 for i in range(n - 1)], [100] * n, [10] * n,
                             [3] + [i % 3 for i in range(n - 1)], [8] * n, conversation_id=list(range(n)),
                             turn=[0] * n, prefix_tokens=[0] * n)
    e = _engine(cache, w, kv_tokens=2_000_000)
    c, mem, store = e.cache, e.adapters, e.history
    e.arr_ptr = n
    for a, idle in enumerate(lora_idle):
        mem.mark_resident(a)
        c.last_use[a] = NOW - idle
    for j, (visits, old, idle, tokens) in enumerate(nodes):
        store.insert(HistoryNode(conv=j, adapter=j % 4, tokens=tokens, blocks=-(-tokens // e.block_size), turn=0,
                                 created=0.0, last_access=NOW - idle))
        store.visit_times[j] = [NOW - 200.0] * old + [NOW - 1.0] * visits
    return e


def _plain_lowest(c, cands, term):
    vals = c.values(NOW, cands, term)
    i = int(np.argmin(vals))
    return i, vals[i]


@settings(max_examples=120, deadline=None)
@given(st.sampled_from(["fastlibra", "fastlibra-wom", "fastlibra-wol", "fastlibra-wos"]),
       st.lists(_NODE, max_size=25),
       st.lists(st.sampled_from([0.0, 5.0, 600.0, 50_000.0]), min_size=4, max_size=4),
       st.sampled_from([None, 1.0, 3.0]), st.sampled_from(["", "nan", "negative"]))
def test_lowest_is_argmin_over_all_values(cache, nodes, lora_idle, term, odd):
    """The swap-out choice (:meth:`FastLibraCache._lowest`) stops at the first KV node without a
    visit in the window (value 0): the same index and value as ``np.argmin`` over every candidate's
    value, also with old visits,
    decays that underflow to 0 with visits, LoRA_Eval given, and with a LoRA value that is NaN (an
    infinite load time with ``prob`` 0) or negative, where it computes them all."""
    e = _tree_state(cache, nodes, lora_idle)
    c = e.cache
    if odd == "nan":
        c._cpu[3] = float("inf")
        assert np.isnan(c.values(NOW, [("lora", 3)])[0]) or not c.cost_model
    elif odd == "negative":
        c._cpu[2] = -1.0
    cands = c.swap_out_candidates()
    if not cands:
        return
    i, low = c._lowest(NOW, cands, term)
    j, want = _plain_lowest(c, cands, term)
    assert i == j and (low == want or (np.isnan(low) and np.isnan(want)))


def test_a_swap_out_does_not_value_the_nodes_after_an_unvisited_one():
    """Among the HBM nodes (store order) the first without a visit in the window has value 0: the
    lowest. The choice asks the visits of the nodes up to it only, however many nodes follow (the
    histories of finished conversations that FastLibra keeps), and is the plain argmin's."""
    for n in (100, 1000):
        nodes = [(2, 0, 30.0, 160)] * 10 + [(0, 1, 30.0, 160)] * (n - 10)
        e = _tree_state("fastlibra", nodes, [0.0, 5.0, 600.0, 60.0])
        c, store = e.cache, e.history
        asked = []
        visits_since = store.visits_since
        store.visits_since = lambda node, t0: asked.append(node) or visits_since(node, t0)
        cands, low, i = c._choose(NOW)
        assert len({id(x) for x in asked}) == 11 and cands[i] == ("kv", store.nodes[10]) and low == 0.0
        store.visits_since = visits_since
        assert (i, low) == _plain_lowest(c, cands, None)


class _CountingNodes(dict):
    """The store's node dict, counting the walks over it."""

    walks = 0

    def values(self):
        type(self).walks += 1
        return super().values()


def test_swapper_ticks_do_not_walk_all_the_nodes():
    """A busy swapper tick (samples, swap-outs, the tree's leaves) and an adapter victim read the
    store's tier indexes and per-adapter counts, never a walk over all its nodes (host memory keeps
    every finished conversation's history, so that walk grows with the run)."""
    nodes = [(0, 1, 30.0, 160)] * 300
    e = _tree_state("fastlibra", nodes, [0.0, 5.0, 600.0, 60.0])
    c, store = e.cache, e.history
    for node in list(store.nodes.values())[:200]:
        store.swap_out(node, NOW - 1.0)
    store.nodes = _CountingNodes(store.nodes)
    c.victim(NOW)
    e.used_blocks = e.total_blocks - 1
    c.on_tick(NOW)
    assert c.swaps_out > 0
    assert _CountingNodes.walks == 0
    store.check()
    assert _CountingNodes.walks > 0  # the invariant check walks (and counts)
