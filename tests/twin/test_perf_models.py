"""Every performance-model form's scalar fast path equals its numpy ``predict``."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers import random_workload
from traces.workload import Workload
from twin.config import EngineConfig
from twin.perf.forms import FORMS
from twin.perf.profile import available_profiles, load_profile
from twin.simulate import simulate

def _lora_args(rng):
    """(base step, distinct adapters, max rank, tokens, slots, requests <= tokens)."""
    T = int(rng.integers(1, 2048))
    return (float(rng.uniform(0.005, 0.08)), int(rng.integers(0, 200)), int(rng.choice([8, 16, 32])), T,
            int(rng.integers(0, 385)), int(rng.integers(1, T + 1)))


ARGS = {
    "backbone": lambda rng: (int(rng.integers(0, 2048)), int(rng.integers(0, 600)), int(rng.integers(0, 300_000))),
    "lora": lambda rng: _lora_args(rng),
    "scheduler": lambda rng: (int(rng.integers(0, 600)), int(rng.integers(0, 30_000)), int(rng.integers(0, 384)),
                              int(rng.integers(1, 400))),
}


@pytest.mark.parametrize("name", list(available_profiles()))
def test_scalar_path_matches_predict(name):
    prof = load_profile(name if name != "default" else "embedded")
    rng = np.random.default_rng(0)
    for kind, gen in ARGS.items():
        comp = prof.components[kind]
        fast = comp.scalar()
        for _ in range(300):
            a = gen(rng)
            assert fast(*a) == pytest.approx(float(comp.predict(*a)), rel=1e-12, abs=1e-15), (kind, comp.form, a)


def test_every_form_has_equation_docstring():
    for (kind, form), cls in FORMS.items():
        assert cls.__doc__ and "=" in cls.__doc__.splitlines()[0], f"{kind}/{form} needs its equation first"


ADAPTERCHECK = "llama-3.1-8b_h100_vllm085_adaptercheck"


def test_adapter_check_adds_c_pair_per_distinct_and_registered_adapter_pair_to_a_step():
    """vLLM's per-step adapter check (twin.perf.forms.RegistryPairsAdapterCheck): c_pair x active x served on every
    step, prefill or decode; the variant's other components are the shipped profile's kinds."""
    v = load_profile(ADAPTERCHECK)
    c = v.components["adapter_check"].params["c_pair"]
    assert 1e-8 < c < 1e-5  # seconds per pair: a host-side copy of a registry entry
    plain = v.without("adapter_check")
    assert plain.adapter_check_s is None and v.adapter_check_s is not None
    for P, D, A, G, N in ((0, 64, 8, 32, 96), (512, 10, 30, 128, 384), (0, 1, 1, 8, 8)):
        args = (P, D, 50_000, D + (P > 0), A, 16, G, D + 1, 5, N)
        assert v.step_s(*args) - plain.step_s(*args) == pytest.approx(c * A * N, rel=1e-9)
    # a batch without adapters pays nothing
    assert v.step_s(0, 4, 1000, 4, 0, 16, 8, 4, 0, 64) == plain.step_s(0, 4, 1000, 4, 0, 16, 8, 4, 0, 64)
    # N is the adapters registered when given (the CPU tier); the scheduler term keeps the served adapters
    args = (0, 64, 50_000, 64, 8, 16, 32, 65, 5, 384)
    assert v.step_s(*args, None, 40) - plain.step_s(*args) == pytest.approx(c * 8 * 40, rel=1e-9)
    assert v.step_s(*args, None, 384) == v.step_s(*args)
    assert plain.step_s(*args, None, 40) == plain.step_s(*args)  # (a profile without the term ignores it)


def _lone_requests(n_served: int, preload: bool):
    """Three requests of adapter 0, one after another, on a server of ``n_served`` adapters."""
    w = Workload.from_arrays([0.0, 10.0, 20.0], [300, 300, 300], [40, 40, 40], [0, 0, 0], [16, 16, 16])
    cfg = EngineConfig(max_loras=8, max_num_seqs=64, max_lora_rank=16, served_adapters=n_served)
    r = simulate(w, ADAPTERCHECK, cfg, scheduler="fcfs+client-cap", scheduler_opts={"preload_cpu": preload})
    return r.requests.sort_values("request_id")["finish_s"].to_numpy() - np.array([0.0, 10.0, 20.0])


def test_adapter_check_counts_the_registered_adapters_not_the_served():
    """vLLM walks ``list_adapters()``, the CPU tier's adapters: without a start-up preload only the adapters
    requested so far are registered (offline ``LLM.generate`` adds one at its first request), so a lone adapter's
    requests cost the same whatever the served count; a server that pre-loads its CPU tier registers all of them
    from the start and pays for every one."""
    few, many = _lone_requests(4, preload=False), _lone_requests(384, preload=False)
    assert np.array_equal(few, many)
    pre_few, pre_many = _lone_requests(4, preload=True), _lone_requests(384, preload=True)
    c = load_profile(ADAPTERCHECK).components["adapter_check"].params["c_pair"]
    # 40 steps each (a prefill step with the first token, 39 decode steps), each paying c x 1 x N
    assert pre_many - pre_few == pytest.approx(np.full(3, 40 * c * (384 - 4)), rel=1e-6)
    assert np.allclose(pre_few[1:] - few[1:], 40 * c * 3, rtol=1e-6)  # (4 registered against 1; the first also loads from disk)


def test_adapter_check_decode_runs_are_exact():
    """The decode-run fast path adds the check to the scheduler term as step_s does: the same results as stepping
    one iteration at a time, arrivals included (the waiting count changes within runs)."""
    w = random_workload(n=300, rps=4.0, adapters=24, seed=11)
    cfg = EngineConfig(max_loras=8, max_num_seqs=64, max_lora_rank=16)
    a = simulate(w, ADAPTERCHECK, cfg)
    b = simulate(w, ADAPTERCHECK, cfg, max_run_steps=1)
    assert a.summary["step_segments"] < b.summary["step_segments"]
    cols = ["outcome", "first_scheduled_s", "first_token_s", "finish_s", "preemptions", "tokens_emitted"]
    assert a.requests[cols].equals(b.requests[cols])
    plain = simulate(w, load_profile(ADAPTERCHECK).without("adapter_check"), cfg)
    assert a.summary["itl_ms_mean"] > plain.summary["itl_ms_mean"]  # the term is on the engine's path
