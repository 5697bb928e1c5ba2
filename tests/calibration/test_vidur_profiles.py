"""Testbed profiles from Vidur's operator timings: the A40 one and the A100 24/48/80 GB ones of
Llama-7B/13B/30B (calibration/fitting/vidur.py). Committed-profile checks run without data; the
re-fits and the comparison with Vidur's tables skip without ``TWIN_DATA_DIR``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from twin.perf.profile import available_profiles, load_profile

ROOT = Path(__file__).resolve().parents[2]
MODELS = ("llama-2-7b", "llama-2-13b", "llama-30b")
MEMORY_GIB = {"a100-24gb": 24, "a100-48gb": 48, "a100-80gb": 80}
A100 = [f"{m}_{g}_vidur" for m in MODELS for g in MEMORY_GIB]
#: a short run that starts on each profile: the TP degree and slots its memory needs
RUN_ARGS = {
    "llama-2-7b_a100-24gb_vidur": ["--max-model-len", "2048"], "llama-2-7b_a100-48gb_vidur": [],
    "llama-2-7b_a100-80gb_vidur": [], "llama-2-13b_a100-24gb_vidur": ["--tp", "2"],
    "llama-2-13b_a100-48gb_vidur": [], "llama-2-13b_a100-80gb_vidur": [],
    "llama-30b_a100-24gb_vidur": ["--tp", "4", "--slots", "2"], "llama-30b_a100-48gb_vidur": ["--tp", "2"],
    "llama-30b_a100-80gb_vidur": ["--tp", "2"],
}
#: the error each fit is stated to reproduce Vidur's tables within (held-out MAPE, percent)
MEASURED_MAPE_PCT = 6.0    # a model Vidur profiled on the GPU (k-fold over token counts, every TP degree)
SHAPE_MODEL_MAPE_PCT = 8.0  # a model it did not: the shape model fitted without the model it predicts


def _committed(name: str) -> dict:
    return json.loads((ROOT / "calibration" / "profiles" / f"{name}.json").read_text())


@pytest.mark.parametrize("name", A100)
def test_a100_profiles_document_their_estimates(name):
    assert available_profiles()[name] is not None
    d = _committed(name)
    gpu = name.split("_")[1]
    assert d["gpu_memory_bytes"] == MEMORY_GIB[gpu] * 2 ** 30 or (gpu == "a100-80gb" and
                                                                    d["gpu_memory_bytes"] == 81920 * 2 ** 20)
    assert d["provenance"]["command"] == (f"twin calibrate fit --measurements $TWIN_DATA_DIR/calibration/"
                                          f"vidur_linear_ops/ --model {d['model']} --out calibration/profiles/"
                                          f"{name}.json --gpu {gpu}")
    for kind, comp in d["components"].items():
        assert comp["units"] and comp["method"], kind
    notes = " ".join(d["notes"])
    for estimate in ("Per-step overhead", "Decode attention", "LM head", "all-reduce"):
        assert estimate in notes
    if gpu != "a100-80gb":
        assert "capped" not in d["gpu"] and "whose server may use" in notes  # capped A100: documented
    if d["model"] != "llama-2-7b":
        assert "shape model" in notes and "did not profile" in notes
    assert sorted(d["components"]["backbone"]["tensor_parallel"]) == ["2", "4", "8"] if d["model"] != "llama-30b" \
        else sorted(d["components"]["backbone"]["tensor_parallel"]) == ["2", "4"]


@pytest.mark.parametrize("model", MODELS)
def test_capped_memory_changes_only_the_kv_budget(model):
    """Same compute on the capped A100s; the KV budget differs by 0.9 x the memory difference."""
    full, capped = _committed(f"{model}_a100-80gb_vidur"), _committed(f"{model}_a100-24gb_vidur")
    for kind in ("backbone", "lora", "scheduler", "load"):
        assert full["components"][kind]["params"] == capped["components"][kind]["params"], kind
    diff = full["components"]["kv"]["params"]["free_bytes"] - capped["components"]["kv"]["params"]["free_bytes"]
    assert diff == pytest.approx(0.9 * (81920 * 2 ** 20 - 24 * 2 ** 30))


@pytest.mark.parametrize("name", sorted(RUN_ARGS))
def test_short_twin_run_per_profile(name, capsys):
    from twin.cli import main

    rc = main(["run", "--profile", name, "--duration", "8", "--rps", "0.5", "--json", *RUN_ARGS[name]])
    out = capsys.readouterr()
    assert rc == 0, out.err
    s = json.loads(out.out)
    assert s["profile"] == name and s["requests_arrived"] > 0
    assert s["requests_finished"] + s["requests_rejected"] + s["requests_unfinished"] == s["requests_arrived"]
    assert s["kv_capacity_tokens"] >= 2048


# ------------------------------------------------------------------------------------ real data
def _lin(params: dict, T: np.ndarray, form: str) -> np.ndarray:
    if form == "roofline":
        return params["a"] + np.maximum(params["c_mem"], params["c_tok"] * T)
    return params["a"] + params["c_tok"] * T


@pytest.mark.data
def test_refit_reproduces_the_a40_profile(real_data):
    """The extended code path still gives the committed A40 profile."""
    from calibration.fitting.vidur import fit_vidur

    d = fit_vidur(real_data / "calibration" / "vidur_linear_ops", "llama-2-7b", "a40", data_root=real_data)
    committed = _committed("llama-2-7b_a40_vidur")
    for kind in ("backbone", "lora", "scheduler", "load", "kv"):
        for k, v in committed["components"][kind]["params"].items():
            assert d["components"][kind]["params"][k] == pytest.approx(v, rel=1e-6), (kind, k)
    assert d["notes"] == committed["notes"]


@pytest.mark.data
@pytest.mark.parametrize("model", MODELS)
def test_refit_reproduces_the_a100_profiles(real_data, model):
    from calibration.fitting.vidur import fit_vidur

    d = fit_vidur(real_data / "calibration" / "vidur_linear_ops", model, "a100-80gb", data_root=real_data)
    committed = _committed(f"{model}_a100-80gb_vidur")
    assert d["provenance"]["measurements"] == committed["provenance"]["measurements"]
    for kind in ("backbone", "lora", "scheduler", "load", "kv"):
        for k, v in committed["components"][kind]["params"].items():
            assert d["components"][kind]["params"][k] == pytest.approx(v, rel=1e-6), (kind, k)
    for tp, table in committed["components"]["backbone"]["tensor_parallel"].items():
        for k, v in table["params"].items():
            assert d["components"]["backbone"]["tensor_parallel"][tp]["params"][k] == pytest.approx(v, rel=1e-6)


@pytest.mark.data
def test_a100_7b_fit_reproduces_vidurs_tables(real_data):
    """Every TP degree's fitted linear-op time against Vidur's measured one, within the stated error."""
    from calibration.fitting.vidur import read_ops
    from twin.model_spec import get_model

    d = _committed("llama-2-7b_a100-80gb_vidur")
    bb = d["components"]["backbone"]
    spec = get_model("llama-2-7b")
    for tp in ("1", "2", "4", "8"):
        ops = read_ops(real_data / "calibration" / "vidur_linear_ops", "a100", spec, int(tp))
        T, y = ops["num_tokens"].to_numpy(), ops["lin_ms"].to_numpy()
        if tp == "1":
            lo = bb["fit"]["linear_ops_forms"]["roofline"]["params"]
            form = "roofline"
        else:
            lo = bb["tensor_parallel"][tp]["fit"]["linear_ops"]["params_ms"]
            form = bb["tensor_parallel"][tp]["fit"]["linear_ops"]["form"]
        err = float(np.mean(np.abs(_lin(lo, T, form) - y) / y) * 100)
        assert err < MEASURED_MAPE_PCT, (tp, err)
        held = bb["fit"]["heldout"]["all" if tp == "1" else f"TP {tp}"]["mape_pct"]
        assert held < MEASURED_MAPE_PCT


@pytest.mark.data
def test_shape_model_predicts_a_model_it_never_saw(real_data):
    """13B and 30B rest on the shape model: fitted without Llama-2-7B (or Llama-3-8B), it predicts that
    model's measured lin(T) at every TP degree within the stated error; the profiles record it."""
    from calibration.fitting.vidur import shape_model_heldout

    ho = shape_model_heldout(real_data / "calibration" / "vidur_linear_ops", "a100")
    assert set(ho["models"]) == {"llama-2-7b", "llama-3.1-8b"}
    for q in ho["models"].values():
        assert q["all"]["mape_pct"] < SHAPE_MODEL_MAPE_PCT
        assert all(v["mape_pct"] < SHAPE_MODEL_MAPE_PCT for v in q["by_tp"].values())
    for model in ("llama-2-13b", "llama-30b"):
        bb = _committed(f"{model}_a100-80gb_vidur")["components"]["backbone"]
        assert bb["fit"]["heldout"]["all"]["mape_pct"] == pytest.approx(ho["all"]["mape_pct"])
        for tp, table in bb["tensor_parallel"].items():
            assert table["fit"]["heldout"]["all"]["mape_pct"] == pytest.approx(ho["by_tp"][tp]["mape_pct"])
            assert table["fit"]["heldout"]["all"]["mape_pct"] < SHAPE_MODEL_MAPE_PCT


def test_testbeds_tables_match_the_committed_results():
    """``python -m calibration.testbeds`` prints the tables committed in results/calibration/testbeds.md."""
    import io

    from calibration.testbeds import main
    from twin.tensor_parallel import kv_capacity_tokens

    buf = io.StringIO()
    assert main(buf) == 0
    text = buf.getvalue()
    assert (ROOT / "results" / "calibration" / "testbeds.md").read_text().endswith(text)
    p = load_profile("llama-30b_a100-80gb_vidur")
    assert f"| llama-30b | A100-80GB | 2 | Vidur TP table | 32.50 | {kv_capacity_tokens(p, 2, 0, 0):,} |" in text
    assert "| llama-2-13b | A100-48GB | 5 | analytical split |" in text
