"""vLLM v1's walk over the running requests when the KV pool runs out (:class:`PreemptionWalk`).

When a step's running requests need more KV blocks than are free, vLLM v1's scheduler walks
them in admission order, giving each its tokens (one for a decoder, a chunk for a prefilling
request) and its blocks; when a request's blocks do not fit, it preempts the *last* running
request (recompute), again until they fit or the request itself was preempted. The engine
(:class:`twin.engine.Engine`) inherits the walk from this mixin; the preemption itself
(``Engine._preempt``) stays with the engine.
"""

from __future__ import annotations

import numpy as np


class PreemptionWalk:
    """The walk of :meth:`_preempt_until_fits`, in bulk or one request at a time (same results)."""

    #: walk the running requests in bulk when KV runs out (False: one at a time; same results)
    bulk_preempt_walk = True

    def _preempt_until_fits(self, now: float) -> tuple[int, list[tuple[int, int]], int]:
        """vLLM v1's running loop when KV runs out: preempt the last running request
        until the allocation of the current one fits (exact order).

        The walk over the running requests is done in bulk between the positions where
        anything but bookkeeping happens (a prefilling request, a decoder that needs a block
        when none is free, the end of the token budget): between them every request is a
        decoder that takes one token and, when its length is a multiple of the block size,
        one free block (prefix sums). :meth:`_preempt_walk_stepwise` is the same walk one
        request at a time (``bulk_preempt_walk = False``; a test checks both agree)."""
        if not self.bulk_preempt_walk:
            return self._preempt_walk_stepwise(now)
        bs = self.block_size
        running = self.running
        L = len(running)
        order = self._running_order()  # == np.fromiter(running, np.int64, L), from columns kept per admission
        ispref = self._pref_np[order]
        needy = (self._base_np[order] + self.g) % bs == 0
        needy[ispref != 0] = False
        cum = np.zeros(L + 1, np.int64)
        np.cumsum(needy, out=cum[1:])
        pref_pos = np.flatnonzero(ispref).tolist()
        free = self.total_blocks - self.used_blocks
        budget = self.config.max_num_batched_tokens
        chunks: list[tuple[int, int]] = []
        need_total = 0
        i, j, pp, npp = 0, L, 0, len(pref_pos)
        while i < j and budget > 0:
            while pp < npp and pref_pos[pp] < i:
                pp += 1
            stop = pref_pos[pp] if pp < npp and pref_pos[pp] < j else j
            if i + budget < stop:
                stop = i + budget
            # the first decoder in [i, stop) that needs a block when none is left
            x = int(np.searchsorted(cum, int(cum[i]) + free, side="right")) - 1
            if x < stop:
                stop = x
            if stop > i:  # decoders i..stop-1: one token each, blocks as their lengths require
                nb = int(cum[stop] - cum[i])
                free -= nb
                need_total += nb
                budget -= stop - i
                i = stop
                if i >= j or budget <= 0:
                    break
            rid = int(order[i])
            pref = rid in self.prefilling
            if pref:
                k = min(self.T[rid] - self.c[rid], budget)
                nd = -(-(self.c[rid] + k) // bs) - self.held[rid]
            else:
                k = 1
                nd = 1 if needy[i] else 0
            self_preempted = False
            while nd > free:
                j -= 1
                victim = int(order[j])
                free += self._preempt(victim, now)
                if victim == rid:
                    self_preempted = True
                    break
            if self_preempted:
                break
            free -= nd
            need_total += nd
            budget -= k
            if pref:
                chunks.append((rid, k))
            i += 1
        return budget, chunks, need_total

    def _preempt_walk_stepwise(self, now: float) -> tuple[int, list[tuple[int, int]], int]:
        """:meth:`_preempt_until_fits` one running request at a time (the reference walk)."""
        bs = self.block_size
        g = self.g
        order = list(self.running)
        free = self.total_blocks - self.used_blocks
        budget = self.config.max_num_batched_tokens
        chunks: list[tuple[int, int]] = []
        need_total = 0
        i = 0
        while i < len(order) and budget > 0:
            rid = order[i]
            if rid in self.prefilling:
                k = min(self.T[rid] - self.c[rid], budget)
                nd = -(-(self.c[rid] + k) // bs) - self.held[rid]
            else:
                k = 1
                nd = 1 if (self.dec[rid][0] + g) % bs == 0 else 0
            self_preempted = False
            while nd > free:
                victim = order.pop()
                free += self._preempt(victim, now)
                if victim == rid:
                    self_preempted = True
                    break
            if self_preempted:
                break
            free -= nd
            need_total += nd
            budget -= k
            if rid in self.prefilling:
                chunks.append((rid, k))
            i += 1
        return budget, chunks, need_total
