"""Prompt-output length coupling of the re-created request pools (fit split's KV gauges)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
from scipy.stats import spearmanr

from tests.helpers import real_run_row
from traces.lengths import ShareGPTLengths
from twin.perf.profile import load_profile
from twin.validation.length_coupling import BLOCK_ROUNDING_TOKENS, fit_prompt_output_corr, model_kv_per_running
from twin.validation.specs import PROMPT_OUTPUT_CORR, spec_from_row


def _model() -> ShareGPTLengths:
    return ShareGPTLengths.from_json().solve(223.0, 196.4)


def test_zero_coupling_is_the_independent_model():
    """At 0 the lengths are independent (it compared the model with a copy of itself, which passed when
    a correlation of 0 sampled coupled lengths), and the prompt draw is the coupled model's."""
    m = _model()
    assert m.prompt_output_corr == 0.0
    p, o = m.sample(100_000, np.random.default_rng(3))
    assert abs(spearmanr(p, o)[0]) < 0.02
    pc, _ = replace(m, prompt_output_corr=-0.5).sample(100_000, np.random.default_rng(3))
    assert np.array_equal(p, pc)


def test_coupling_keeps_the_means_and_lowers_kv_per_running():
    m = _model()
    p0, o0 = m.sample(100_000, np.random.default_rng(1))
    p, o = replace(m, prompt_output_corr=PROMPT_OUTPUT_CORR).sample(100_000, np.random.default_rng(1))
    assert np.array_equal(p, p0)  # the prompt draw is unchanged; only the output leans on it
    assert p.mean() == pytest.approx(223.0, rel=0.01) and o.mean() == pytest.approx(196.4, rel=0.01)
    assert spearmanr(p, o)[0] == pytest.approx(PROMPT_OUTPUT_CORR, abs=0.05)
    assert (p + o <= 2048).all() and (p <= 1024).all()
    indep, coupled = model_kv_per_running(m, 0.0, n=50_000), model_kv_per_running(m, PROMPT_OUTPUT_CORR, n=50_000)
    assert 420 < indep < 460 and 340 < coupled < 390  # tokens: twin 439 / real 360 in the README
    assert BLOCK_ROUNDING_TOKENS == 7.5


def test_spec_carries_the_constant():
    row = real_run_row()
    assert spec_from_row(row).length_corr == PROMPT_OUTPUT_CORR
    assert spec_from_row(row, length_corr=0.0).length_corr == 0.0


@pytest.mark.data
def test_constant_is_fitted_on_the_fit_split_only(real_data):
    real = pd.read_csv(real_data / "validation" / "vllm085_h100_llama31_8b.csv")
    fit = real[(real["source"] == "dt_modelling") & (real["status"] == "ok")]
    m = _model().solve(float(fit["pool_mean_input_tokens"].median()), float(fit["pool_mean_output_tokens"].median()))
    prof = load_profile("llama-3.1-8b_h100_vllm085")
    got = fit_prompt_output_corr(real, prof, m)
    assert got["rho"] == pytest.approx(PROMPT_OUTPUT_CORR, abs=0.005)
    assert got["runs"] >= 20
    # the ml_test rows do not move it
    assert fit_prompt_output_corr(real[real["source"] == "dt_modelling"], prof, m)["rho"] == got["rho"]


def test_cli_refuses_a_correlation_out_of_range():
    import argparse

    from twin.validation.cli import check_args, register_cli

    parser = argparse.ArgumentParser(prog="twin")
    register_cli(parser.add_subparsers(dest="command"))
    assert parser.parse_args(["validate"]).length_corr == PROMPT_OUTPUT_CORR
    args = parser.parse_args(["validate", "--length-corr", "1.5"])
    with pytest.raises(ValueError, match="--length-corr"):
        check_args(args)
    check_args(parser.parse_args(["validate", "--length-corr", "0"]))
