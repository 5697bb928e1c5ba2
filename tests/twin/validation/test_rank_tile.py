"""The ``ranktile`` profile variant (issue 17): ``n_tile_cost`` of the kernel grid, fitted on the fit split
(:mod:`twin.validation.rank_tile`)."""

from __future__ import annotations

import copy
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from twin.perf.profile import Profile, load_profile

LLAMA = "llama-3.1-8b_h100_vllm085"
DATA = os.environ.get("TWIN_DATA_DIR")
REPO = Path(__file__).resolve().parents[3]


def _lora(c: float | None):
    d = copy.deepcopy(load_profile(LLAMA).raw)
    if c is not None:
        d["components"]["lora"]["params"]["n_tile_cost"] = c
    return Profile.from_dict(d, "t").components["lora"]


def test_n_tile_cost_only_touches_ranks_above_16_and_scalar_matches_predict():
    base, one, half = _lora(None), _lora(1.0), _lora(0.3)
    fb, f1, fh = base.scalar(), one.scalar(), half.scalar()
    rng = np.random.default_rng(2)
    for _ in range(400):
        A, T, G = int(rng.integers(1, 130)), int(rng.integers(1, 2048)), int(rng.integers(1, 400))
        R = int(rng.integers(1, T + 1))
        r = int(rng.choice([8, 16, 32, 64]))
        assert f1(0.0, A, r, T, G, R) == fb(0.0, A, r, T, G, R)  # 1 is the committed profile, bit for bit
        assert fh(0.0, A, r, T, G, R) == pytest.approx(float(half.predict(0.0, A, r, T, G, R)), rel=1e-12, abs=1e-15)
        if r <= 16:
            assert fh(0.0, A, r, T, G, R) == fb(0.0, A, r, T, G, R)
        else:
            assert fh(0.0, A, r, T, G, R) < fb(0.0, A, r, T, G, R)


def test_variant_is_off_by_default():
    v = load_profile(LLAMA + "_ranktile")
    assert "n_tile_cost" not in load_profile(LLAMA).components["lora"].params
    assert 0.0 < v.components["lora"].params["n_tile_cost"] < 1.0
    assert "fit split" in v.raw["provenance"]["variant"]["data"]


@pytest.mark.skipif(not DATA, reason="TWIN_DATA_DIR is not set: the real runs are needed")
def test_fit_reproduces_the_committed_constant():
    from twin.validation.rank_tile import fit_rank_tile

    per_run = pd.read_csv(REPO / "results" / "validation" / "per_run.csv")
    real = pd.read_csv(Path(DATA) / "validation" / "vllm085_h100_llama31_8b.csv")
    fit = fit_rank_tile(per_run, real, load_profile(LLAMA).raw)
    assert fit["pairs"] == 10
    assert fit["n_tile_cost"] == pytest.approx(load_profile(LLAMA + "_ranktile").components["lora"].params["n_tile_cost"], rel=1e-3)
    # the committed grid doubles the rank-32 excess the real runs show
    assert sum(fit["model_excess_ms_at_1"]) > 1.8 * sum(fit["real_excess_ms"])
