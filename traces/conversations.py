"""Multi-turn conversations whose later turns share the earlier turns as a prefix.

A conversation of ``K`` turns is ``K`` requests. Turn ``k`` carries ``new_k`` fresh user tokens
and produces ``out_k`` tokens; its prompt is the whole history plus the new text (the chat
template re-sends it), so

    prefix_k = prompt_{k-1} + out_{k-1} = sum_{j<k} (new_j + out_j),   prefix_0 = 0
    prompt_k = prefix_k + new_k

which is what the workload's ``prefix_tokens`` column means (the prompt tokens shared with
the previous turn; a prefix cache can reuse them).

Synthesis (:func:`synthesize_conversations`): the number of turns is geometric with mean
``mean_turns`` truncated at ``max_turns``; turn ``k >= 1`` arrives an estimated reply time plus
a user think time after turn ``k-1``:

    t_k = t_{k-1} + tpot_s * out_{k-1} + Exp(think_s)

(an open-loop approximation of the closed loop of a chat user: the workload table has no
feedback from the simulated server). Conversations start at rate ``rps / E[K]`` from a
warm-up period before the window (:meth:`ConversationConfig.warmup_s`), so the request rate in
the window is ``rps`` from its first second (fewer when the context limits cut conversations). Conversations are cut at the first turn whose prompt or
prompt + output exceeds the context limits (``max_prompt``/``max_total``), since a real client
cannot send it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np


@dataclass
class ConversationConfig:
    """Multi-turn synthesis: off by default (every request is a one-turn conversation-less request)."""

    enabled: bool = False
    mean_turns: float = 3.0
    max_turns: int = 16
    think_s: float = 30.0
    tpot_s: float = 0.02

    def warmup_s(self) -> float:
        """Seconds before the window to start conversations from, so the window sees the
        stationary mix of first and later turns: ``(max_turns - 1) * (think_s + 1000 tpot_s)``."""
        return float((self.max_turns - 1) * (self.think_s + 1000.0 * self.tpot_s))

    def expected_turns(self) -> float:
        """``E[min(G, max_turns)]`` for ``G ~ Geometric(1/mean_turns)`` on 1, 2, ..."""
        if self.mean_turns < 1:
            raise ValueError(f"mean_turns must be >= 1, got {self.mean_turns}")
        q = 1.0 - 1.0 / self.mean_turns
        k = np.arange(self.max_turns)
        return float((q**k).sum())


def _group_offsets(conv: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For sorted-by-conversation rows: index of each row's group start, and group starts."""
    n = conv.size
    starts = np.flatnonzero(np.r_[True, conv[1:] != conv[:-1]]) if n else np.zeros(0, np.int64)
    sizes = np.diff(np.r_[starts, n])
    return np.repeat(starts, sizes), starts


def exclusive_group_cumsum(values: np.ndarray, conv: np.ndarray) -> np.ndarray:
    """Sum of ``values`` over the earlier rows of the same conversation (rows grouped, in turn order)."""
    v = np.asarray(values)
    cs = np.cumsum(v) - v
    first, _ = _group_offsets(np.asarray(conv))
    return cs - cs[first]


def prefix_tokens(conv: np.ndarray, new_tokens: np.ndarray, output_tokens: np.ndarray) -> np.ndarray:
    """``prefix_k = sum_{j<k} (new_j + out_j)`` per conversation (rows grouped, in turn order)."""
    return exclusive_group_cumsum(np.asarray(new_tokens) + np.asarray(output_tokens), conv)


def turn_index(conv: np.ndarray) -> np.ndarray:
    """0-based turn number of each row (rows grouped by conversation, in turn order)."""
    first, _ = _group_offsets(np.asarray(conv))
    return np.arange(len(conv)) - first


def fill_turn_arrivals(arrival_s: np.ndarray, conv: np.ndarray, output_tokens: np.ndarray, cfg: ConversationConfig,
                       rng: np.random.Generator) -> np.ndarray:
    """Fill NaN arrivals of later turns from the conversation's first turn (reply + think time).

    Rows must be grouped by conversation in turn order and turn 0 must have a time.
    """
    a = np.asarray(arrival_s, float).copy()
    conv = np.asarray(conv)
    first, _ = _group_offsets(conv)
    prev_out = np.r_[0, np.asarray(output_tokens)[:-1]]
    is_first = np.arange(a.size) == first
    gap = np.where(is_first, 0.0, cfg.tpot_s * prev_out + rng.exponential(cfg.think_s, a.size))
    est = a[first] + exclusive_group_cumsum(gap, conv) + gap
    est = np.where(is_first, a, est)
    miss = np.isnan(a)
    a[miss] = est[miss]
    return a


def synthesize_conversations(starts: np.ndarray, cfg: ConversationConfig, rng: np.random.Generator,
                             draw_lengths: Callable[[int], tuple[np.ndarray, np.ndarray]],
                             max_prompt: int | None = None, max_total: int | None = None,
                             ) -> dict[str, np.ndarray]:
    """Requests of conversations starting at ``starts`` (one per start).

    ``draw_lengths(m)`` gives ``m`` (new user tokens, output tokens) pairs. Returns arrays
    ``arrival_s, prompt_tokens, output_tokens, prefix_tokens, conversation_id, turn`` and
    ``start_index`` (which start each request belongs to), grouped by conversation.
    """
    starts = np.asarray(starts, float)
    c = starts.size
    p_stop = 1.0 / cfg.mean_turns
    k = np.minimum(rng.geometric(p_stop, size=c), cfg.max_turns) if c else np.zeros(0, np.int64)
    conv = np.repeat(np.arange(c, dtype=np.int64), k)
    new, out = draw_lengths(int(conv.size))
    new, out = np.asarray(new, np.int64), np.asarray(out, np.int64)
    prefix = prefix_tokens(conv, new, out)
    prompt = prefix + new
    turn = turn_index(conv)
    arrival = np.where(turn == 0, starts[conv], np.nan)
    arrival = fill_turn_arrivals(arrival, conv, out, cfg, rng)
    ok = np.ones(conv.size, bool)
    if max_prompt is not None:
        ok &= prompt <= max_prompt
    if max_total is not None:
        ok &= prompt + out <= max_total
    bad_so_far = exclusive_group_cumsum((~ok).astype(np.int64), conv) + (~ok)
    keep = bad_so_far == 0
    return {"arrival_s": arrival[keep], "prompt_tokens": prompt[keep], "output_tokens": out[keep],
            "prefix_tokens": prefix[keep], "conversation_id": conv[keep], "turn": turn[keep],
            "start_index": conv[keep]}
