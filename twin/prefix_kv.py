"""History KV caches of multi-turn conversations, reused as a prefix by the next turn.

The workload's ``conversation_id``, ``turn`` and ``prefix_tokens`` columns describe chats
whose turn ``k`` re-sends the whole history (``prefix_k = prompt_{k-1} + output_{k-1}``,
see :mod:`traces.conversations`). When turn ``k-1`` finishes, its KV cache (the
``prompt + output - 1`` tokens it computed) can be kept as a *history node*; turn ``k`` then
starts its prefill at the cached length instead of 0 (vLLM's automatic prefix caching,
SGLang's RadixAttention, and FastLibra's history KV caches all do this).

A node lives in one tier:

* ``hbm`` -- its blocks are taken from the engine's KV pool (``engine.total_blocks`` shrinks
  by them), so it competes with running requests and, in the unified pool, with adapters.
  A hit hands the blocks to the request: no transfer, the prefix is not recomputed.
* ``host`` -- swapped out to host memory (FastLibra §4: "swap out leaves in HBM"). A hit
  copies it back over the host link on the critical path of the admitting step (a
  synchronous :class:`~twin.adapters.Load`); the swapper of a cache policy can also bring
  it back in the background (:meth:`HistoryKV.swap_in`, asynchronous over the link), and with
  a policy's ``async_swap_in`` the next turn waits for such a background copy instead
  (:meth:`twin.extensions.Extensions._await_swaps`).
* ``loading`` -- an asynchronous swap-in in flight (blocks already reserved); a hit waits for it.

A node a waiting request waits for (or will take once its adapter lands) is *held* for it
(``HistoryNode.held``, :meth:`HistoryKV.hold`; :meth:`twin.extensions.Extensions._await_swaps`) until
that request is admitted or leaves the queue: it is neither reclaimable (``held_hbm_blocks``) nor a
swap-out candidate.

Swap-outs (GPU -> host) use the other direction of the full-duplex PCIe link, so they do
not queue behind host-to-GPU loads; they free the HBM blocks at once and are counted in
``kv_swapped_out_gb``.

The store is a mechanism; which nodes to keep, swap or drop is the cache policy's
decision: ``policy.history_tier(node, now)`` at a turn's end (default: ``"hbm"`` when free
blocks allow, else drop) and :meth:`twin.extensions.Extensions.reclaim` under memory pressure
(default: drop the least recently used HBM node first).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from twin.adapters import LinkCopy, Load

if TYPE_CHECKING:  # pragma: no cover
    from twin.interfaces import EngineCore, StepContextView


@dataclass
class HistoryNode:
    """The KV cache of one conversation's history (all turns so far)."""

    conv: int
    adapter: int        # dense adapter index (-1: base model); the node's parent in FastLibra's tree
    tokens: int         # tokens with KV
    blocks: int
    turn: int           # the turn that produced it
    created: float
    last_access: float
    tier: str = "hbm"   # 'hbm' | 'host' | 'loading'
    hits: int = 0
    proc: Any = None    # swap-in process while loading
    copy: Any = None    # ... and its place on the host link (twin.adapters.LinkCopy: HostLink.loads_end)
    seq: int = -1       # the store's insertion number: the nodes' order in ``HistoryKV.nodes``
    #: waiting requests that hold the node in the pool while they wait for their swap-ins (asynchronous swap-in:
    #: :meth:`twin.extensions.Extensions._await_swaps`); a held node is never swapped out or dropped to make room
    held: int = 0


class HistoryKV:
    """Per-conversation history nodes in HBM or host memory (see the module docstring)."""

    def __init__(self, engine: "EngineCore", conv: np.ndarray, turn: np.ndarray, prefix: np.ndarray,
                 host_capacity_tokens: float = float("inf")) -> None:
        self.e = engine
        self.cache = engine.cache
        self.conv = conv.astype(np.int64).tolist()
        self.turn = turn.astype(np.int64).tolist()
        self.prefix = prefix.astype(np.int64).tolist()
        self.nodes: dict[int, HistoryNode] = {}
        #: the nodes of each tier by insertion number, kept as they move so that listing a tier
        #: (the swapper's candidates, every tick) costs no walk over all the nodes -- host memory
        #: keeps every finished conversation's history, so ``nodes`` grows with the run; a tier in
        #: ``_unsorted`` has had a node come back out of order (:meth:`_tier_nodes` sorts it)
        self._tiers: dict[str, dict[int, HistoryNode]] = {"hbm": {}, "loading": {}, "host": {}}
        self._unsorted: set[str] = set()
        self._next_seq = 0
        #: per adapter, the nodes and blocks in the pool (tiers ``hbm`` and ``loading``; adapters
        #: with none are absent): FastLibra's tree asks which adapters have a KV child in HBM
        self.pool_nodes_of: dict[int, int] = {}
        self.pool_blocks_of: dict[int, int] = {}
        self.hbm_blocks = 0
        #: blocks of the nodes still being copied in (tier 'loading'; part of ``hbm_blocks``), kept
        #: as a count so that the reclaimable memory an admission checks costs no walk over the nodes
        self.loading_blocks = 0
        #: blocks of the nodes in HBM (tier ``hbm``) that waiting requests hold (:meth:`hold`): not reclaimable
        self.held_hbm_blocks = 0
        self.host_tokens = 0
        self.host_capacity_tokens = host_capacity_tokens
        kvp = engine.profile.components["kv"].params
        self.kv_bytes_per_token = int(kvp.get("kv_bytes_per_token") or engine.profile.model.kv_bytes_per_token)
        lp = engine.profile.components["load"].params
        self._fixed_s = float(lp.get("cpu_fixed_s", 0.0))
        self._gbps = float(lp.get("cpu_gbps", 25.0))
        # counters
        self.lookups = 0
        self.hits = 0
        self.hit_tokens = 0
        self.host_hits = 0
        self.stored = 0
        self.dropped = 0
        self.swapped_out_bytes = 0
        self.swapped_in_bytes = 0
        #: requests already counted as lookups (a request retried at later steps counts once)
        self._looked_up: set[int] = set()
        #: the tree's per-node visit metadata (FastLibra §4.1: "visit frequency, last-used time
        #: and size"): per conversation, the times of the requests that visited its history path
        #: -- the request that created it (a first turn, or a turn that found no history) and each
        #: later turn that matched it; one visit per request (see :meth:`visits_since`)
        self.visit_times: dict[int, list[float]] = {}
        self._visited: set[int] = set()

    # -- costs
    def transfer_s(self, tokens: int) -> float:
        """Host <-> GPU copy time of ``tokens`` of KV (the profile's CPU->GPU link model)."""
        return self._fixed_s + tokens * self.kv_bytes_per_token / (self._gbps * 1e9)

    def node_bytes(self, node: HistoryNode) -> int:
        return node.tokens * self.kv_bytes_per_token

    # -- a turn ends: keep its KV as the conversation's history
    def on_finish(self, rid: int, now: float) -> None:
        cv = self.conv[rid]
        if cv < 0:
            return
        e = self.e
        if rid not in self._visited:  # created by a request that did not match it (one visit per request)
            self._visit(cv, rid, now)
        old = self.nodes.get(cv)
        if old is not None:
            self._release(old)
            self._remove(old)
        tokens = int(e.prompt_a[rid] + e.output_a[rid] - 1)
        if tokens <= 0:
            return
        node = HistoryNode(cv, int(e.adapter_a[rid]), tokens, -(-tokens // e.block_size), self.turn[rid], now, now)
        tier = self.cache.history_tier(node, now)
        if not (tier == "hbm" and node.blocks <= e.total_blocks - e.used_blocks):
            if tier not in ("hbm", "host") or self.host_tokens + tokens > self.host_capacity_tokens:
                self.dropped += 1
                return
            node.tier = "host"
            self.swapped_out_bytes += self.node_bytes(node)
        self.insert(node)
        self.stored += 1
        self.cache.on_history(node, "store", now)

    def insert(self, node: HistoryNode) -> None:
        """Put ``node`` (tier ``hbm`` or ``host``) into the store as its conversation's history: an
        HBM node's blocks are lent from the pool, a host node's tokens take host memory (the caller
        has checked that they fit)."""
        if node.tier == "hbm":
            self.e.lend_blocks(node.blocks)
            self.hbm_blocks += node.blocks
        else:
            self.host_tokens += node.tokens
        node.seq = self._next_seq
        self._next_seq += 1
        self.nodes[node.conv] = node
        self._enter(node)

    # -- a later turn is admitted
    def match(self, rid: int, T: int) -> tuple[int, HistoryNode | None]:
        """Tokens of ``rid``'s prompt its conversation's history node can serve (and the node)."""
        cv = self.conv[rid]
        if cv < 0:
            return 0, None
        if rid not in self._looked_up:
            self._looked_up.add(rid)
            self.lookups += 1
        node = self.nodes.get(cv)
        if node is None or node.turn >= self.turn[rid]:
            return 0, None
        h = min(self.prefix[rid], node.tokens, T - 1)
        return (h, node) if h > 0 else (0, None)

    def take(self, node: HistoryNode, h: int, rid: int, ctx: "StepContextView", now: float) -> None:
        """The request takes the node's KV (the node leaves the store)."""
        self.hits += 1
        self.hit_tokens += h
        node.hits += 1
        self._visit(node.conv, rid, now)
        self._remove(node)
        if node.tier == "hbm":
            self.e.return_blocks(node.blocks)
            self.hbm_blocks -= node.blocks
        elif node.tier == "loading":
            self.e.return_blocks(node.blocks)
            self.hbm_blocks -= node.blocks
            self.loading_blocks -= node.blocks
            ctx.loads.append(Load(-1, "wait", 0.0, 0.0, 0, wait=node.proc, copies=0, copy=node.copy))
            ctx.load_rids.append(rid)
        else:  # host: copy back on the critical path
            self.host_hits += 1
            self.host_tokens -= node.tokens
            nbytes = h * self.kv_bytes_per_token
            self.swapped_in_bytes += nbytes
            ctx.loads.append(Load(-1, "kv", 0.0, self.transfer_s(h), nbytes))
            ctx.load_rids.append(rid)
        self.cache.on_history(node, "take", now)

    def hbm_blocks_of(self, node: HistoryNode) -> int:
        """Blocks the node holds in the pool now (a hit frees them for the request)."""
        return node.blocks if node.tier in ("hbm", "loading") else 0

    # -- visit frequency (FastLibra's per-node metadata)
    def _visit(self, cv: int, rid: int, now: float) -> None:
        self._visited.add(rid)
        self.visit_times.setdefault(cv, []).append(now)

    def visits_since(self, node: HistoryNode, t0: float) -> int:
        """Visits of ``node``'s history path at times ``>= t0`` (its own visit frequency in a
        window). A conversation's node is the path of all its turns so far, so every turn that
        created or matched it visited it; old visit times are pruned as the window moves."""
        ts = self.visit_times.get(node.conv)
        if not ts:
            return 0
        i = 0
        while i < len(ts) and ts[i] < t0:
            i += 1
        if i:
            del ts[:i]
        return len(ts)

    # -- tier moves (a cache policy's swapper or the reclaimer calls these)
    def _release(self, node: HistoryNode) -> None:
        if node.tier in ("hbm", "loading"):
            self.e.return_blocks(node.blocks)
            self.hbm_blocks -= node.blocks
            if node.tier == "loading":
                self.loading_blocks -= node.blocks
        elif node.tier == "host":
            self.host_tokens -= node.tokens

    def drop(self, node: HistoryNode, now: float) -> int:
        """Discard a node; returns the HBM blocks freed."""
        freed = self.hbm_blocks_of(node)
        self._release(node)
        self._remove(node)
        self.dropped += 1
        self.cache.on_history(node, "drop", now)
        return freed

    def swap_out(self, node: HistoryNode, now: float) -> int:
        """HBM -> host (falls back to dropping when host memory is full); returns blocks freed."""
        if node.tier != "hbm":
            return 0
        if self.host_tokens + node.tokens > self.host_capacity_tokens:
            return self.drop(node, now)
        self.e.return_blocks(node.blocks)
        self.hbm_blocks -= node.blocks
        self.host_tokens += node.tokens
        self._move(node, "host")
        self.swapped_out_bytes += self.node_bytes(node)
        self.cache.on_history(node, "swap_out", now)
        return node.blocks

    def swap_in(self, node: HistoryNode, now: float, demand: bool = False) -> bool:
        """Host -> HBM in the background over the host link (blocks reserved now); not while the running batch
        waits for copies in flight to land (``engine.memory_stall``). A swap-in the cache policy decides (not a
        waiting request's own, ``demand``) leaves the running prefills' blocks free (``engine.background_reserve``)."""
        e = self.e
        if node.tier != "host" or e.memory_stall:
            return False
        if node.blocks > e.total_blocks - e.used_blocks - (0 if demand else e.background_reserve()):
            return False
        e.lend_blocks(node.blocks)
        self.hbm_blocks += node.blocks
        self.loading_blocks += node.blocks
        self.host_tokens -= node.tokens
        self._move(node, "loading")
        nbytes = self.node_bytes(node)
        self.swapped_in_bytes += nbytes
        dur = self.transfer_s(node.tokens)
        node.copy = LinkCopy(now, dur)  # (its end on the FIFO link: HostLink.loads_end)
        gen = e.link.transfer(nbytes, dur, node.copy)
        end = e.link.free_at
        node.proc = e.env.process(gen)
        self.e.push_event(end, lambda t, n=node: self._swapped_in(n, t))
        return True

    def _swapped_in(self, node: HistoryNode, now: float) -> None:
        if node.tier == "loading" and self.nodes.get(node.conv) is node:
            self._move(node, "hbm")
            self.loading_blocks -= node.blocks
            node.proc = node.copy = None
            self.cache.on_history(node, "swap_in", now)

    # -- nodes held for waiting requests (asynchronous swap-in)
    def in_store(self, node: HistoryNode) -> bool:
        """Whether ``node`` is still its conversation's node in the store (not taken, dropped or replaced)."""
        return self._tiers[node.tier].get(node.seq) is node

    def hold(self, node: HistoryNode) -> None:
        """A waiting request holds ``node`` until it is admitted or leaves the queue (:meth:`unhold`): a node in HBM
        (or being copied there) stays there, it is not reclaimable (:attr:`held_hbm_blocks`) and a cache policy's
        swap-out leaves it (FastLibra's candidates skip held nodes)."""
        if node.held == 0 and node.tier == "hbm" and self.in_store(node):
            self.held_hbm_blocks += node.blocks
        node.held += 1

    def unhold(self, node: HistoryNode) -> None:
        """One holder of ``node`` (:meth:`hold`) was admitted or left the queue."""
        node.held -= 1
        if node.held == 0 and node.tier == "hbm" and self.in_store(node):
            self.held_hbm_blocks -= node.blocks

    # -- the tier indexes (the order of ``nodes`` within each tier)
    def _enter(self, node: HistoryNode) -> None:
        """``node`` joins the index of its tier (and, in the pool, its adapter's counts)."""
        d = self._tiers[node.tier]
        if d and node.seq < next(reversed(d)):
            self._unsorted.add(node.tier)
        d[node.seq] = node
        if node.held and node.tier == "hbm":
            self.held_hbm_blocks += node.blocks
        if node.tier != "host":
            a = node.adapter
            self.pool_nodes_of[a] = self.pool_nodes_of.get(a, 0) + 1
            self.pool_blocks_of[a] = self.pool_blocks_of.get(a, 0) + node.blocks

    def _leave(self, node: HistoryNode) -> None:
        """``node`` leaves the index of its tier (and, in the pool, its adapter's counts)."""
        del self._tiers[node.tier][node.seq]
        if node.held and node.tier == "hbm":
            self.held_hbm_blocks -= node.blocks
        if node.tier != "host":
            a = node.adapter
            if self.pool_nodes_of[a] == 1:
                del self.pool_nodes_of[a], self.pool_blocks_of[a]
            else:
                self.pool_nodes_of[a] -= 1
                self.pool_blocks_of[a] -= node.blocks

    def _move(self, node: HistoryNode, tier: str) -> None:
        """``node`` changes tier (it keeps its place in the order of ``nodes``)."""
        self._leave(node)
        node.tier = tier
        self._enter(node)

    def _remove(self, node: HistoryNode) -> None:
        """``node`` leaves the store (its memory is the caller's to account)."""
        del self.nodes[node.conv]
        self._leave(node)

    def _tier_nodes(self, tier: str) -> list[HistoryNode]:
        """The nodes in ``tier``, in the order of ``nodes`` (insertion)."""
        d = self._tiers[tier]
        if tier in self._unsorted:
            self._tiers[tier] = d = dict(sorted(d.items()))
            self._unsorted.discard(tier)
        return list(d.values())

    def hbm_nodes(self) -> list[HistoryNode]:
        """The nodes in HBM (not those being copied in), in the order of ``nodes``."""
        return self._tier_nodes("hbm")

    def host_nodes(self) -> list[HistoryNode]:
        """The nodes in host memory, in the order of ``nodes``."""
        return self._tier_nodes("host")

    def loading_nodes(self) -> list[HistoryNode]:
        """The nodes being copied into HBM, in the order of ``nodes``."""
        return self._tier_nodes("loading")

    def check(self) -> None:
        hb = sum(n.blocks for n in self.nodes.values() if n.tier in ("hbm", "loading"))
        assert hb == self.hbm_blocks, f"history KV: HBM blocks {hb} != {self.hbm_blocks}"
        lb = sum(n.blocks for n in self.nodes.values() if n.tier == "loading")
        assert lb == self.loading_blocks, f"history KV: loading blocks {lb} != {self.loading_blocks}"
        held = sum(n.blocks for n in self.nodes.values() if n.tier == "hbm" and n.held)
        assert held == self.held_hbm_blocks, f"history KV: held HBM blocks {held} != {self.held_hbm_blocks}"
        assert all(n.held >= 0 for n in self.nodes.values()), "history KV: a node held a negative number of times"
        ht = sum(n.tokens for n in self.nodes.values() if n.tier == "host")
        assert ht == self.host_tokens, "history KV: host tokens out of sync"
        for tier in self._tiers:
            walk = [n for n in self.nodes.values() if n.tier == tier]
            assert self._tier_nodes(tier) == walk, f"history KV: the {tier} index is out of sync with the nodes"
        pool = [n for n in self.nodes.values() if n.tier != "host"]
        counts: dict[int, int] = {}
        blocks: dict[int, int] = {}
        for n in pool:
            counts[n.adapter] = counts.get(n.adapter, 0) + 1
            blocks[n.adapter] = blocks.get(n.adapter, 0) + n.blocks
        assert counts == self.pool_nodes_of and blocks == self.pool_blocks_of, \
            "history KV: the per-adapter pool counts are out of sync with the nodes"

    def stats(self) -> dict[str, Any]:
        return {"prefix_lookups": self.lookups, "prefix_hits": self.hits,
                "prefix_hit_rate": self.hits / self.lookups if self.lookups else None,
                "prefix_hit_tokens": self.hit_tokens, "prefix_host_hits": self.host_hits,
                "history_stored": self.stored, "history_dropped": self.dropped,
                "kv_swapped_out_gb": self.swapped_out_bytes / 1e9, "kv_swapped_in_gb": self.swapped_in_bytes / 1e9}
