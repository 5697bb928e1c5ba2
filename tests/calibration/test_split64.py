"""The calibration's word on a 64-split working shrink block (issue 17): calibration/fitting/split64.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from calibration.fitting.split64 import fit_split64, main
from twin.perf.profile import load_profile

DATA = os.environ.get("TWIN_DATA_DIR")


def test_cli_refuses_a_missing_directory_before_work(tmp_path, capsys):
    assert main(["--data", str(tmp_path / "nowhere")]) == 2
    assert "no calibration directory" in capsys.readouterr().err


@pytest.mark.skipif(not DATA, reason="TWIN_DATA_DIR not set: the calibration tables are not available")
def test_the_two_parameter_fit_is_the_profiles_and_the_free_cost_is_identified(capsys):
    out = fit_split64(Path(DATA) / "calibration" / "vllm085_h100")
    lo = load_profile("llama-3.1-8b_h100_vllm085").components["lora"].params
    cal = out["calibrated (split64_cost 1)"]["params"]
    # the calibrated branch is `twin calibrate fit`'s kernel grid: the committed constants (ns per block)
    assert cal["l_cta"] == pytest.approx(lo["l_cta"] * 1e9, rel=1e-4)
    assert cal["l_active"] == pytest.approx(lo["l_active"] * 1e9, rel=1e-4)
    free = out["split64_cost free"]
    se = free["stderr"]["split64_cost"]
    assert se == se and 0.0 < se < 0.5  # finite: the serving runs' small steps identify it
    assert out["rows_under_128_tokens"]["serving_runs"] > 50
    assert set(free["mape_pct"]) == {"windows", "serving_runs"}
    assert main(["--data", str(Path(DATA) / "calibration" / "vllm085_h100")]) == 0
    assert "split64_cost free" in capsys.readouterr().out
