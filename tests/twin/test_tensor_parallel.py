"""Tensor parallelism (twin/tensor_parallel.py): valid degrees, KV capacity per degree by hand, measured
TP timings used over the analytical split, LoRA and load splits, model shapes of Llama-13B/30B."""

from __future__ import annotations

import copy

import pytest

from traces.workload import Workload
from twin.config import EngineConfig
from twin.model_spec import get_model
from twin.perf.profile import Profile, load_profile
from twin.simulate import simulate
from twin.tensor_parallel import (TensorParallelError, check_degree, kv_bytes_per_token_per_rank,
                                  kv_capacity_tokens, lora_buffer_share, measured_degrees, tp_profile, valid_degrees)

A100_7B = "llama-2-7b_a100-80gb_vidur"


# ------------------------------------------------------------------------------------ shapes
def test_llama_13b_and_30b_published_shapes():
    m13, m30 = get_model("llama-13b"), get_model("llama-30b")
    assert (m13.layers, m13.hidden, m13.heads, m13.kv_heads, m13.intermediate, m13.vocab) == (
        40, 5120, 40, 40, 13824, 32000)
    assert (m30.layers, m30.hidden, m30.heads, m30.kv_heads, m30.intermediate, m30.vocab) == (
        60, 6656, 52, 52, 17920, 32000)
    assert get_model("llama-33b") is m30 and m30.head_dim == 128 and m13.head_dim == 128
    for m, published in ((m13, 13.0e9), (m30, 32.5e9)):
        # parameters from the shapes: 4 h^2 (attention) + 3 h i (gated MLP) per layer, embedding + LM head
        n = m.layers * (4 * m.hidden ** 2 + 3 * m.hidden * m.intermediate) + 2 * m.vocab * m.hidden
        assert n == pytest.approx(published, rel=0.02)
        assert m.weight_bytes == int(published * 2)
    assert m30.kv_bytes_per_token == 2 * 60 * 52 * 128 * 2 == 1_597_440


# ------------------------------------------------------------------------------------ degrees
def test_valid_degrees_follow_vllm_head_rule():
    assert valid_degrees(get_model("llama-30b")) == [1, 2, 4, 13, 26, 52]
    assert valid_degrees(get_model("llama-2-13b"), 8) == [1, 2, 4, 5, 8]
    # grouped-query attention: 8 KV heads replicated beyond TP 8
    assert valid_degrees(get_model("llama-3.1-8b")) == [1, 2, 4, 8, 16, 32]
    with pytest.raises(TensorParallelError, match=r"degree 8 does not divide llama-30b's 52 attention heads and 52 "
                                                  r"KV heads .*use one of 1, 2, 4, 13, 26, 52"):
        check_degree(get_model("llama-30b"), 8)
    with pytest.raises(TensorParallelError, match="positive integer"):
        check_degree(get_model("llama-30b"), 0)
    with pytest.raises(TensorParallelError, match="use one of"):
        tp_profile(load_profile("llama-30b_a100-80gb_vidur"), 8)


def test_invalid_degree_refused_by_twin_run(capsys):
    from twin.cli import main

    rc = main(["run", "--profile", "llama-30b_a100-80gb_vidur", "--tp", "8", "--duration", "5"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "--tp 8 does not divide llama-30b's 52 attention heads" in err and "use one of 1, 2, 4, 13, 26, 52" in err
    assert "Traceback" not in err


def test_weights_that_do_not_fit_name_the_degree_that_does(capsys):
    from twin.cli import main

    rc = main(["run", "--profile", "llama-30b_a100-80gb_vidur", "--duration", "5"])
    err = capsys.readouterr().err
    assert rc == 2 and "--tp 2 holds it" in err


# ------------------------------------------------------------------------------------ KV capacity
def test_kv_capacity_per_degree_by_hand():
    """Llama-2-7B on the A100-80GB profile, 8 slots of rank 16, by hand from the profile's constants."""
    p = load_profile(A100_7B)
    kv = p.components["kv"].params
    w = 6.74e9 * 2  # weights, bytes
    # LoRA buffer columns per rank (vLLM, fully_sharded_loras off): q,k,v,gate,up keep A (h x r), shard B;
    # o, down shard A, keep B (r x h). Llama-2-7B: h = q = kv = 4096, i = 11008
    full = (3 * 4096 + 4096 + 2 * 4096) + (4096 + 4096) + (2 * 4096 + 2 * 11008) + (11008 + 4096)
    assert full == 78080
    for tp, cols in ((1, 78080), (2, 53376), (4, 41024)):
        share = cols / full
        assert lora_buffer_share(p.model, tp) == pytest.approx(share)
        free = kv["free_bytes"] + w - w / tp - kv["lora_fixed_bytes"] - 8 * share * (
            kv["slot_fixed_bytes"] + 16 * kv["slot_bytes_per_rank"])
        per_token = 2 * 32 * (32 // tp) * 128 * 2  # K and V, layers, KV heads per rank, head dim, fp16
        assert kv_bytes_per_token_per_rank(p.model, tp) == per_token
        hand = int(free // per_token // 16 * 16)
        assert kv_capacity_tokens(p, tp, 8, 16) == hand
    t1, t2, t4 = (kv_capacity_tokens(p, t, 8, 16) for t in (1, 2, 4))
    assert t2 > 2 * t1 and t4 > 2 * t2  # weights freed and KV heads split: more than proportional


def test_kv_heads_replicated_beyond_their_number():
    m = get_model("llama-3.1-8b")  # 8 KV heads
    assert kv_bytes_per_token_per_rank(m, 8) == kv_bytes_per_token_per_rank(m, 16) == 2 * 32 * 1 * 128 * 2


def test_engine_sizes_kv_per_degree():
    p = load_profile(A100_7B)
    w = Workload.from_arrays([0.0, 0.1], [100, 100], [4, 4], [0, 0], [16, 16])
    for tp in (1, 2):
        res = simulate(w, p, EngineConfig(max_loras=8, max_lora_rank=16, tensor_parallel=tp))
        assert res.summary["kv_capacity_tokens"] == kv_capacity_tokens(p, tp, 8, 16)
        assert res.summary["requests_finished"] == 2


# ------------------------------------------------------------------------------------ compute
def test_measured_tp_timings_replace_the_analytical_split():
    p = load_profile(A100_7B)
    assert measured_degrees(p) == [2, 4, 8]
    table = p.components["backbone"].meta["tensor_parallel"]["2"]["params"]
    p2 = tp_profile(p, 2)
    assert "measured TP-2" in p2.raw["tensor_parallel_split"]["backbone"]
    bb = p.components["backbone"].params
    ar = 2 * 32 * (bb["tp_allreduce_alpha_s"] + 1 * 4096 * 2 * 2.0 * (2 - 1) / 2 / (bb["tp_link_gbps"] * 1e9))
    # one decode sequence, no context: c0 + max(c_mem, c_tok) + c_seq of the TP-2 table, plus the all-reduces
    expect = table["c0"] + max(table["c_mem"], table["c_tok"]) + table["c_seq"] + ar
    assert p2.backbone_s(0, 1, 0) == pytest.approx(expect, rel=1e-12)
    # without the table the analytical split is used, and it differs
    raw = copy.deepcopy(p.raw)
    del raw["components"]["backbone"]["tensor_parallel"]
    a2 = tp_profile(Profile.from_dict(raw), 2)
    assert "analytical" in a2.raw["tensor_parallel_split"]["backbone"]
    c0 = bb["c0"]
    assert a2.backbone_s(0, 1, 0) == pytest.approx(c0 + (p.backbone_s(0, 1, 0) - c0) / 2 + ar, rel=1e-12)
    assert abs(a2.backbone_s(0, 1, 0) - p2.backbone_s(0, 1, 0)) > 1e-4
    # measured: compute per rank shrinks with the degree
    s = [tp_profile(p, t).backbone_s(2048, 0, 0) for t in (1, 2, 4, 8)]
    assert s[0] > s[1] > s[2] > s[3]


def test_lora_compute_and_loads_split_as_vllm():
    p = load_profile(A100_7B)
    p2 = tp_profile(p, 2)
    lo1, lo2 = p.components["lora"].params, p2.components["lora"].params
    assert (lo2["q_dim"], lo2["kv_dim"], lo2["intermediate"], lo2["vocab"]) == (2048, 2048, 5504, 16000)
    assert lo2["hidden"] == lo1["hidden"] == 4096  # o, down (row-parallel) and the embedding keep h outputs
    assert 0 < p2.lora_s(0.02, 4, 16, 64, 16, 64) < p.lora_s(0.02, 4, 16, 64, 16, 64)
    # loads: each rank copies its 1/tp shard over its own link; the fixed cost stays
    lp = p.components["load"].params
    nb = p.adapter_bytes(32)
    assert p.load_s(32, "cpu", 4) == pytest.approx(lp["cpu_fixed_s"] + nb / 4 / (lp["cpu_gbps"] * 1e9))
    assert p.load_s(32, "cpu", 4) > p.load_s(32, "cpu", 1) / 4


def _calibrated_at(tp: int) -> Profile:
    """The A100 profile relabelled as calibrated at TP ``tp`` (its tables then stand for a TP-``tp`` server)."""
    raw = copy.deepcopy(load_profile(A100_7B).raw)
    raw["tensor_parallel"] = tp
    return Profile.from_dict(raw)


def _engine_loads(profile, tp: int) -> dict[int, float]:
    from twin.engine import Engine
    from twin.registry import make_cache, make_scheduler

    w = Workload.from_arrays([0.0], [100], [4], [0], [32])
    e = Engine(w, profile, EngineConfig(max_loras=8, max_lora_rank=32, tensor_parallel=tp), make_scheduler("fcfs"),
               make_cache("lru"))
    return dict(e.adapters.cpu_load_s)


def test_a_profile_calibrated_at_the_degree_is_not_split_again():
    """A profile calibrated at TP 2 measured its loads with two workers: at TP 2 the engine loads in the tables'
    time, not half its transfer part again (before stop 68 it split them by 2 a second time); a single-GPU profile
    run at TP 2 splits them once."""
    one, cal2 = load_profile(A100_7B), _calibrated_at(2)
    assert _engine_loads(cal2, 2) == {32: cal2.load_s(32, "cpu", 1, 32)}
    assert _engine_loads(one, 2) == {32: one.load_s(32, "cpu", 2, 32)} != {32: one.load_s(32, "cpu", 1, 32)}
    assert tp_profile(cal2, 2) is cal2
    # a split profile keeps its single-GPU load tables (split by the degree) and is its own split at that degree
    from twin.tensor_parallel import load_split

    split = tp_profile(one, 2)
    assert load_split(split, 2) == 2 and load_split(cal2, 2) == 1 and load_split(one, 1) == 1
    assert tp_profile(split, 2) is split


@pytest.mark.parametrize("tp", [1, 4])
def test_a_profile_calibrated_at_tp2_refuses_another_degree(tp):
    """The analytical and measured splits start from single-GPU times: a TP-2 calibration run at TP 1 or 4 would
    price a TP-2 server's steps at another degree, so the twin refuses it, naming the degree it prices."""
    with pytest.raises(TensorParallelError, match="prices a server at tensor-parallel degree 2.*--tp 2"):
        simulate(Workload.from_arrays([0.0], [100], [4], [0], [16]), _calibrated_at(2),
                 EngineConfig(max_loras=8, max_lora_rank=16, tensor_parallel=tp))


def test_a_profile_calibrated_at_tp2_refused_by_twin_run(tmp_path, capsys):
    import json

    from twin.cli import main

    path = tmp_path / "tp2.json"
    path.write_text(json.dumps(_calibrated_at(2).raw))
    assert main(["run", "--profile", str(path), "--duration", "5", "--no-progress"]) != 0
    err = capsys.readouterr().err
    assert "tensor-parallel degree 2" in err and "Traceback" not in err


def test_split_keeps_the_serving_host_time_and_the_rank_tile_cost():
    """Profile.with_serving_host / with_rank_tile_cost survive the split the engine applies at --tp > 1 (the host
    time was dropped there before stop 40)."""
    p = load_profile(A100_7B).with_serving_host(2e-5).with_rank_tile_cost(0.25)
    p2 = tp_profile(p, 2)
    assert p2.serving_s_per_running == 2e-5 and p2.components["lora"].params["n_tile_cost"] == 0.25
    assert p2.scheduler_s(100, 0, 8, 8) == pytest.approx(tp_profile(load_profile(A100_7B), 2).scheduler_s(100, 0, 8, 8)
                                                         + 100 * 2e-5)


def test_a_form_with_its_own_shard_is_split_by_it():
    from twin.perf.forms import AdditiveLora

    class Sharded(AdditiveLora):
        def shard(self, model, tp):
            return AdditiveLora(params={**self.params, "l0": self.params["l0"] * 10})

    p = load_profile(A100_7B)
    comps = dict(p.components)
    comps["lora"] = Sharded(params={"l0": 1e-3, "l_adapter": 1e-4, "l_token": 1e-6})
    q = Profile(name="x", model=p.model, components=comps, raw=p.raw)
    q2 = tp_profile(q, 2)
    assert q2.components["lora"].params["l0"] == pytest.approx(1e-2)
    assert "own shard" in q2.raw["tensor_parallel_split"]["lora"]


def test_gpu_memory_option_sizes_each_rank():
    """``--gpu-mem-gb`` per GPU (GiB, as GPUs state their memory): 0.9 x memory - weights / tp - the 5 GB runtime
    reserve - per-rank LoRA buffers."""
    from twin.tensor_parallel import kv_tokens_for_memory

    p = load_profile(A100_7B)
    spr = p.components["kv"].params["slot_bytes_per_rank"]
    for tp in (1, 2, 4):
        share = lora_buffer_share(p.model, tp)
        free = 0.9 * 80 * 2**30 - 6.74e9 * 2 / tp - 5e9 - 8 * spr * share * 16
        hand = int(free // (2 * 32 * (32 // tp) * 128 * 2) // 16 * 16)
        assert kv_tokens_for_memory(p, 80, 8, 16, tp) == hand
    with pytest.raises(TensorParallelError, match="use one of"):
        kv_tokens_for_memory(p, 80, 8, 16, 3)


def test_a_gpus_stated_gb_is_a_gib_as_the_calibrations_measured_kv_memory_shows():
    """A GPU's "64GB" is 64 GiB: the calibration's H100-64GB profile's KV memory measured by vLLM (``free_bytes``) is
    what 0.9 x 64 GiB leaves after the weights and the 5 GB runtime reserve, within 0.5 % (64e9 bytes would leave
    10 % less), and ``--gpu-mem-gb 64`` sizes the KV cache within 0.5 % of the profile's own."""
    from twin.perf.profile import GPU_GB, gpu_memory_gb, kv_tokens_for_memory

    p = load_profile("llama-3.1-8b_h100_vllm085")
    gb = gpu_memory_gb(p.gpu)
    free = p.raw["components"]["kv"]["params"]["free_bytes"]
    assert gb == 64 and GPU_GB == 2**30
    assert abs((0.9 * gb * GPU_GB - p.model.weight_bytes - 5e9) / free - 1) < 0.005
    assert abs((0.9 * gb * 1e9 - p.model.weight_bytes - 5e9) / free - 1) > 0.09
    own = p.kv_capacity_tokens(0, 0)
    assert abs(kv_tokens_for_memory(p, gb, 0, 0) / own - 1) < 0.005
