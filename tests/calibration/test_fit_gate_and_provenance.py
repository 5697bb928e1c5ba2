"""`twin calibrate fit`'s quality gate (calibration.fitting.core.fit_quality_problems), the commands the profiles
record, and what the shipped profiles say about their own data: the variants fitted on validation runs, a constant
pinned at a bound, the vLLM 0.5.0 profile's decode-only terms. Tests that refit skip without ``TWIN_DATA_DIR``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from calibration.fitting.core import MAX_HELDOUT_MAPE_PCT, fit_quality_problems
from twin.perf.profile import available_profiles, load_profile

ROOT = Path(__file__).resolve().parents[2]
PROFILES = ROOT / "calibration" / "profiles"


def _committed(name: str) -> dict:
    return json.loads((PROFILES / f"{name}.json").read_text())


def _fit(argv: list[str], capsys) -> tuple[int, str, str]:
    from twin.cli import main

    rc = main(["calibrate", "fit", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


# ------------------------------------------------------------------------------------------ the gate (defect 4)
def _component(**kw) -> dict:
    base = {"form": "linear", "params": {"c0": 0.01, "c_prefill": 1e-5, "c_decode": 1e-5, "c_ctx": 1e-8},
            "units": {"c0": "s"}, "fixed": [], "fit": {"heldout": {"all": {"mape_pct": 4.0, "r2": 0.97}}}}
    base.update(kw)
    return base


@pytest.mark.parametrize("comp,fragment", [
    (_component(at_bound=["c0", "c_prefill", "c_decode", "c_ctx"]), "every constant its fit estimated ended on a "
                                                                    "bound of the fit (c0 = 0.01 s, c_prefill = 1e-05"),
    (_component(fit={"heldout": {"all": {"mape_pct": 297.4, "r2": 0.5}}}), f"held-out MAPE 297.4 % (the limit: "
                                                                           f"{MAX_HELDOUT_MAPE_PCT:g} %)"),
    (_component(fit={"heldout": {"all": {"mape_pct": 4.0, "r2": -2.59}}}), "held-out R^2 -2.59 (below 0"),
])
def test_the_gate_names_the_component_and_its_figures(comp, fragment):
    problems = fit_quality_problems({"components": {"backbone": comp}})
    assert len(problems) == 1 and problems[0].startswith("backbone (linear): ") and fragment in problems[0], problems


def test_the_gate_passes_a_constant_at_a_bound_beside_fitted_ones_and_estimated_components():
    ok = {"backbone": _component(at_bound=["c0"]),  # (one of four: e.g. the shipped profiles' scheduler k2)
          "lora": {"form": "kernel_grid", "params": {"l_cta": 1e-9}, "fit": {"heldout": {"all": {"note": "estimated"}}}},
          "kv": _component(fixed=["c0", "c_prefill", "c_decode"], at_bound=["c_ctx"])}  # (fixed ones do not count)
    assert fit_quality_problems({"components": ok})[:1] == ["kv (linear): every constant its fit estimated ended on a "
                                                            "bound of the fit (c_ctx = 1e-08)"]
    del ok["kv"]
    assert fit_quality_problems({"components": ok}) == []


@pytest.mark.parametrize("name", sorted(n for n, p in available_profiles().items() if p is not None))
def test_every_shipped_profile_passes_the_gate(name):
    assert fit_quality_problems(_committed(name)) == []


def _tables(real_data: Path, tmp_path: Path, edit) -> Path:
    src = real_data / "calibration" / "vllm085_h100"
    d = tmp_path / "tables"
    shutil.copytree(src, d)
    t = pd.read_csv(src / "step_latency.csv")
    edit(t)
    t.to_csv(d / "step_latency.csv", index=False)
    return d


def _in_us(t):
    for c in ("mean_step_ms", "median_step_ms", "max_step_ms"):
        t[c] = t[c] * 1000


def _sched_above_step(t):
    t["mean_scheduler_ms"] = t["mean_step_ms"] * 1.5


@pytest.mark.data
@pytest.mark.parametrize("edit,figures", [
    # every backbone constant at its upper bound, held-out MAPE 297 %, R^2 -2.59: written, exit 0
    (_in_us, ["backbone (linear): every constant its fit estimated ended on a bound", "held-out MAPE 297.4 %",
              "held-out R^2 -2.59"]),
    # the backbone at 6e-24 s per sequence, held-out MAPE 100 %: written, exit 0, and it loaded
    (_sched_above_step, ["backbone (linear): every constant its fit estimated ended on a bound",
                         "held-out MAPE 100 %"]),
])
def test_a_failed_fit_is_refused_and_nothing_written(real_data, tmp_path, capsys, edit, figures):
    d = _tables(real_data, tmp_path, edit)
    out = tmp_path / "profile.json"
    rc, stdout, err = _fit(["--measurements", str(d), "--model", "llama-3.1-8b", "--out", str(out), "--quiet"], capsys)
    assert rc == 2 and not out.exists() and stdout == "", err
    assert "twin calibrate fit: error: the fit of profile 'llama-3.1-8b_h100_vllm085' does not describe its tables, " \
           "so no profile was written" in err
    assert all(f in err for f in figures), err
    assert "microseconds" in err and "--allow-poor-fit" in err and "Traceback" not in err
    # the override writes it, and records why
    rc, stdout, err = _fit(["--measurements", str(d), "--model", "llama-3.1-8b", "--out", str(out), "--quiet",
                            "--allow-poor-fit"], capsys)
    assert rc == 0 and out.exists(), err
    prof = json.loads(out.read_text())
    assert any(figures[0] in p for p in prof["provenance"]["poor_fit"])
    assert prof["provenance"]["command"].endswith("--allow-poor-fit")


@pytest.mark.data
@pytest.mark.parametrize("name,measurements", [
    ("llama-2-7b_h100_vllm050", "vllm050_h100_llama2"), ("qwen-2.5-7b_h100_vllm085", "vllm085_h100")])
def test_the_documented_command_passes_the_gate_and_records_the_data_dir(real_data, tmp_path, capsys, monkeypatch,
                                                                        name, measurements):
    """A committed profile's command reruns as written (``$TWIN_DATA_DIR``, the profile's own path) and passes the
    gate; the vLLM 0.5.0 profile regenerates whole, its decode-only disclosure included."""
    monkeypatch.setenv("TWIN_DATA_DIR", str(real_data))
    monkeypatch.chdir(ROOT)
    out = tmp_path / f"{name}.json"
    model = _committed(name)["model"]
    rc, _, err = _fit(["--measurements", str(real_data / "calibration" / measurements) + "/", "--model", model,
                       "--out", str(out), "--quiet"], capsys)
    assert rc == 0, err
    new = json.loads(out.read_text())
    assert new["provenance"]["command"] == (f"twin calibrate fit --measurements $TWIN_DATA_DIR/calibration/"
                                            f"{measurements}/ --model {model} --out {out}")
    if name.endswith("vllm050"):
        committed = _committed(name)
        assert committed["provenance"]["command"] == new["provenance"]["command"].replace(
            str(out), f"calibration/profiles/{name}.json")
        new["provenance"]["command"] = committed["provenance"]["command"]
        assert new == committed  # every section: the constants, the notes, each component's method


# ------------------------------------------------------------------------------------------ vLLM 0.5.0 (defect 5)
def test_the_vllm050_profile_discloses_its_decode_only_terms():
    d = _committed("llama-2-7b_h100_vllm050")
    note = next(n for n in d["notes"] if n.startswith("Decode-only extrapolations"))
    p = load_profile("llama-2-7b_h100_vllm050")
    pre, dec = p.step_s(512, 0, 0, 1, 0, 8, 1, 1, 0, 1), p.step_s(0, 1, 0, 1, 0, 8, 1, 1, 0, 1)
    lora = p.step_s(512, 0, 0, 1, 1, 8, 1, 1, 0, 1) - pre
    assert pre < dec  # the extrapolation the note states
    for figure in (f"adds {lora * 1e3:.1f} ms to a 512-token prefill whose base step is {pre * 1e3:.1f} ms",
                   f"c_seq = {d['components']['backbone']['params']['c_seq'] * 1e6:.0f} us per decode sequence",
                   f"prices below one decode token ({dec * 1e3:.1f} ms)", "l_token = 0.24 ms per token"):
        assert figure in note, figure
    assert "decode steps only" in d["components"]["lora"]["method"]
    readme = (ROOT / "results" / "calibration" / "README.md").read_text()
    assert "`llama-2-7b_h100_vllm050` is fitted on run-level decode data only" in readme
    assert note in (ROOT / "results" / "calibration" / "fit_quality.md").read_text()


# ------------------------------------------------------------------------------------------ provenance (defect 7)
@pytest.mark.parametrize("name", sorted(n for n, p in available_profiles().items() if p is not None))
def test_a_profile_says_whether_validation_runs_went_into_it(name):
    """A variant whose constant was fitted on the validation's dt_modelling runs says so (the ranktile variants said
    ``validation_data_used: false``); none was fitted on ml_test."""
    prov = _committed(name)["provenance"]
    data = (prov.get("variant") or {}).get("data", "")
    assert isinstance(prov["validation_data_used"], bool)
    assert prov["validation_data_used"] == ("dt_modelling" in data), (name, data)
    assert "never ml_test" in data or "ml_test" not in data


def test_the_calibration_readme_names_the_variants_fitted_on_validation_runs():
    readme = (ROOT / "results" / "calibration" / "README.md").read_text()
    assert "Their constants come from the calibration tables\nonly" not in readme
    assert "`_interval_ranktile` variants' `lora.params.n_tile_cost`" in readme and "`dt_modelling`" in readme


# ------------------------------------------------------------------------------------------ at_bound (defect 8)
def test_the_interval_variant_keeps_the_base_fits_constants_at_a_bound():
    from calibration.fitting.serving_interval import interval_variant

    raw = _committed("llama-3.1-8b_h100_vllm085")
    assert raw["components"]["scheduler"]["at_bound"] == ["k2"]
    fit = {"chosen": "prefill_adapters+blocked_waiting", "candidates": {"prefill_adapters+blocked_waiting": {
        "params": {"pre_A": 0.4, "Wb": 0.0}, "stderr": {"pre_A": 0.01, "Wb": float("nan")}, "at_bound": ["Wb"],
        "heldout": {}}}}
    out = interval_variant(raw, fit)
    sch = out["components"]["scheduler"]
    assert sch["at_bound"] == ["k2", "k_walk"] and sch["stderr"]["k2"] is None
    assert "at_bound" not in out["components"]["mixed"]
    for name in ("llama-3.1-8b_h100_vllm085_interval", "llama-3.1-8b_h100_vllm085_interval_ranktile"):
        committed = _committed(name)["components"]["scheduler"]
        assert committed["at_bound"] == ["k2"] and committed["stderr"]["k2"] is None, name


@pytest.mark.data
def test_the_interval_variant_regenerates_with_its_command(real_data, tmp_path, monkeypatch):
    """``python -m calibration.fitting.serving_interval --write`` gives the committed variant, at_bound included."""
    from calibration.fitting import serving_interval

    base = tmp_path / "llama-3.1-8b_h100_vllm085.json"
    shutil.copy(PROFILES / base.name, base)
    monkeypatch.setenv("TWIN_DATA_DIR", str(real_data))
    assert serving_interval.main(["--profile", str(base), "--write"]) == 0
    new = json.loads((tmp_path / "llama-3.1-8b_h100_vllm085_interval.json").read_text())
    assert new == _committed("llama-3.1-8b_h100_vllm085_interval")
