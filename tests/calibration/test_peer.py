"""calibration/fitting/peer.py: the published adapter twin's models (Agullo et al. 2025) from its constants table.

Contract tested: :meth:`PeerModels.from_table` reads the decode step (``c0``, ``c1``), the LoRA percentage
(``K6``, ``K7``), the scheduler's constants (keyed by the constant's first word) and the CPU->GPU load table
(``max_rank_M_adapter_rank_R``) from ``peer_fitted_constants.csv``'s rows; each model evaluates the published
equation (module docstring) on arrays, and gives NaN where the table lacks its constants. The table here is
hand-made in the file's layout with round numbers, so every expected value is worked out by hand.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from calibration.fitting.peer import PeerModels

SCHED = {"a (avg_batch_size)": 0.02, "b (avg_waiting_queue)": 0.01, "c (avg_waiting_queue_x_gpu/cpu_diff)": 0.004,
         "min_avg_batch_size": 10.0, "max_avg_batch_size": 110.0, "min_avg_waiting_queue": 0.0,
         "max_avg_waiting_queue": 200.0, "min_avg_waiting_queue_x_gpu/cpu_diff": 0.0,
         "max_avg_waiting_queue_x_gpu/cpu_diff": 100.0, "base": 0.005}


def _table(skip: tuple[str, ...] = ()) -> pd.DataFrame:
    """A ``peer_fitted_constants.csv`` of one model in the published file's layout, leaving out ``skip``
    (``component/constant``)."""
    rows = [("default_latency_decode", "c0", 0.05), ("default_latency_decode", "c1", 10.0),
            ("default_latency_prefill", "c0", 9.0), ("default_latency_prefill", "c1", 99.0),
            ("lora_compute_overhead", "c0", 2.0), ("lora_compute_overhead", "c1", 150.0),
            ("lora_compute_overhead", "c2", 7.0),
            ("lora_load_cpu_to_gpu", "max_rank_32_adapter_rank_8", 4.5),
            ("lora_load_cpu_to_gpu", "max_rank_32_adapter_rank_16", 5.5),
            ("lora_load_cpu_to_gpu", "max_rank_16_adapter_rank_16", 3.25)]
    rows += [("scheduler_overhead", k, v) for k, v in SCHED.items()]
    rows = [r for r in rows if f"{r[0]}/{r[1]}" not in skip]
    return pd.DataFrame({"model": ["llama-3.1-8b-instruct" if c != "scheduler_overhead" else "all" for c, _, _ in rows],
                         "component": [c for c, _, _ in rows], "equation": "...",
                         "constant": [k for _, k, _ in rows], "value": [v for _, _, v in rows], "units": "ms"})


def test_from_table_reads_each_models_constants() -> None:
    p = PeerModels.from_table(_table())
    assert p.decode == (0.05, 10.0)
    assert p.lora == (2.0, 150.0)  # (c2, the rank term, is not used by the published twin)
    assert p.load_ms == {(32, 8): 4.5, (32, 16): 5.5, (16, 16): 3.25}
    assert p.sched == {"a": 0.02, "b": 0.01, "c": 0.004, **{k: v for k, v in SCHED.items() if " " not in k}}


@pytest.mark.parametrize("table", [None, pd.DataFrame(), _table().iloc[0:0]])
def test_no_table_gives_no_model_and_nan_predictions(table) -> None:
    p = PeerModels.from_table(table)
    assert p.decode is None and p.lora is None and p.sched == {} and p.load_ms == {}
    x = np.array([1.0, 2.0])
    assert np.isnan(p.step_ms(x)).all() and len(p.step_ms(x)) == 2
    assert np.isnan(p.lora_step_ms(x, x)).all()
    assert np.isnan(p.sched_ms(x, x, x, x)).all()
    assert np.isnan(p.cpu_load_ms([32], [8])).all()


def test_the_decode_step_is_c0_per_running_request_plus_c1() -> None:
    p = PeerModels.from_table(_table())
    assert p.step_ms(np.array([0, 1, 100])) == pytest.approx([10.0, 10.05, 15.0])
    assert p.step_ms([4]) == pytest.approx([10.2])  # (a list is taken as an array)


def test_the_step_with_lora_is_the_decode_step_times_k6_a_plus_k7_percent() -> None:
    p = PeerModels.from_table(_table())
    # 100 running: 15 ms decode; 5 adapters: (2*5 + 150) % = 160 %
    assert p.lora_step_ms(np.array([100.0, 0.0]), np.array([5, 0])) == pytest.approx([15.0 * 1.6, 10.0 * 1.5])


def test_a_model_whose_constants_are_missing_predicts_nan() -> None:
    p = PeerModels.from_table(_table(skip=("default_latency_decode/c1",)))
    assert p.decode is None and np.isnan(p.step_ms(np.array([3.0]))).all()
    assert p.lora == (2.0, 150.0)
    assert np.isnan(p.lora_step_ms(np.array([3.0]), np.array([1.0]))).all()  # (no decode step to scale)
    q = PeerModels.from_table(_table(skip=("lora_compute_overhead/c0",)))
    assert q.decode == (0.05, 10.0) and q.lora is None
    assert np.isnan(q.lora_step_ms(np.array([3.0]), np.array([1.0]))).all()
    r = PeerModels.from_table(_table(skip=("scheduler_overhead/base",)))
    assert np.isnan(r.sched_ms([1.0], [1.0], [1.0], [1.0])).all()


def test_the_scheduler_is_min_max_scaled_features_less_the_base_in_ms() -> None:
    p = PeerModels.from_table(_table())
    R, W = np.array([60.0, 10.0, 110.0]), np.array([50.0, 0.0, 100.0])
    G, N = np.array([8, 8, 16]), np.array([16, 16, 0])
    # run 0: mm(R) = 0.5, mm(W) = 0.25, W*G/N = 25 -> 0.25: 0.01 + 0.0025 + 0.001 - 0.005 = 0.0085 s
    # run 1: every feature at its minimum: -0.005 s -> clipped to 0
    # run 2: N = 0 (no served adapter): the ratio term is 0; mm(R) = 1, mm(W) = 0.5: 0.02 + 0.005 - 0.005 = 0.02 s
    assert p.sched_ms(R, W, G, N) == pytest.approx([8.5, 0.0, 20.0])


def test_the_cpu_load_is_the_published_table_per_max_rank_and_rank() -> None:
    p = PeerModels.from_table(_table())
    out = p.cpu_load_ms(np.array([32, 16, 16, 32.0]), np.array([16, 16, 8, 8.0]))
    assert out[[0, 1, 3]] == pytest.approx([5.5, 3.25, 4.5])
    assert np.isnan(out[2])  # (rank 8 into rank-16 slots was not measured)
    assert out.dtype == float


@pytest.mark.parametrize("constant", ["max_rank_32", "max_rank_x_adapter_rank_8"])
def test_a_malformed_load_constant_is_refused_naming_it(constant: str) -> None:
    t = pd.concat([_table(), pd.DataFrame({"model": ["m"], "component": ["lora_load_cpu_to_gpu"],
                                           "constant": [constant], "value": [1.0]})], ignore_index=True)
    with pytest.raises(ValueError) as e:
        PeerModels.from_table(t)
    assert constant in str(e.value), str(e.value)
