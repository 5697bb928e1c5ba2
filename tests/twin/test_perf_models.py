"""Every performance-model form's scalar fast path equals its numpy ``predict``."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers import random_workload
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
