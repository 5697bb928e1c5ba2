"""Every performance-model form's scalar fast path equals its numpy ``predict``."""

from __future__ import annotations

import numpy as np
import pytest

from twin.perf.forms import FORMS
from twin.perf.profile import available_profiles, load_profile

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
