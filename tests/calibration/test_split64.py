"""The 64-split working shrink block's price, alone and at a fixed point with the mixed term (issue 17):
calibration/fitting/split64.py; and the mixed term's candidates, also net of host time (calibration/fitting/mixed.py)."""

from __future__ import annotations


import pytest

from calibration.fitting.split64 import fit_split64, main
from twin.perf.profile import load_profile


def test_cli_refuses_a_missing_directory_before_work(tmp_path, capsys):
    assert main(["--data", str(tmp_path / "nowhere")]) == 2
    assert "no calibration directory" in capsys.readouterr().err
    (tmp_path / "step_latency.csv").write_text("a,b\n1,2\n")  # an incomplete directory: a traceback before
    assert main(["--data", str(tmp_path)]) == 2
    assert "it is not a complete vLLM 0.8.5 calibration directory" in capsys.readouterr().err
    assert main(["--data", ""]) == 2
    assert "--data: empty" in capsys.readouterr().err


def test_the_grid_alone_and_the_fixed_point_with_the_mixed_term(real_data, capsys):
    out = fit_split64(real_data / "calibration" / "vllm085_h100")
    lo = load_profile("llama-3.1-8b_h100_vllm085").components["lora"]
    two = lo.meta["candidates"]["kernel_grid(l_cta,l_active)"]["params"]
    cal = out["calibrated (split64_cost 1)"]["params"]
    # the calibrated branch is `twin calibrate fit`'s two-parameter kernel grid (ns per block)
    assert cal["l_cta"] == pytest.approx(two["l_cta"] * 1e9, rel=1e-4)
    assert cal["l_active"] == pytest.approx(two["l_active"] * 1e9, rel=1e-4)
    free = out["split64_cost free"]
    se = free["stderr"]["split64_cost"]
    assert se == se and 0.0 < se < 0.5  # finite: the serving runs' small steps identify it
    assert out["rows_under_128_tokens"]["serving_runs"] > 50
    assert set(free["mape_pct"]) == {"windows", "serving_runs"}
    # fitted alone the grid carries the mixed-step excess of the prefill-heavy runs: ~1; at the fixed point
    # with the mixed term, well below (the committed profile's value)
    assert free["params"]["split64_cost"] > 0.95 > 0.8 > lo.params["split64_cost"]
    fp = lo.meta["split64"]["fixed_points"]
    assert lo.meta["split64"]["chosen"] == "prefill_slots"
    assert fp["prefill_slots"]["split64_cost"] == pytest.approx(lo.params["split64_cost"], rel=1e-5)
    assert fp["prefill_slots"]["criterion_mape_pct"] < fp["prefill_adapters"]["criterion_mape_pct"]
    assert main(["--data", str(real_data / "calibration" / "vllm085_h100")]) == 0
    text = capsys.readouterr().out
    assert "split64_cost free" in text and "fixed points" in text and "mixed prefill_slots" in text


def test_fixed_point_is_a_fixed_point(real_data):
    """At the committed pair, refitting the grid with the committed mixed term subtracted gives the committed grid,
    and the mixed fit on that grid gives the committed term (to the fixed point's tolerance)."""
    import json

    import numpy as np

    from calibration.fitting.mixed import fit_mixed
    from calibration.fitting.split64 import LoraRows, _fit_grid, _grid_candidate
    from calibration.fitting.tables import Vllm085Tables

    prof = load_profile("llama-3.1-8b_h100_vllm085")
    t = Vllm085Tables.read(real_data / "calibration" / "vllm085_h100", "llama-3.1-8b")
    rows = LoraRows.build(t, prof.components["backbone"])
    h = prof.components["mixed"].params["h_slot"] * 1e3
    fit = _fit_grid(_grid_candidate(t.model, True), rows, prof.components["backbone"],
                    h * rows.obs["pre_G"].to_numpy(float))
    lo = prof.components["lora"].params
    assert fit.values["split64_cost"] == pytest.approx(lo["split64_cost"], rel=1e-4)
    assert fit.values["l_cta"] * 1e-9 == pytest.approx(lo["l_cta"], rel=1e-4)
    with pytest.raises(ValueError, match="no candidate form"):
        fit_mixed(t, prof, forms=("per_token",))
    entry = fit_mixed(t, prof, forms=("prefill_slots",))
    assert entry["params"]["h_slot"] == pytest.approx(prof.components["mixed"].params["h_slot"], rel=1e-4)
    assert np.isfinite(json.loads(json.dumps(entry["fit"]["heldout"]["all"]["mape_pct"])))


def test_mixed_fit_net_of_host_time(real_data, capsys):
    """``host_s_per_running`` adds host time per running request to the serving runs' model only (the offline
    windows keep theirs), so the excess left for the per-slot term shrinks; 0 is the profile's own fit. The CLI
    prints every candidate and refuses a profile the serving runs do not price."""
    import numpy as np

    from calibration.fitting.mixed import SOURCES, fit_mixed, main, mixed_obs
    from calibration.fitting.tables import Vllm085Tables

    prof = load_profile("llama-3.1-8b_h100_vllm085")
    t = Vllm085Tables.read(real_data / "calibration" / "vllm085_h100", "llama-3.1-8b")
    o0, o1 = mixed_obs(t, prof), mixed_obs(t, prof, 18e-6)
    srv = (o0["source"] != SOURCES[2]).to_numpy()
    assert np.allclose(o1["model_ms"][srv] - o0["model_ms"][srv], 0.018 * o0["R"][srv])
    assert (o1["model_ms"][~srv] == o0["model_ms"][~srv]).all()
    # (with 0, the fit gives the profile's own term: test_fixed_point_is_a_fixed_point)
    h1 = fit_mixed(t, prof, forms=("prefill_slots",), host_s_per_running=18e-6)["params"]["h_slot"]
    assert h1 < 0.9 * prof.components["mixed"].params["h_slot"]
    data = str(real_data / "calibration" / "vllm085_h100")
    assert main(["--data", data, "--host-us", "18"]) == 0
    out = capsys.readouterr().out
    assert "net of 18 us" in out and "prefill_slots+waiting" in out and "chosen: prefill_slots" in out
    assert main(["--data", data, "--profile", "qwen-2.5-7b_h100_vllm085"]) == 2
    assert "not served by" in capsys.readouterr().err
    assert main(["--data", data, "--host-us", "-1"]) == 2
