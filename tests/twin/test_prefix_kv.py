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
