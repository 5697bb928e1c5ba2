"""Multi-turn conversations: later turns share the earlier turns as a prefix."""

from __future__ import annotations

import numpy as np

from traces.conversations import (ConversationConfig, fill_turn_arrivals, prefix_tokens, synthesize_conversations,
                                  turn_index)
from traces.lengths import FixedLengths


def test_prefix_is_previous_prompt_plus_output():
    conv = np.array([0, 0, 0, 1, 1])
    new = np.array([10, 5, 7, 3, 4])
    out = np.array([20, 30, 1, 2, 6])
    pre = prefix_tokens(conv, new, out)
    assert pre.tolist() == [0, 30, 65, 0, 5]
    prompt = pre + new
    assert turn_index(conv).tolist() == [0, 1, 2, 0, 1]
    # prefix_k = prompt_{k-1} + output_{k-1}
    assert pre[1] == prompt[0] + out[0] and pre[2] == prompt[1] + out[1] and pre[4] == prompt[3] + out[3]


def test_synthesized_conversations_structure_and_limits():
    cfg = ConversationConfig(enabled=True, mean_turns=4.0, max_turns=8, think_s=10.0, tpot_s=0.01)
    rng = np.random.default_rng(0)
    starts = np.sort(rng.uniform(0, 1000, 500))
    d = synthesize_conversations(starts, cfg, rng, lambda m: FixedLengths(100, 50).sample(m, rng), max_total=2000)
    conv, turn, pre, prompt, out, t = (d[k] for k in ("conversation_id", "turn", "prefix_tokens", "prompt_tokens",
                                                       "output_tokens", "arrival_s"))
    assert (prompt + out).max() <= 2000
    later = turn > 0
    assert (pre[later] == prompt[np.flatnonzero(later) - 1] + out[np.flatnonzero(later) - 1]).all()
    assert (pre[~later] == 0).all()
    assert np.all(np.diff(t)[conv[1:] == conv[:-1]] > 0)   # turns arrive in order
    assert (t[turn == 0] == starts[conv[turn == 0]]).all()
    # 100 new + 50 out per turn: turn k has prompt 150k + 100; 2000 limit -> at most 13 turns, here max 8
    assert turn.max() <= 7
    # geometric turns with mean 4 truncated at 8: E = sum_{k<8} 0.75^k
    assert abs(np.bincount(conv).mean() - cfg.expected_turns()) < 0.35


def test_fill_turn_arrivals_uses_think_time():
    cfg = ConversationConfig(think_s=20.0, tpot_s=0.0)
    conv = np.repeat(np.arange(2000), 2)
    a = np.where(np.arange(conv.size) % 2 == 0, 100.0, np.nan)
    out = np.ones(conv.size, np.int64)
    filled = fill_turn_arrivals(a, conv, out, cfg, np.random.default_rng(1))
    gaps = filled[1::2] - filled[0::2]
    assert abs(gaps.mean() - 20.0) < 1.5 and (gaps > 0).all()


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 4), st.integers(1, 500), st.integers(1, 500)), min_size=1, max_size=30))
def test_prefix_invariant_property(turns):
    # (turns in this conversation, new tokens, output tokens) per conversation
    conv = np.repeat(np.arange(len(turns)), [k for k, _, _ in turns])
    new = np.concatenate([[n] * k for k, n, _ in turns])
    out = np.concatenate([[o] * k for k, _, o in turns])
    pre = prefix_tokens(conv, new, out)
    prompt = pre + new
    tix = turn_index(conv)
    for i in range(conv.size):
        if tix[i] == 0:
            assert pre[i] == 0
        else:
            assert pre[i] == prompt[i - 1] + out[i - 1] and prompt[i] > prompt[i - 1]
