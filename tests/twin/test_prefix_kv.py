"""History KV (``twin/prefix_kv.py``): the kept count of blocks still being copied in, against a
walk over the nodes, through every tier move (store, swap out, swap in, copy done, drop, take,
replacement by the conversation's next turn)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

import policies  # noqa: F401  (registers the presets)
from tests.helpers import constant_profile
from traces.workload import Workload
from twin.config import EngineConfig
from twin.engine import Engine
from twin.registry import make_cache, make_scheduler


def _engine() -> Engine:
    n = 8
    w = Workload.from_arrays(np.arange(n) * 0.1, [100 + 17 * i for i in range(n)], [10] * n, [i % 3 for i in range(n)],
                             [8] * n, conversation_id=[i % 6 for i in range(n)], turn=[i // 6 for i in range(n)],
                             prefix_tokens=[0] * 6 + [50, 50])
    prof = constant_profile(c0=0.01, kv_tokens=200_000, disk_s=0.5, cpu_s=0.1)
    return Engine(w, prof, EngineConfig(max_loras=4, max_model_len=4096), make_scheduler("fcfs"), make_cache("fastlibra"))


def _walk(store, exclude=None) -> int:
    """The reclaimable history blocks the plain way: HBM blocks, less the excluded node's, less
    every node still being copied in (other than the excluded one)."""
    return store.hbm_blocks - (store.hbm_blocks_of(exclude) if exclude is not None else 0) - sum(
        n.blocks for n in store.nodes.values() if n.tier == "loading" and n is not exclude)


def test_loading_count_and_reclaimable_match_a_walk_through_every_tier_move():
    e = _engine()
    store, ext = e.history, e.extensions

    def check():
        store.check()  # hbm_blocks, loading_blocks and host tokens against walks
        for ex in (None, *store.nodes.values()):
            assert ext.history_reclaimable(ex) == _walk(store, ex)

    for rid in range(6):  # six conversations' first turns finish: six nodes in HBM
        store.on_finish(rid, 0.0)
    check()
    nodes = [store.nodes[c] for c in range(6)]
    for nd in nodes[:5]:
        assert store.swap_out(nd, 1.0) == nd.blocks
    check()
    for nd in nodes[:5]:  # copies back in flight: tier 'loading'
        assert store.swap_in(nd, 1.0)
    assert store.loading_blocks == sum(nd.blocks for nd in nodes[:5]) > 0
    check()
    store._swapped_in(nodes[0], 2.0)  # a copy done: HBM
    check()
    store.drop(nodes[1], 2.0)  # a loading node dropped
    check()
    ctx = SimpleNamespace(loads=[], load_rids=[])
    store.take(nodes[2], 10, 6, ctx, 2.0)  # a later turn takes a loading node: it waits for the copy
    assert ctx.loads and ctx.loads[0].wait is nodes[2].proc
    check()
    store.on_finish(7, 3.0)  # conversation 1's second turn (its node was dropped: a new one)
    store.on_finish(6, 3.0)  # conversation 0's second turn replaces its HBM node
    check()
    assert nodes[3].tier == "loading"
    store.on_finish(3, 3.0)  # a node replaced while its copy is in flight
    store._swapped_in(nodes[4], 3.0)
    check()
    assert store.loading_blocks == 0


from hypothesis import example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

#: random tier moves of the store: (operation, index) pairs; 'full' toggles a full pool (a turn's
#: history then goes to host memory), 'cap' toggles a host memory too small for a swap-out (it drops)
_OPS = st.lists(st.tuples(st.sampled_from(["finish", "swap_out", "swap_in", "copied", "drop", "take", "full",
                                           "cap", "resident"]), st.integers(0, 63)), max_size=60)


def _walks(store, res) -> tuple[dict, set, int]:
    """What the indexes replace, the plain way: each tier's nodes in store order, the adapters with
    a node in the pool (FastLibra's tree), and the pool blocks whose adapter is not resident."""
    tiers = {t: [n for n in store.nodes.values() if n.tier == t] for t in ("hbm", "loading", "host")}
    pool = [n for n in store.nodes.values() if n.tier in ("hbm", "loading")]
    return tiers, {n.adapter for n in pool}, sum(n.blocks for n in pool if n.adapter >= 0 and not res[n.adapter])


@settings(max_examples=150, deadline=None)
@given(_OPS)
# nodes coming back to a tier out of store order: host memory (swap-outs), then HBM (copies done)
@example([("finish", 0), ("finish", 1), ("finish", 2), ("swap_out", 1), ("swap_out", 0), ("swap_in", 1),
          ("swap_in", 0), ("copied", 1), ("copied", 0), ("resident", 1)])
def test_tier_indexes_match_walks_over_all_nodes(ops):
    """The per-tier node lists and per-adapter pool counts the store keeps as nodes move (so that the
    swapper's candidates cost no walk over every node host memory has kept) equal walks over all the
    nodes after any sequence of stores, replacements, swaps, copies, drops and takes: the same nodes
    in the same order (the swapper's ties and budget loop depend on it)."""
    n = 64
    w = Workload.from_arrays(np.arange(n) * 0.1, [100 + 37 * (i % 7) for i in range(n)], [10] * n,
                             [i % 5 - 1 for i in range(n)], [8] * n, conversation_id=[i % 9 for i in range(n)],
                             turn=[i // 9 for i in range(n)], prefix_tokens=[0] * n)
    prof = constant_profile(c0=0.01, kv_tokens=200_000, disk_s=0.5, cpu_s=0.1)
    e = Engine(w, prof, EngineConfig(max_loras=4, max_model_len=4096), make_scheduler("fcfs"), make_cache("fastlibra"))
    store, cache, mem = e.history, e.cache, e.adapters
    t = 0.0
    for op, i in ops:
        t += 0.5
        nodes = list(store.nodes.values())
        node = nodes[i % len(nodes)] if nodes else None
        if op == "finish":
            store.on_finish(i, t)
        elif op == "full":
            e.used_blocks = 0 if e.used_blocks else e.total_blocks
        elif op == "cap":
            store.host_capacity_tokens = float("inf") if store.host_capacity_tokens < 1e9 else store.host_tokens
        elif op == "resident":
            mem.mark_resident(i % 4)
        elif node is None:
            continue
        elif op == "swap_out":
            store.swap_out(node, t)
        elif op == "swap_in":
            store.swap_in(node, t)
        elif op == "copied":
            store._swapped_in(node, t)
        elif op == "drop":
            store.drop(node, t)
        else:
            store.take(node, 1, i, SimpleNamespace(loads=[], load_rids=[]), t)
        tiers, with_kv, invalid = _walks(store, mem.resident)
        assert [store.hbm_nodes(), store.host_nodes()] == [tiers["hbm"], tiers["host"]]
        assert all(a is b for a, b in zip(store.hbm_nodes() + store.host_nodes(), tiers["hbm"] + tiers["host"]))
        assert cache.adapters_with_hbm_kv() == with_kv
        before = cache._invalid_blocks_sum
        cache.sample_memory()
        assert cache._invalid_blocks_sum - before == (invalid if store.hbm_blocks else 0)
        store.check()  # the loading tier and the per-adapter block counts too


def test_a_policy_swap_in_leaves_the_running_prefills_blocks_a_demand_one_does_not():
    """A history swap-in the cache decides (FastLibra's swapper) leaves free the blocks the running prefills still
    need (``Engine.background_reserve``); a waiting request's own swap-in (``demand``) is not held back by them;
    neither starts while the running batch waits for copies in flight (``memory_stall``)."""
    e = _engine()
    store = e.history
    for rid in (0, 1):
        store.on_finish(rid, 0.0)
    a, b = store.nodes[0], store.nodes[1]
    store.swap_out(a, 1.0)
    store.swap_out(b, 1.0)
    free = e.total_blocks - e.used_blocks
    bs = e.block_size
    # a prefilling request whose prompt leaves one block too few for `a` beside it
    e.prefilling[99], e.T[99], e.held[99] = None, (free - a.blocks + 1) * bs, 0
    assert e.background_reserve() == free - a.blocks + 1
    assert not store.swap_in(a, 1.0)
    e.held[99] = 1  # (one block of its prompt allocated -- as the engine would have lent it: the reserve shrinks)
    e.used_blocks += 1
    assert e.background_reserve() == free - a.blocks
    assert not store.swap_in(a, 1.0)  # (the allocated block left the free ones too: still one short)
    e.used_blocks -= 1
    assert store.swap_in(a, 1.0)  # (the reserve one block smaller, the free blocks as before: it fits)
    e.memory_stall = True
    assert not store.swap_in(b, 1.0, demand=True)
    e.memory_stall = False
    assert store.swap_in(b, 1.0, demand=True)  # (a demand swap-in is not held back by the reserve)
    assert e.total_blocks - e.used_blocks < e.background_reserve()
