"""vLLM 0.8.5's per-step adapter check fitted with the kernel grid and the mixed term (issue 17; a what-if):
calibration/fitting/adapter_check.py."""

from __future__ import annotations

import pytest

from calibration.fitting.adapter_check import fit_adapter_check, main
from twin.perf.profile import load_profile


def test_cli_refuses_a_missing_directory_before_work(tmp_path, capsys):
    assert main(["--data", str(tmp_path / "nowhere")]) == 2
    assert "no calibration directory" in capsys.readouterr().err


@pytest.mark.data
def test_without_the_term_the_fixed_point_is_the_shipped_profile_s_and_the_term_is_fitted(real_data):
    without, with_check = fit_adapter_check(str(real_data / "calibration" / "vllm085_h100"))
    prof = load_profile("llama-3.1-8b_h100_vllm085")
    lo, mixed = prof.components["lora"].params, prof.components["mixed"].params
    p = without["params"]
    # the shipped profile is this fixed point (twin calibrate fit's split64 + mixed, calibration/fitting/split64.py)
    assert p["l_cta_ns"] == pytest.approx(lo["l_cta"] * 1e9, rel=1e-4)
    assert p["l_active_ns"] == pytest.approx(lo["l_active"] * 1e9, rel=1e-4)
    assert p["split64_cost"] == pytest.approx(lo["split64_cost"], rel=1e-4)
    assert p["h_slot_ms"] == pytest.approx(mixed["h_slot"] * 1e3, rel=1e-4)
    assert p["c_us_per_pair"] == 0.0 and not without["with_adapter_check"]
    # with the term: a positive cost per (distinct x registered) adapter pair, the other parameters refitted, and the
    # fitted profile dict carries the refitted grid and mixed term
    q = with_check["params"]
    assert with_check["with_adapter_check"] and q["c_us_per_pair"] > 0
    assert q["h_slot_ms"] != pytest.approx(p["h_slot_ms"], rel=1e-3)
    d = with_check["profile"]
    assert d["components"]["lora"]["params"]["l_active"] == pytest.approx(q["l_active_ns"] * 1e-9, rel=1e-6)
    assert d["components"]["mixed"]["params"]["h_slot"] == pytest.approx(q["h_slot_ms"] * 1e-3, rel=1e-6)
    for point in (without, with_check):
        assert set(point["mixed_heldout_pct"]) == {"serving runs with a queue", "serving runs without a queue",
                                                   "300-slot windows"}
        assert 0 < point["mixed_criterion_pct"] < 20
    # the committed variant is this fixed point (python -m calibration.fitting.adapter_check --write)
    v = load_profile("llama-3.1-8b_h100_vllm085_adaptercheck")
    assert v.components["adapter_check"].params["c_pair"] == pytest.approx(q["c_us_per_pair"] * 1e-6, rel=1e-5)
    assert v.components["lora"].params["l_cta"] == pytest.approx(q["l_cta_ns"] * 1e-9, rel=1e-6)
    assert v.components["mixed"].params["h_slot"] == pytest.approx(q["h_slot_ms"] * 1e-3, rel=1e-6)


def test_the_report_of_the_variant_says_which_figures_are_its_own():
    """`twin calibrate report` of the variant (the default profile) names its base and command, marks the held-out
    figures of the components it changed as the base profile's, and gives the variant's own held-out MAPE; the
    calibrated profile's report has none of that."""
    from calibration.report import load_profile_dict, markdown, quality_table, summary_lines

    d, _ = load_profile_dict("llama-3.1-8b_h100_vllm085_adaptercheck")
    md = markdown(d)
    assert "Variant: a variant of llama-3.1-8b_h100_vllm085, written by " \
           "`python -m calibration.fitting.adapter_check --write`" in md
    rows = {line.split(" | ")[0].strip("| "): line for line in md.splitlines() if line.startswith("| ")}
    assert "base profile's: " in rows["lora"] and "base profile's: " in rows["mixed"]
    assert "base profile's" not in rows["backbone"] and "base profile's" not in rows["kv"]
    fit = d["components"]["adapter_check"]["fit"]
    assert f"mixed criterion {fit['mixed_criterion_pct']:.4g} %" in rows["adapter_check"]
    assert "windows 2.518 %" in rows["adapter_check"]
    assert "(the base profile llama-3.1-8b_h100_vllm085's)" in md
    assert quality_table(d)["variant"]["of"] == "llama-3.1-8b_h100_vllm085"
    assert any("the variant's fit (held-out MAPE): mixed criterion" in line for line in summary_lines(d))
    base, _ = load_profile_dict("llama-3.1-8b_h100_vllm085")
    assert "Variant" not in markdown(base) and "base profile's" not in markdown(base)
    assert "variant" not in quality_table(base)
