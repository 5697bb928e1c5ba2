"""The shipped configurators can be traced to committed labels, and none was trained on a test scenario.

Every model file under ``twin/configurator/models/`` names its training sources in its provenance;
for a shipped model that is a labels table under ``results/configurator/`` (so anyone can retrain it
without sweeping), and the table must be the one the model was fitted on: same profile, rule and number
of scenarios, and the model's stored domain is the box of that table's features. The real ``ml_test``
scenarios are the held-out test set of the published configurators: no shipped model's labels may hold
one (the Qwen real test runs are not shared; the Llama ``ml_test`` scenarios are kept out of both).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from twin.configurator.labels import FEATURES
from twin.configurator.models import MODEL_DIR, read_model_text

REPO = Path(__file__).resolve().parents[2]
SHIPPED = sorted(MODEL_DIR.glob("*.json*"))


def _profile_of(path: Path) -> str:
    """``<profile>.<kind>.json[.gz]`` -> ``<profile>`` (profile names hold dots: ``llama-3.1-8b_...``)."""
    return path.name.split(".json")[0].rsplit(".", 1)[0]


def _provenance(path: Path) -> dict:
    return json.loads(read_model_text(path))["provenance"]


def _labels(path: Path) -> pd.DataFrame:
    (src,) = _provenance(path)["sources"]
    return pd.read_csv(REPO / src)


def test_there_are_shipped_models_for_both_profiles():
    profiles = {_profile_of(p) for p in SHIPPED}
    assert {"llama-3.1-8b_h100_vllm085", "qwen-2.5-7b_h100_vllm085"} <= profiles


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_a_shipped_model_comes_from_a_committed_labels_table(path):
    prov = _provenance(path)
    sources = prov["sources"]
    assert len(sources) == 1 and sources[0].startswith("results/configurator/") and (
        Path(sources[0]).name.startswith("labels_")), (
        f"{path.name} was trained from {sources}: retrain it from a committed labels table")
    lab = _labels(path)
    profile = _profile_of(path)
    assert prov["profile"] == profile and set(lab["profile"]) == {profile}
    assert set(lab["rule"]) == {prov["rule"]}
    assert len(lab) == lab["scenario"].nunique() == prov["scenarios"]
    assert sorted(prov["domain"]) == sorted(FEATURES)
    for f in FEATURES:
        assert prov["domain"][f] == pytest.approx([lab[f].min(), lab[f].max()], rel=1e-12), (path.name, f)


@pytest.mark.data
@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_no_shipped_model_was_trained_on_a_test_scenario(path, real_data):
    from twin.sweep.scenario import load_real

    real = load_real(real_data / "validation" / "vllm085_h100_llama31_8b.csv")
    test = set(real.loc[real["source"] == "ml_test", "scenario"])
    assert len(test) == 9
    held = sorted(test & set(_labels(path)["scenario"]))
    assert not held, f"{path.name} was trained on the test scenarios {held}"


VALIDATED = REPO / "results" / "configurator" / "validated"


@pytest.mark.parametrize("path", sorted(MODEL_DIR.glob("llama-3.1-8b_h100_vllm085.*")), ids=lambda p: p.name)
def test_the_shipped_llama_models_come_from_the_whole_validated_sweep(path):
    """The shipped Llama-3.1-8B models (results/configurator/README.md, "What ships when the sweep is whole"):
    trained on the validated engine's labels of all 831 non-test scenarios, whose engine is the named grid's
    (twin.sweep.grid.VALIDATED_ENGINE), which their provenance records for the twin's check."""
    from twin.configurator.labels import engines_of
    from twin.configurator.models import model_engine
    from twin.sweep.grid import VALIDATED_ENGINE

    m = json.loads(read_model_text(path))
    lab = pd.read_csv(VALIDATED / "labels_llama_validated_throughput90.csv")
    assert engines_of(lab) == [VALIDATED_ENGINE]
    assert model_engine(m) == VALIDATED_ENGINE
    assert m["provenance"]["sources"] == ["results/configurator/validated/labels_llama_validated_throughput90.csv"]
    assert m["provenance"]["rule"] == "throughput90" and len(lab) == 831
    runs = pd.read_parquet(VALIDATED / "runs_llama_validated.parquet")
    assert set(runs["scenario"]) == set(lab["scenario"])


@pytest.mark.parametrize("path", sorted(MODEL_DIR.glob("qwen-2.5-7b_h100_vllm085.*")), ids=lambda p: p.name)
def test_the_shipped_qwen_models_stay_on_the_calibrated_engine(path):
    """The validated engine's constants were fitted on Llama runs; the Qwen models keep the calibrated engine."""
    from twin.configurator.labels import CALIBRATED_ENGINE
    from twin.configurator.models import model_engine

    m = json.loads(read_model_text(path))
    assert model_engine(m) == model_engine({"provenance": {"engine": CALIBRATED_ENGINE}})
    assert m["provenance"]["sources"] == ["results/configurator/labels_qwen_throughput90.csv"]


def test_the_validated_sample_runs_give_its_labels():
    """The committed run table of the sample is enough to label it again (any rule): throughput90 from it
    equals the committed labels."""
    from twin.configurator.dataset import build_dataset, load_runs

    again = build_dataset(load_runs([VALIDATED / "runs_llama_validated.parquet"]))
    lab = pd.read_csv(VALIDATED / "labels_llama_validated_throughput90.csv")
    cols = ["scenario", "served_adapters", "adapter_slots", "throughput_tok_s", "serving_us", "rank_tile_cost"]
    pd.testing.assert_frame_equal(again[cols].sort_values("scenario").reset_index(drop=True),
                                  lab[cols].sort_values("scenario").reset_index(drop=True), check_dtype=False)
    test = {"rate_0.4-0.05-0.00625_size_8-16-32", "rate_0.8-0.4-0.05_size_8-8-32", "rate_3.2-1.6-0.1_size_8-8-32"}
    assert not test & set(lab["scenario"])


ADAPTERCHECK = REPO / "results" / "configurator" / "adaptercheck"


def test_the_configurator_default_is_the_adapter_check_engine():
    """``twin configure`` without --profile recommends with the adapter-check engine's models (results/configurator/
    README.md, "The adapter-check engine's sweep"); the runs of Llama-3.1-8B map to it, other models keep theirs."""
    from twin.configurator.models import DEFAULT_PROFILE, shipped_model_path
    from twin.perf.profile import default_variant

    assert DEFAULT_PROFILE == "llama-3.1-8b_h100_vllm085_adaptercheck"
    assert default_variant("llama-3.1-8b_h100_vllm085") == DEFAULT_PROFILE
    assert default_variant("qwen-2.5-7b_h100_vllm085") == "qwen-2.5-7b_h100_vllm085"
    for kind in ("rf", "cart", "hstree", "figs", "rulefit"):
        assert shipped_model_path(DEFAULT_PROFILE, kind).exists(), kind


def test_one_default_profile_across_the_commands():
    """`twin run` (no --profile), `twin validate` for Llama runs, a sweep grid without a profile and `twin configure`
    pick the same profile, whose configurators ship (they differed until stop 63: the configurator alone used the
    adapter-check variant)."""
    from twin.configurator.models import DEFAULT_PROFILE, shipped_model_path
    from twin.perf.profile import DEFAULT_FITTED, load_profile
    from twin.sweep.scenario import get_profile
    from twin.validation.profiles import profile_for_model

    assert load_profile(None).name == DEFAULT_FITTED == DEFAULT_PROFILE
    assert profile_for_model("meta-llama/Llama-3.1-8B-Instruct") == DEFAULT_FITTED
    assert get_profile(None).name == DEFAULT_FITTED
    assert shipped_model_path(DEFAULT_FITTED, "rf").exists()


@pytest.mark.parametrize("path", sorted(MODEL_DIR.glob("llama-3.1-8b_h100_vllm085_adaptercheck.*")), ids=lambda p: p.name)
def test_the_adapter_check_models_come_from_its_sweeps_committed_labels(path):
    """Trained on the adapter-check sweep's committed labels, whose engine is the validated grid's constants on the
    variant profile (twin.sweep.grid, ``adapter-twin-llama-adaptercheck``); the committed runs give those labels."""
    from twin.configurator.dataset import build_dataset, load_runs
    from twin.configurator.labels import engines_of
    from twin.configurator.models import model_engine
    from twin.sweep.grid import VALIDATED_ENGINE

    m = json.loads(read_model_text(path))
    src = "results/configurator/adaptercheck/labels_llama_adaptercheck_throughput90.csv"
    lab = pd.read_csv(REPO / src)
    assert m["provenance"]["sources"] == [src] and m["provenance"]["rule"] == "throughput90"
    assert engines_of(lab) == [VALIDATED_ENGINE] and model_engine(m) == VALIDATED_ENGINE
    assert set(lab["profile"]) == {"llama-3.1-8b_h100_vllm085_adaptercheck"}
    again = build_dataset(load_runs([ADAPTERCHECK / "runs_llama_adaptercheck.parquet"]))
    cols = ["scenario", "served_adapters", "adapter_slots", "throughput_tok_s", "serving_us", "rank_tile_cost"]
    pd.testing.assert_frame_equal(again[cols].sort_values("scenario").reset_index(drop=True),
                                  lab[cols].sort_values("scenario").reset_index(drop=True), check_dtype=False)
