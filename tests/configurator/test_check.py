"""The twin's check of a recommendation (`configure predict --check`, `evaluate --check`)."""

from __future__ import annotations

import argparse
import json
import math

import pandas as pd
import pytest

from twin.configurator import check as chk
from twin.configurator.check import check_recommendation, known_from_runs, scenario_task, step_down, step_down_slots
from twin.configurator.evaluate import checked_predictions
from twin.configurator.search import search

PROFILE = "llama-3.1-8b_h100_vllm085"
GRID = [16, 32, 64, 96, 128, 160, 192, 256, 320, 384]
RATES, RANKS = [0.4, 0.05, 0.00625], [8, 16, 32]


def test_step_down_stays_at_the_slot_value_and_stops_at_served_equal_slots():
    assert step_down(192, 32, GRID) == (160, 32)
    assert step_down(64, 32, GRID) == (32, 32)
    assert step_down(32, 32, GRID) is None  # the rule keeps the slot walk's first run
    assert step_down(16, 16, GRID) is None
    assert step_down(100, 32, [16, 32, 64, 96, 128]) == (96, 32)  # off-grid start: the next value below
    assert step_down_slots(384, 128, GRID) == (384, 96)
    assert step_down_slots(384, 16, GRID) is None


def _row(ratio: float | None, status: str = "ok", early: bool = False) -> dict:
    r = {"status": status, "offered_tok_s": 1000.0, "early_stop": early, "cpu_s": 1.0}
    if status == "ok":
        if early:
            r.update(throughput_ratio=math.nan, total_tok_s=math.nan, tok_s_upper=1000.0 * ratio)
        else:
            r.update(throughput_ratio=ratio, total_tok_s=1000.0 * ratio)
    return r


def _known(rows: dict[tuple[int, int], dict]) -> dict:
    key = scenario_task(RATES, RANKS, PROFILE)["scenario"]["key"]
    return {(key, n, g): r for (n, g), r in rows.items()}


def test_check_steps_down_while_the_twin_starves():
    known = _known({(192, 32): _row(0.80), (160, 32): _row(0.85, early=True), (128, 32): _row(0.93)})
    c = check_recommendation(RATES, RANKS, 192, 32, PROFILE, known=known)
    assert (c["served_adapters"], c["adapter_slots"]) == (128, 32) and c["changed"] and not c["starving"]
    assert [s["served_adapters"] for s in c["steps"]] == [192, 160, 128]
    assert [s["starving"] for s in c["steps"]] == [True, True, False]
    assert c["steps"][1]["ratio_is_upper_bound"] and c["steps"][1]["ratio"] == pytest.approx(0.85)
    assert not any(s["simulated"] for s in c["steps"])
    assert c["throughput_tok_s"] == pytest.approx(930.0)


def test_check_keeps_a_recommendation_that_does_not_starve_and_never_steps_up():
    known = _known({(160, 32): _row(0.95), (192, 32): _row(0.92)})
    c = check_recommendation(RATES, RANKS, 160, 32, PROFILE, known=known)
    assert (c["served_adapters"], c["adapter_slots"], c["changed"]) == (160, 32, False)
    assert len(c["steps"]) == 1


def test_check_stops_at_served_equal_slots():
    known = _known({(64, 32): _row(0.6), (32, 32): _row(0.5)})
    c = check_recommendation(RATES, RANKS, 64, 32, PROFILE, known=known)
    assert (c["served_adapters"], c["adapter_slots"]) == (32, 32) and c["starving"]
    assert c["throughput_tok_s"] == pytest.approx(500.0)


def test_check_steps_the_slots_down_past_a_start_failure():
    known = _known({(64, 64): _row(None, status="start_failure"), (64, 32): _row(0.8), (32, 32): _row(0.95)})
    c = check_recommendation(RATES, RANKS, 64, 64, PROFILE, known=known)
    assert [(s["served_adapters"], s["adapter_slots"], s["status"]) for s in c["steps"]] == [
        (64, 64, "start_failure"), (64, 32, "ok"), (32, 32, "ok")]
    assert (c["served_adapters"], c["adapter_slots"]) == (32, 32) and not c["starving"]
    # nothing starts: the smallest slot value is the end
    known = _known({(32, g): _row(None, status="start_failure") for g in (16, 32)})
    c = check_recommendation(RATES, RANKS, 32, 32, PROFILE, known=known)
    assert (c["served_adapters"], c["adapter_slots"]) == (32, 16) and c["starving"]
    assert math.isnan(c["throughput_tok_s"])


def test_check_refuses_to_judge_a_run_that_failed_in_the_twin():
    known = _known({(64, 32): {"status": "error", "error": "boom"}})
    with pytest.raises(RuntimeError, match="boom"):
        check_recommendation(RATES, RANKS, 64, 32, PROFILE, known=known)


def test_a_check_run_is_the_search_walks_run(tmp_path):
    """The check builds its runs as the search walk does: same scenario key, seed and maximum rank,
    so the same configuration gives the same throughput (short window, small grid)."""
    kw = dict(window_s=120.0, served=[8, 16, 32], slots=[8])
    labels, runs = search([([0.8, 0.4, 0.1], [8, 16, 32])], PROFILE, tmp_path, **kw)
    done = runs[(runs["status"] == "ok") & ~runs["early_stop"].astype(bool)]
    assert len(done)
    r = done.iloc[-1]
    c = check_recommendation([0.8, 0.4, 0.1], [8, 16, 32], int(r["served_adapters"]), int(r["adapter_slots"]),
                             PROFILE, served_grid=[8, 16, 32], window_s=120.0)
    assert c["steps"][0]["simulated"]
    assert c["steps"][0]["ratio"] == r["throughput_ratio"]
    # the walk's rows, given as known, are used as they are (nothing simulated)
    c2 = check_recommendation([0.8, 0.4, 0.1], [8, 16, 32], int(r["served_adapters"]), int(r["adapter_slots"]),
                              PROFILE, served_grid=[8, 16, 32], window_s=120.0, known=known_from_runs(runs))
    assert not c2["steps"][0]["simulated"] and c2["steps"][0]["ratio"] == c["steps"][0]["ratio"]


def test_a_check_with_engine_constants_runs_the_search_walks_engine(tmp_path, monkeypatch):
    """``serving_us`` / ``rank_tile_cost`` reach the check's runs as they reach the search's (the same scenario
    dict, so a search with them and a check with them share runs; run_config applies them, tests/sweep/test_grid.py)."""
    seen = []

    def fake_run(sc, n, g, max_rank, **kw):
        seen.append(dict(sc))
        return _row(0.95)

    monkeypatch.setattr(chk, "run_config", fake_run)
    check_recommendation(RATES, RANKS, 64, 32, PROFILE, serving_us=18.0, rank_tile_cost=0.25)
    check_recommendation(RATES, RANKS, 64, 32, PROFILE)
    assert seen[0]["serving_us"] == 18.0 and seen[0]["rank_tile_cost"] == 0.25
    assert "serving_us" not in seen[1] and "rank_tile_cost" not in seen[1] and seen[0]["key"] == seen[1]["key"]


def test_predict_engine_constants_need_check():
    from tests.helpers import configure_parser
    from twin.configurator.cli import cmd_predict

    ns = configure_parser().parse_args(["configure", "predict", "--rates", "0.4,0.05,0.00625", "--ranks", "8,16,32",
                                        "--serving-us", "18"])
    with pytest.raises(ValueError, match="add --check"):
        cmd_predict(ns)
    ns = configure_parser().parse_args(["configure", "predict", "--rates", "0.4,0.05,0.00625", "--ranks", "8,16,32",
                                        "--check", "--rank-tile-cost", "-1"])
    with pytest.raises(ValueError, match="--rank-tile-cost"):
        cmd_predict(ns)


def test_checked_predictions_score_the_checked_configuration():
    known = _known({(192, 32): _row(0.80), (160, 32): _row(0.95)})
    truth = pd.DataFrame({"scenario": [scenario_task(RATES, RANKS, PROFILE)["scenario"]["key"]],
                          "rates": ["0.4-0.05-0.00625"], "ranks": ["8-16-32"]})
    preds = pd.DataFrame({"scenario": truth["scenario"], "served_raw": [187.8], "slots_raw": [32.0],
                          "throughput": [11000.0]})
    cp, cost = checked_predictions(preds, truth, PROFILE, GRID, GRID, known)
    # the checked configuration is the one recommended; the raw values stay the model's (they were the checked
    # configuration's, so the "+ twin check" rows' raw SMAPE read as the snapped one)
    assert cp.loc[0, "served"] == 160 and cp.loc[0, "slots"] == 32 and cp.loc[0, "check_steps"] == 1
    assert cp.loc[0, "served_raw"] == 187.8 and cp.loc[0, "slots_raw"] == 32.0
    assert cp.loc[0, "throughput"] == pytest.approx(950.0)  # the twin's, since the check changed it
    assert cost == {"check_runs_simulated": 0, "check_cpu_s": 0.0}


def test_predict_check_cli(monkeypatch, capsys):
    """`predict --check` reports the check and recommends the checked configuration (the twin's
    runs replaced by rows that starve above 128 served adapters)."""
    from twin.configurator.cli import register_cli

    def fake_run(sc, n, g, max_rank, **kw):
        return _row(0.95 if n <= 128 else 0.7)

    monkeypatch.setattr(chk, "run_config", fake_run)
    p = argparse.ArgumentParser()
    register_cli(p.add_subparsers())
    ns = p.parse_args(["configure", "predict", "--rates", "0.4,0.05,0.00625", "--ranks", "8,16,32", "--check",
                       "--json"])
    assert ns.func(ns) == 0
    d = json.loads(capsys.readouterr().out)
    m0 = d["model_recommendation"]
    assert d["served_adapters"] == min(m0["served_adapters"], 128)
    assert d["check"]["changed"] == (m0["served_adapters"] > 128)
    assert all(s["served_adapters"] > 128 for s in d["check"]["steps"][:-1])
    ns = p.parse_args(["configure", "predict", "--rates", "0.4,0.05,0.00625", "--ranks", "8,16,32", "--check"])
    assert ns.func(ns) == 0
    # the shipped Llama forest was trained on the validated engine (its provenance): the check runs that one
    assert "twin check on serving_us 18, rank_tile_cost 0.7091 (" in capsys.readouterr().out
    ns = p.parse_args(["configure", "predict", "--rates", "0.4,0.05,0.00625", "--ranks", "8,16,32", "--check",
                       "--profile", "qwen-2.5-7b_h100_vllm085"])  # the shipped Qwen models: the calibrated engine
    assert ns.func(ns) == 0
    assert "twin check on the calibrated engine (serving_us 0, rank_tile_cost the profile's) (" in capsys.readouterr().out


@pytest.mark.data
def test_evaluate_check_adds_a_checked_row_per_model(real_data, tmp_path, monkeypatch, capsys):
    """`evaluate --check` scores each model again after the check (the twin's runs replaced by rows
    that starve above 128 served adapters): the checked rows recommend at most 128 where the model
    said more, and the summary carries the primary model's checked figures."""
    from twin.configurator.cli import register_cli

    monkeypatch.setattr(chk, "run_config", lambda sc, n, g, max_rank, **kw: _row(0.95 if n <= 128 else 0.7))
    p = argparse.ArgumentParser()
    register_cli(p.add_subparsers())
    ns = p.parse_args(["configure", "evaluate", "--real", str(real_data / "validation/vllm085_h100_llama31_8b.csv"),
                       "--no-search", "--check", "--json", "--out", str(tmp_path / "ev")])
    assert ns.func(ns) == 0
    d = json.loads(capsys.readouterr().out)
    names = [r["predictor"] for r in d["table"]]
    assert "random forest + twin check" in names and d["checked"]["predictor"] == "random forest + twin check"
    per = pd.read_csv(tmp_path / "ev" / "per_scenario.csv")
    base = per[per["predictor"] == "random forest"].set_index("scenario")
    chkd = per[per["predictor"] == "random forest + twin check"].set_index("scenario")
    assert (chkd["served"] == base["served"].clip(upper=128)).all()
    assert (chkd["slots"] == base["slots"]).all()
