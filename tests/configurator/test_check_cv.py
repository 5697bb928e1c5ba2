"""Cross-validated check on training labels (`python -m twin.configurator.check_cv`)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from twin.configurator import check as chk
from twin.configurator import check_cv
from twin.sweep.grid import PUBLISHED_GRID

from tests.configurator.test_models import synthetic_labels


def _labels(tmp_path) -> str:
    lab = synthetic_labels(60)
    lab["scenario"] = [chk.scenario_task([float(x) for x in (r["rate_max"], r["rate_mean"], r["rate_min"])], [8, 16, 32],
                                         "llama-3.1-8b_h100_vllm085")["scenario"]["key"] for _, r in lab.iterrows()]
    lab = lab.drop_duplicates("scenario").reset_index(drop=True)
    lab["rates"] = [k.split("_")[1] for k in lab["scenario"]]
    lab["ranks"] = "8-16-32"
    lab["mean_input_tokens"], lab["mean_output_tokens"] = 222.0, 197.0
    lab["policy"], lab["profile"], lab["rule"] = "fcfs+client-cap", "llama-3.1-8b_h100_vllm085", "throughput90"
    lab["ratio_at_label"] = 0.95
    p = tmp_path / "labels.csv"
    lab.to_csv(p, index=False)
    return str(p)


def test_cv_check_against_a_twin_that_starves_above_the_label(tmp_path, monkeypatch, capsys):
    """The fake twin starves exactly above each scenario's label: after the check no recommendation
    starves and none is above its label; below-label recommendations are kept as they are."""
    path = _labels(tmp_path)
    lab = pd.read_csv(path).set_index("scenario")

    def fake_run(sc, n, g, max_rank, **kw):
        ok = n <= lab.loc[sc["key"], "served_adapters"]
        return {"status": "ok", "offered_tok_s": 1000.0, "early_stop": False, "cpu_s": 0.0,
                "throughput_ratio": 0.95 if ok else 0.7, "total_tok_s": 950.0 if ok else 700.0}

    monkeypatch.setattr(chk, "run_config", fake_run)
    out = tmp_path / "cv.csv"
    assert check_cv.main([path, "--folds", "3", "--out", str(out)]) == 0
    s = json.loads(capsys.readouterr().out)
    d = pd.read_csv(out)
    assert s["scenarios"] == len(d) == len(lab)
    above = d["served"] > d["served_adapters"]
    assert s["served_above_label"] == int(above.sum()) and s["starving_in_twin"] == int(above.sum())
    assert s["starving_in_twin_after_check"] == 0 and s["changed_by_check"] == int(above.sum())
    assert (d["checked_served"] <= d[["served", "served_adapters"]].max(axis=1)).all()
    assert (d.loc[~above, "checked_served"] == d.loc[~above, "served"]).all()
    assert s["smape_served_checked"] <= s["smape_served"] + 1e-9
    assert set(d["checked_served"]) <= set(PUBLISHED_GRID)
    assert json.loads(out.with_suffix(".json").read_text())["scenarios"] == s["scenarios"]


def test_cv_check_refuses_a_missing_file_and_other_rules(tmp_path, capsys):
    assert check_cv.main([str(tmp_path / "nope.csv")]) == 2
    assert "no such file" in capsys.readouterr().err
    path = _labels(tmp_path)
    d = pd.read_csv(path)
    d["rule"] = "robust"
    d.to_csv(path, index=False)
    with pytest.raises(ValueError, match="throughput90"):
        check_cv.run(path, None)
    assert check_cv.main([path]) == 2
    assert "give throughput90 labels" in capsys.readouterr().err
