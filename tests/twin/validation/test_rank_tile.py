"""The ``ranktile`` profile variant (issue 17): ``n_tile_cost`` of the kernel grid, fitted on the fit split
(:mod:`twin.validation.rank_tile`)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from tests.helpers import assert_one_is_the_profile_and_scalar_is_predict, kernel_grid_lora, lora_steps
from twin.perf.profile import load_profile

LLAMA = "llama-3.1-8b_h100_vllm085"
REPO = Path(__file__).resolve().parents[3]


def _lora(c: float | None):
    return kernel_grid_lora(LLAMA) if c is None else kernel_grid_lora(LLAMA, n_tile_cost=c)


def test_n_tile_cost_only_touches_ranks_above_16_and_scalar_matches_predict():
    base, one, half = _lora(None), _lora(1.0), _lora(0.3)
    fb, f1, fh = base.scalar(), one.scalar(), half.scalar()
    for A, r, T, G, R in lora_steps(2, (8, 16, 32, 64)):
        assert_one_is_the_profile_and_scalar_is_predict(fb, f1, fh, half, (A, r, T, G, R))
        if r <= 16:
            assert fh(0.0, A, r, T, G, R) == fb(0.0, A, r, T, G, R)
        else:
            assert fh(0.0, A, r, T, G, R) < fb(0.0, A, r, T, G, R)


def test_variant_is_off_by_default():
    v = load_profile(LLAMA + "_ranktile")
    assert "n_tile_cost" not in load_profile(LLAMA).components["lora"].params
    assert 0.0 < v.components["lora"].params["n_tile_cost"] < 1.0
    assert "fit split" in v.raw["provenance"]["variant"]["data"]


def test_variant_says_it_used_validation_data():
    """The variant's n_tile_cost comes from the dt_modelling runs, so the file it writes says
    ``validation_data_used: true`` (a rewrite with --write had turned the committed flag back to false)."""
    from twin.validation.rank_tile import ranktile_variant

    raw = load_profile(LLAMA).raw
    assert raw["provenance"]["validation_data_used"] is False
    out = ranktile_variant(raw, {"n_tile_cost": 0.7, "stderr": 0.01})
    assert out["provenance"]["validation_data_used"] is True
    assert load_profile(LLAMA + "_ranktile").raw["provenance"]["validation_data_used"] is True


def test_validation_constant_is_the_variant_files_and_equals_it_in_a_run():
    """``twin validate``'s RANK_TILE_COST is the ranktile variant's fitted value, and the default profile with
    it (Profile.with_rank_tile_cost) simulates exactly as the variant file does."""
    from tests.helpers import random_workload
    from twin.engine_state import EngineConfig
    from twin.simulate import simulate
    from twin.validation.specs import RANK_TILE_COST

    variant = load_profile(LLAMA + "_ranktile")
    assert RANK_TILE_COST == variant.components["lora"].params["n_tile_cost"]
    w = random_workload(n=200, rps=5.0, adapters=24, seed=4, ranks=(8, 32))
    cfg = EngineConfig(max_loras=16, max_num_seqs=64, max_model_len=2048)
    a = simulate(w, load_profile(LLAMA), cfg, rank_tile_cost=RANK_TILE_COST, serving_s_per_running=18e-6)
    b = simulate(w, variant, cfg, serving_s_per_running=18e-6)
    cols = ["outcome", "first_token_s", "finish_s", "preemptions", "tokens_emitted"]
    pd.testing.assert_frame_equal(a.requests[cols], b.requests[cols], check_exact=True)


def test_spec_and_validate_cli_carry_the_constant():
    import argparse

    from tests.helpers import real_run_row
    from twin.validation.cli import _rank_tile_cost, check_args, register_cli
    from twin.validation.specs import RANK_TILE_COST, spec_from_row

    row = real_run_row()
    assert spec_from_row(row).rank_tile_cost == RANK_TILE_COST
    assert spec_from_row(row, rank_tile_cost=None).rank_tile_cost is None
    parser = argparse.ArgumentParser(prog="twin")
    register_cli(parser.add_subparsers(dest="command"))
    assert _rank_tile_cost(parser.parse_args(["validate"]).rank_tile_cost) == RANK_TILE_COST
    assert _rank_tile_cost("profile") is None and _rank_tile_cost("1") == 1.0
    for bad in ("-1", "inf", "nan", "quarter"):
        with pytest.raises(ValueError, match="--rank-tile-cost"):
            check_args(parser.parse_args(["validate", "--rank-tile-cost", bad]))


def test_validation_refuses_a_rank_tile_cost_the_profile_cannot_take(tmp_path):
    from tests.helpers import ml_test_row
    from twin.validation.runner import run_validation

    csv = tmp_path / "real.csv"
    pd.DataFrame([ml_test_row(model="llama-2-7b")]).to_csv(csv, index=False)
    with pytest.raises(ValueError, match="has no rank tiles.*--rank-tile-cost profile"):
        run_validation(csv, peer_csv=False, profile="llama-2-7b_h100_vllm050", rank_tile_cost=0.5)


def test_fit_reproduces_the_committed_constant(real_data):
    from twin.validation.rank_tile import fit_rank_tile

    per_run = pd.read_csv(REPO / "results" / "validation" / "per_run.csv")
    real = pd.read_csv(real_data / "validation" / "vllm085_h100_llama31_8b.csv")
    fit = fit_rank_tile(per_run, real, load_profile(LLAMA).raw)
    assert fit["pairs"] == 10
    assert fit["n_tile_cost"] == pytest.approx(load_profile(LLAMA + "_ranktile").components["lora"].params["n_tile_cost"], rel=1e-3)
    # the committed grid, every tile alike, overstates the rank-32 excess the real runs show (1.16x since the
    # profile prices the light steps' 64-split blocks at 0.58; 2x before)
    assert sum(fit["model_excess_ms_at_1"]) > 1.1 * sum(fit["real_excess_ms"])
