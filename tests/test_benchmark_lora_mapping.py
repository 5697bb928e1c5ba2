"""``benchmarks/vllm085_lora_mapping_host.py``: its replica of vLLM 0.8.5's mapping and its fit."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "vllm085_lora_mapping_host.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("vllm085_lora_mapping_host", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_convert_mapping_replica_gives_vllm_slot_indices(bench):
    table = [None, 7, 3, None, 5]
    req = np.array([3, 0, 5], dtype=np.int32)  # adapter 0 = the base model
    tokens = tuple(req.repeat(np.array([2, 1, 3])))
    index, lora, emb, prompt = bench._convert_mapping_loop(tokens, tuple(req), table)
    assert lora == [2, 2, -1, 4, 4, 4]
    assert emb == [2, 2, 0, 4, 4, 4]
    assert prompt == [2, -1, 4]
    assert [int(x) for x in index] == [3, 3, 0, 5, 5, 5]


def test_map_tokens_skips_an_unchanged_mapping(bench, monkeypatch):
    calls = []
    monkeypatch.setattr(bench, "_convert_mapping_loop", lambda *a: calls.append(a))
    req, per = np.array([1, 2], dtype=np.int32), np.array([1, 1])
    m = bench.map_tokens(req, per, [1, 2], None)
    bench.map_tokens(req, per, [1, 2], m)
    bench.map_tokens(req, np.array([2, 1]), [1, 2], m)
    assert len(calls) == 2


def test_apply_adapters_refuses_an_unregistered_adapter(bench):
    from collections import OrderedDict

    bench.apply_adapters(np.array([1, 2, 2], dtype=np.int32), {1: 0, 2: 0}, OrderedDict.fromkeys((2, 1)))
    with pytest.raises(RuntimeError):
        bench.apply_adapters(np.array([3], dtype=np.int32), {1: 0}, OrderedDict.fromkeys((1,)))


def test_the_registered_adapters_are_read_through_vllm_s_cache_view(bench):
    """``LRUCache.cache`` (vLLM 0.8.5 ``vllm/utils.py``) is a ``UserDict`` copy of cachetools' data iterated in the
    LRU order: ``dict`` of it holds every entry, in that order (the replica must pay what vLLM's view pays, not a
    plain dict's copy)."""
    from collections import OrderedDict, UserDict
    from types import MappingProxyType

    data = {1: "a", 2: "b", 3: "c"}
    view = bench._MappingOrderCacheView(data, MappingProxyType(OrderedDict.fromkeys((3, 1, 2))))
    assert isinstance(view, UserDict) and list(dict(view).items()) == [(3, "c"), (1, "a"), (2, "b")]


def test_fit_recovers_known_constants(bench):
    a, b, c = 120.0, 30.0, 9.0
    rows = []
    for T, pos, A, N in ((256, 3.0, 8, 16), (2048, 60.0, 100, 384), (2048, 200.0, 150, 448), (512, 20.0, 30, 64)):
        rows.append({"tokens": T, "mean_position": pos, "distinct": A, "served": N,
                     "map_ms": T * (a + b * pos) * 1e-6, "apply_ms": A * N * c * 1e-6})
    fa, fb, fc = bench.fit(rows)
    assert (fa, fb, fc) == pytest.approx((a, b, c), rel=1e-9)


def test_time_case_reports_a_full_slot_table(bench):
    r = bench.time_case(slots=16, served=32, n_req=20, tokens=100, min_s=0.0)
    assert r["tokens"] == 100 and r["distinct"] <= 16
    assert 0 <= r["mean_position"] < 16
    assert r["map_ms"] > 0 and r["apply_ms"] > 0
