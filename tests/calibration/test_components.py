"""calibration/fitting/components.py: the fits of the five profile components from observation tables.

Contract tested: the window predictions (:func:`window_backbone_ms`, :func:`window_lora_ms`,
:func:`scheduler_predict_ms`, :func:`kv_tokens_continuous`) follow the step mixture and equations of their
docstrings, computed here by hand; :class:`Candidate` converts the fit's working units (ms, GiB) to the
profile's SI units; :func:`runs_weighted_as_windows` gives runs and windows the same total weight; each
``fit_*`` recovers the constants that generated noise-free observations, picks the simplest form among equally
good ones, reports held-out scores by kind or source, and refuses too few observations with a message naming
the component, the count and the need. Observations are drawn from a seeded generator.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from calibration.fitting import components as C
from calibration.fitting.components import (GIB, LINK_MAX_GBPS, MS, Candidate, fit_backbone, fit_kv, fit_load,
                                            fit_lora, fit_scheduler, fitted_model, kv_tokens_continuous,
                                            runs_weighted_as_windows, scheduler_predict_ms, window_backbone_ms,
                                            window_lora_ms)
from calibration.fitting.core import FitError, ParamSpec
from twin.model_spec import ModelSpec
from twin.perf.forms import FORMS

BACKBONE = dict(c0=0.01, c_prefill=5e-5, c_decode=3e-5, c_ctx=1e-7)


def _linear(**p: float):
    return FORMS[("backbone", "linear")](params={**BACKBONE, **p})


def _additive(**p: float):
    return FORMS[("lora", "additive")](params={"l0": 2e-3, "l_adapter": 3e-4, "l_token": 1e-5, **p})


def _windows(n: int, seed: int = 0, prefill_kind: str = "prefill") -> pd.DataFrame:
    """``n`` step-log windows of 10 steps: even rows decode only, odd rows with 3 prefill steps."""
    rng = np.random.default_rng(seed)
    P = np.where(np.arange(n) % 2 == 0, 0, rng.integers(100, 2000, n)).astype(float)
    return pd.DataFrame({"S": 10.0, "n_pre": np.where(P > 0, 3.0, 0.0), "D": rng.integers(1, 200, n).astype(float),
                         "C": rng.integers(0, 50_000, n).astype(float), "P_step": P,
                         "A": rng.integers(1, 16, n).astype(float), "G": 16.0,
                         "kind": np.where(P > 0, prefill_kind, "decode"), "group": np.arange(n) // 2, "sigma": 1.0})


# ------------------------------------------------------------------ units and window predictions

def test_a_candidate_converts_fitted_working_units_to_si_and_adds_its_fixed_constants() -> None:
    cand = Candidate("graph_linear", "backbone", [ParamSpec("c0", 10.0)], {"graph_max_tokens": 512.0,
                                                                          "c_eager": 0.002},
                     {"c0": MS, "c_prefill": MS, "c_decode": MS, "c_ctx": MS})
    m = cand.model({"c0": 10.0, "c_prefill": 0.05, "c_decode": 0.03, "c_ctx": 0.0})
    assert m.form == "graph_linear"
    assert m.params == pytest.approx({"c0": 0.01, "c_prefill": 5e-5, "c_decode": 3e-5, "c_ctx": 0.0,
                                      "graph_max_tokens": 512.0, "c_eager": 0.002})
    assert cand.si({"c0": 2.0, "unitless": 3.0}) == pytest.approx({"c0": 0.002, "unitless": 3.0})


def test_window_backbone_is_the_mean_of_its_prefill_and_decode_steps_in_ms() -> None:
    f = pd.DataFrame({"S": [10.0, 4.0], "n_pre": [2.0, 0.0], "D": [50.0, 8.0], "C": [10_000.0, 0.0],
                      "P_step": [500.0, 0.0]})
    m = _linear(c0=0.01, c_prefill=1e-4, c_decode=2e-5, c_ctx=1e-8)
    pre = 0.01 + 1e-4 * 500 + 2e-5 * 50 + 1e-8 * 10_000   # 0.0611 s
    dec = 0.01 + 2e-5 * 50 + 1e-8 * 10_000                 # 0.0111 s
    assert window_backbone_ms(m, f) == pytest.approx([(2 * pre + 8 * dec) / 10 * 1000, (0.01 + 2e-5 * 8) * 1000])


def test_window_lora_adds_each_steps_lora_time_over_its_tokens() -> None:
    f = pd.DataFrame({"S": [10.0, 10.0], "n_pre": [2.0, 0.0], "D": [50.0, 50.0], "C": [10_000.0, 10_000.0],
                      "P_step": [500.0, 500.0], "A": [4.0, 0.0], "G": [8.0, 8.0]})
    bb = _linear(c0=0.01, c_prefill=1e-4, c_decode=2e-5, c_ctx=1e-8)
    lo = _additive(l0=1e-3, l_adapter=1e-4, l_token=1e-6)
    pre, dec = 0.0611, 0.0111
    lo_pre = 1e-3 + 1e-4 * 4 + 1e-6 * (500 + 50)  # a prefill step routes its prompt and decode tokens
    lo_dec = 1e-3 + 1e-4 * 4 + 1e-6 * 50
    expected = [(2 * (pre + lo_pre) + 8 * (dec + lo_dec)) / 10 * 1000, 0.0]
    expected[1] = window_backbone_ms(bb, f.iloc[[1]])[0]  # no adapter: the backbone alone
    assert window_lora_ms(bb, lo, f, np.array([16.0, 16.0])) == pytest.approx(expected)


def test_requests_per_step_take_the_running_batch_at_least_one_and_the_chunks_prompts_where_known() -> None:
    f = pd.DataFrame({"D": [0.0, 5.0, 7.0], "R_pre": [np.nan, 2.0, np.nan]})
    dec, pre = C._requests_per_step(f)
    assert dec.tolist() == [1.0, 5.0, 7.0] and pre.tolist() == [1.0, 2.0, 7.0]
    dec, pre = C._requests_per_step(f.drop(columns="R_pre"))
    assert pre.tolist() == dec.tolist() == [1.0, 5.0, 7.0]


def test_runs_weighted_as_windows_gives_both_kinds_the_same_total_weight() -> None:
    sig = np.array([1.0, 1.0, 1.0, 1.0, 2.0, 2.0])
    is_run = np.array([False] * 4 + [True] * 2)
    out = runs_weighted_as_windows(sig, is_run)
    assert np.sum(1 / out[~is_run] ** 2) == pytest.approx(np.sum(1 / out[is_run] ** 2)) == pytest.approx(4.0)
    assert out[:4].tolist() == [1.0] * 4 and out[4] == pytest.approx(2.0 * np.sqrt(0.5 / 4.0))
    assert sig.tolist() == [1.0, 1.0, 1.0, 1.0, 2.0, 2.0]  # (a copy)
    for mask in (np.zeros(6, bool), np.ones(6, bool)):
        same = runs_weighted_as_windows(sig, mask)
        assert same.tolist() == sig.tolist() and same is not sig


def test_scheduler_prediction_is_the_forms_equation_in_ms_with_no_served_adapter_counting_zero() -> None:
    f = pd.DataFrame({"R": [10.0, 10.0], "W": [100.0, 100.0], "G": [8.0, 8.0], "N": [32.0, 0.0]})
    lin = FORMS[("scheduler", "linear_queue")](params={"k0": 1e-4, "k1": 2e-6, "k2": 3e-7, "k3": -2e-7})
    assert scheduler_predict_ms(lin, f) == pytest.approx([(1e-4 + 2e-5 + 3e-5 - 2e-7 * 100 * 0.25) * 1000,
                                                         (1e-4 + 2e-5 + 3e-5) * 1000])
    lq = FORMS[("scheduler", "lora_queue")](params={"k0": 1e-4, "k1": 2e-6, "k1_sq": 1e-8, "k2": 3e-7,
                                                    "k_blocked": 4e-7})
    # blocked share 1 - G/N = 0.75 of 100 waiting (and none without served adapters: max(N, 1) = 1, 1 - 8 < 0)
    base = 1e-4 + 2e-6 * 10 + 1e-8 * 100 + 3e-7 * 100
    assert scheduler_predict_ms(lq, f) == pytest.approx([(base + 4e-7 * 75) * 1000, base * 1000])


def test_kv_tokens_continuous_is_the_free_memory_over_the_bytes_per_token_without_blocks() -> None:
    kvb = 131072.0
    mb = FORMS[("kv", "memory_budget")](params={"free_bytes": 40e9, "slot_bytes_per_rank": 1e6,
                                                "kv_bytes_per_token": kvb})
    slots, rank = np.array([0.0, 8.0]), np.array([8.0, 16.0])
    assert kv_tokens_continuous(mb, slots, rank) == pytest.approx([40e9 / kvb, (40e9 - 8 * 16e6) / kvb])
    af = FORMS[("kv", "memory_budget_affine")](params={"free_bytes": 40e9, "lora_fixed_bytes": 5e8,
                                                       "slot_fixed_bytes": 2e6, "slot_bytes_per_rank": 1e6,
                                                       "kv_bytes_per_token": kvb})
    # LoRA's fixed cost only once an adapter slot exists
    assert kv_tokens_continuous(af, slots, rank) == pytest.approx([40e9 / kvb,
                                                                   (40e9 - 5e8 - 8 * (2e6 + 16e6)) / kvb])


def test_fitted_model_builds_the_entrys_form_from_a_copy_of_its_constants() -> None:
    entry = {"form": "linear", "params": dict(BACKBONE)}
    m = fitted_model(entry, "backbone")
    assert m.form == "linear" and m.params == BACKBONE
    m.params["c0"] = 1.0
    assert entry["params"]["c0"] == BACKBONE["c0"]
    with pytest.raises(KeyError):
        fitted_model({"form": "linear", "params": {}}, "kv")


# ------------------------------------------------------------------ backbone

def test_fit_backbone_recovers_the_constants_and_picks_the_simplest_exact_form() -> None:
    obs = _windows(40)
    obs["comp_ms"] = window_backbone_ms(_linear(), obs)
    out = fit_backbone(obs, method="test method")
    assert out["form"] == "linear" and out["method"] == "test method"
    assert out["params"] == pytest.approx(BACKBONE, rel=1e-6)
    sel = out["selection"]
    assert sel["chosen"] == "linear" and set(out["candidates"]) == {"linear", "graph_linear", "graph_roofline"}
    scores = [s for _, s in sel["ranking"]]
    assert scores == sorted(scores) and sel["ranking"][0][0] == "linear"
    held = out["fit"]["heldout"]
    assert held["all"]["mape_pct"] < 1e-6 and held["decode"]["n"] == 20 and held["prefill"]["n"] == 20
    assert set(out["stderr"]) == set(BACKBONE) and out["units"]["c0"] == "s"
    assert len(out["_oof_ms"]) == 40


@pytest.mark.parametrize("seed,best,chosen", [(2, "graph_linear", "linear"), (3, "graph_linear", "graph_linear")])
def test_fit_backbone_takes_the_form_with_fewer_constants_within_two_percent_of_the_best(
        seed: int, best: str, chosen: str) -> None:
    obs = _windows(40, seed=seed)
    obs["comp_ms"] = window_backbone_ms(_linear(), obs) * np.random.default_rng(seed).uniform(0.98, 1.02, 40)
    sel = fit_backbone(obs)["selection"]
    ranking = dict(sel["ranking"])
    assert sel["ranking"][0][0] == best  # (seed 2: graph_linear by 0.15 %; seed 3: by 10 %)
    n_params = {"linear": 4, "graph_linear": 5, "graph_roofline": 6}
    near = [k for k, v in ranking.items() if v <= min(ranking.values()) * 1.02]
    assert sel["chosen"] == min(near, key=n_params.get) == chosen


def test_fit_backbone_never_fits_mixed_windows_only_predicts_them() -> None:
    obs = pd.concat([_windows(40), _windows(10, seed=1, prefill_kind="mixed")], ignore_index=True)
    obs["comp_ms"] = window_backbone_ms(_linear(), obs)
    obs.loc[obs["kind"] == "mixed", "comp_ms"] *= 3.0  # (their step mixture is not observed)
    out = fit_backbone(obs)
    assert out["params"] == pytest.approx(BACKBONE, rel=1e-6)
    assert out["fit"]["heldout"]["mixed"]["mape_pct"] == pytest.approx(100 * 2 / 3, rel=1e-4)
    assert out["fit"]["train"]["n"] == 45  # (40 windows + 5 decode windows of the mixed set)


def test_fit_backbone_pins_the_fixed_constants() -> None:
    obs = _windows(40)
    obs["comp_ms"] = window_backbone_ms(_linear(c_prefill=7e-5), obs)
    out = fit_backbone(obs, fixed={"c_prefill": 7e-5})
    assert out["params"]["c_prefill"] == 7e-5 and "c_prefill" in out["fixed"]
    assert "c_prefill" not in out["stderr"]
    assert out["params"] == pytest.approx({**BACKBONE, "c_prefill": 7e-5}, rel=1e-6)


def test_fit_backbone_refuses_too_few_windows() -> None:
    with pytest.raises(FitError, match=r"^backbone: no usable step-latency windows$"):
        fit_backbone(_windows(0))
    mixed = _windows(5).assign(kind="mixed")
    obs = pd.concat([_windows(7), mixed], ignore_index=True)
    obs["comp_ms"] = 10.0
    with pytest.raises(FitError, match=r"^backbone: only 7 decode/prefill windows; need at least 8$"):
        fit_backbone(obs)


# ------------------------------------------------------------------ LoRA

def test_fit_lora_recovers_the_additive_constants_over_a_fixed_backbone() -> None:
    obs = _windows(40, prefill_kind="mixed")
    mr = np.full(40, 16.0)
    obs["comp_ms"] = window_lora_ms(_linear(), _additive(), obs, mr)
    out = fit_lora(obs, _linear(), mr)
    assert out["form"] == "additive" and out["selection"]["chosen"] == "additive"
    assert out["params"] == pytest.approx({"l0": 2e-3, "l_adapter": 3e-4, "l_token": 1e-5}, rel=1e-6)
    assert set(out["candidates"]) == {"percent_of_base", "additive", "additive+A*T"}
    assert set(out["fit"]["heldout"]) == {"all", "decode", "mixed"}


def test_fit_lora_scores_windows_and_runs_alike() -> None:
    obs = _windows(30)
    obs["kind"] = obs["kind"].where(obs.index < 20, "run")
    obs["group"] = [f"w{g}" for g in obs["group"][:20]] + [f"run{i}" for i in range(10)]
    mr = np.full(30, 16.0)
    rng = np.random.default_rng(3)
    obs["comp_ms"] = window_lora_ms(_linear(), _additive(), obs, mr) * rng.uniform(0.9, 1.1, 30)
    held = fit_lora(obs, _linear(), mr)["fit"]["heldout"]
    assert held["windows"]["n"] == 20 and held["run"]["n"] == 10
    assert held["all"]["mape_pct"] == pytest.approx((held["windows"]["mape_pct"] + held["run"]["mape_pct"]) / 2)
    assert held["all"]["n"] == 30 and "mean of the windows' and the serving runs'" in held["all"]["note"]


def test_fit_lora_refuses_fewer_than_six_windows() -> None:
    with pytest.raises(FitError, match=r"^lora: 5 usable windows with LoRA enabled; need at least 6$"):
        fit_lora(_windows(5), _linear(), np.full(5, 16.0))


# ------------------------------------------------------------------ scheduler

def _sched_obs(n: int = 60) -> pd.DataFrame:
    rng = np.random.default_rng(1)
    return pd.DataFrame({"R": rng.integers(1, 300, n).astype(float), "W": rng.integers(0, 500, n).astype(float),
                         "G": rng.choice([8, 16, 32], n).astype(float), "N": rng.choice([16, 64, 128], n).astype(float),
                         "source": np.where(np.arange(n) < 45, "windows", "runs"), "group": np.arange(n) // 3})


def test_fit_scheduler_recovers_the_lora_queue_constants() -> None:
    p = {"k0": 2e-4, "k1": 3e-6, "k1_sq": 1e-9, "k2": 2e-7, "k_blocked": 5e-7}
    obs = _sched_obs()
    obs["sched_ms"] = scheduler_predict_ms(FORMS[("scheduler", "lora_queue")](params=p), obs)
    out = fit_scheduler(obs)
    assert out["form"] == "lora_queue" and out["params"] == pytest.approx(p, rel=1e-4)
    assert [k for k, _ in out["selection"]["ranking"]] == ["lora_queue", "linear_queue"]


def test_fit_scheduler_scores_each_source_and_ranks_forms_by_their_mean() -> None:
    p = {"k0": 2e-4, "k1": 3e-6, "k2": 2e-7, "k3": 0.0}
    obs = _sched_obs()
    obs["sched_ms"] = scheduler_predict_ms(FORMS[("scheduler", "linear_queue")](params=p), obs)
    obs["sched_ms"] *= np.random.default_rng(2).uniform(0.95, 1.05, len(obs))
    out = fit_scheduler(obs)
    assert out["form"] == "linear_queue" and out["params"] == pytest.approx(p, abs=5e-5)
    held = out["fit"]["heldout"]
    assert set(held) == {"windows", "runs", "all"}
    assert held["windows"]["n"] == 45 and held["runs"]["n"] == 15
    # every source counts the same in the criterion, whatever its rows
    assert held["all"]["mape_pct"] == pytest.approx((held["windows"]["mape_pct"] + held["runs"]["mape_pct"]) / 2)
    assert held["all"]["n"] == 60
    assert dict(out["selection"]["ranking"])["linear_queue"] == held["all"]["mape_pct"]


def test_fit_scheduler_gives_each_source_its_weight_whatever_its_rows() -> None:
    obs = _sched_obs()
    # the two sources disagree by a factor 2: the fit lands between them, pulled toward the heavier one
    lin = FORMS[("scheduler", "linear_queue")](params={"k0": 2e-4, "k1": 3e-6, "k2": 2e-7, "k3": 0.0})
    obs["sched_ms"] = scheduler_predict_ms(lin, obs) * np.where(obs["source"] == "runs", 2.0, 1.0)
    even = fit_scheduler(obs)["fit"]["heldout"]
    runs_heavy = fit_scheduler(obs, source_weight={"runs": 100.0})["fit"]["heldout"]
    assert runs_heavy["runs"]["mape_pct"] < even["runs"]["mape_pct"]
    assert runs_heavy["windows"]["mape_pct"] > even["windows"]["mape_pct"]


# ------------------------------------------------------------------ adapter loads

SPEC = ModelSpec("t-load", hidden=4096, layers=32, heads=32, kv_heads=32, intermediate=8192, vocab=1000,
                 max_model_len=4096)
TARGETS = ("q_proj",)


def _bytes(rank: int) -> int:
    return 32 * rank * (4096 + 4096) * 2  # layers x r (d_in + d_out) x fp16


def _link_loads(ranks=(8, 16, 32), fixed=None, gbps=None, max_rank=None, reps: int = 2) -> pd.DataFrame:
    """Loads of each rank in turn, ``reps`` times in each of two server starts per source, at the link model's
    times (``fixed`` ms + bytes / ``gbps``)."""
    fixed = fixed or {"disk": 20.0, "cpu": 2.0}
    gbps = gbps or {"disk": 2.0, "cpu": 20.0}
    rows = []
    for src in ("disk", "cpu"):
        for g in range(2):
            for _ in range(reps):
                for r in ranks:
                    rows.append({"source": src, "rank": r, "group": f"{src}{g}",
                                 "load_ms": fixed[src] + _bytes(r) / 1e9 / gbps[src] * 1e3})
    df = pd.DataFrame(rows)
    if max_rank is not None:
        df["max_rank"] = max_rank(df)
    return df


def test_fit_load_recovers_the_link_model_and_tables_the_mean_per_rank_in_seconds() -> None:
    assert SPEC.adapter_bytes(8, TARGETS) == _bytes(8)
    out = fit_load(_link_loads(), SPEC, TARGETS, method="m")
    p = out["params"]
    assert out["form"] == "link" and out["method"] == "m"
    got = (p["disk_fixed_s"], p["disk_gbps"], p["cpu_fixed_s"], p["cpu_gbps"])
    assert got == pytest.approx((0.02, 2.0, 0.002, 20.0), rel=1e-5)
    for src, (f, bw) in {"disk": (20.0, 2.0), "cpu": (2.0, 20.0)}.items():
        assert p["table_s"][src] == pytest.approx({str(r): (f + _bytes(r) / 1e9 / bw * 1e3) / 1e3 for r in (8, 16, 32)},
                                                  rel=1e-5)
        assert out["stderr"]["table_s"][src] == {"8": 0.0, "16": 0.0, "32": 0.0}
        assert out["fit"]["heldout"][src]["n_loads"] == 12 and out["fit"]["heldout"][src]["ranks"] == [8, 16, 32]
    assert "at_bound" not in out and "table_by_max_rank_s" not in out


def test_fit_load_tables_the_mean_and_its_standard_error_and_scores_each_half_on_the_other() -> None:
    # one rank; cpu: loads of 2 then 4 ms in one server start, 2 then 10 ms in the other; disk: 10 then 30 ms in both
    loads = {"cpu": [(2.0, 4.0), (2.0, 10.0)], "disk": [(10.0, 30.0), (10.0, 30.0)]}
    rows = [{"source": s, "rank": 8, "group": f"{s}{g}", "load_ms": v}
            for s, starts in loads.items() for g, vals in enumerate(starts) for v in vals]
    out = fit_load(pd.DataFrame(rows), SPEC, TARGETS)
    assert out["params"]["table_s"] == {"cpu": {"8": 0.0045}, "disk": {"8": 0.02}}  # means, not medians
    se = np.std([2.0, 4.0, 2.0, 10.0], ddof=1) / 2 / 1e3
    assert out["stderr"]["table_s"]["cpu"]["8"] == pytest.approx(se, rel=1e-3)
    # cpu: the first loads (2, 2 ms) predicted by the mean of the second ones (7 ms): 250 % each; the second
    # ones (4, 10 ms) by the first ones' (2 ms): 50 % and 80 %. disk: 200 % and 66.7 %
    cpu_mape, disk_mape = (250 + 250 + 50 + 80) / 4, (200.0 + 200 / 3) / 2
    assert out["fit"]["heldout"]["cpu"]["table"]["mape_pct"] == pytest.approx(cpu_mape, rel=1e-5)
    assert out["fit"]["heldout"]["disk"]["table"]["mape_pct"] == pytest.approx(disk_mape, rel=1e-5)
    assert out["fit"]["heldout"]["all"]["mape_pct"] == pytest.approx((cpu_mape + disk_mape) / 2, rel=1e-5)
    # one rank: the bandwidth cannot be told from the fixed cost; it stays at the link's physical bound
    assert out["params"]["cpu_gbps"] == LINK_MAX_GBPS["cpu"] and out["params"]["disk_gbps"] == LINK_MAX_GBPS["disk"]
    assert set(out["at_bound"]) == {"cpu_gbps", "disk_gbps"}
    transfer_ms = _bytes(8) / 1e9 / LINK_MAX_GBPS["cpu"] * 1e3
    assert out["params"]["cpu_fixed_s"] == pytest.approx((4.5 - transfer_ms) / 1e3, rel=1e-5)


def test_fit_load_keeps_a_table_per_slot_max_rank_when_several_were_measured() -> None:
    # each server start: every rank twice into rank-32 slots, then twice into rank-64 slots (1 ms more)
    loads = _link_loads(reps=4, max_rank=lambda df: np.where(df.groupby("group").cumcount() < 6, 32, 64))
    loads.loc[loads["max_rank"] == 64, "load_ms"] += 1.0
    out = fit_load(loads, SPEC, TARGETS)
    by = out["table_by_max_rank_s"]
    for src, (f, bw) in {"disk": (20.0, 2.0), "cpu": (2.0, 20.0)}.items():
        for mr, extra in (("32", 0.0), ("64", 1.0)):
            assert by[src][mr] == pytest.approx({str(r): (f + extra + _bytes(r) / 1e9 / bw * 1e3) / 1e3
                                                 for r in (8, 16, 32)}, rel=1e-5)
        # the rank-only table averages over both slot sizes (0.5 ms more than rank-32 slots)
        assert out["params"]["table_s"][src] == pytest.approx({str(r): (f + 0.5 + _bytes(r) / 1e9 / bw * 1e3) / 1e3
                                                               for r in (8, 16, 32)}, rel=1e-5)
    q = out["fit"]["heldout_table_by_max_rank"]["cpu"]
    assert q["n"] == 24 and q["mape_pct"] == pytest.approx(0.0, abs=1e-9)
    assert "table_by_max_rank_note" in out


def test_fit_load_refuses_missing_measurements_naming_the_source() -> None:
    with pytest.raises(FitError, match=r"^load: no adapter-load measurements$"):
        fit_load(_link_loads().iloc[0:0], SPEC, TARGETS)
    loads = _link_loads()
    with pytest.raises(FitError, match=r"^load: no cpu loads in the measurements$"):
        fit_load(loads[loads["source"] == "disk"], SPEC, TARGETS)


# ------------------------------------------------------------------ KV capacity

KVB = 131072.0


def _kv_obs() -> pd.DataFrame:
    slots = np.array([1, 2, 4, 8, 16, 32, 8, 16, 64], float)
    rank = np.array([8, 8, 16, 16, 32, 32, 64, 64, 16], float)
    tokens = (40 * GIB - slots * 0.006 * GIB * rank) / KVB
    return pd.DataFrame({"slots": slots, "rank": rank, "tokens": tokens, "group": np.arange(len(slots))})


def test_fit_kv_recovers_the_memory_budget_and_classifies_the_probe_starts() -> None:
    probes = pd.DataFrame({"slots": [8, 512, 256, 4], "rank": [8, 128, 64, 8], "ok": [True, False, True, False]})
    out = fit_kv(_kv_obs(), probes, int(KVB), max_model_len=32768)
    assert out["form"] == "memory_budget"
    assert out["params"] == pytest.approx({"free_bytes": 40 * GIB, "slot_bytes_per_rank": 0.006 * GIB,
                                           "kv_bytes_per_token": KVB}, rel=1e-6)
    # capacity (blocks of 16): 8 x 8 -> ~327k ok; 512 x 128 and 256 x 64 -> none (0 < 32768); 4 x 8 -> ok
    cls = out["classification"]
    assert (cls["correct"], cls["total"], cls["ok_predicted_ok"], cls["ok_total"], cls["failed_predicted_failed"],
            cls["failed_total"]) == (2, 4, 1, 2, 1, 2)
    mis = {(m["slots"], m["max_rank"]): m for m in cls["misclassified"]}
    assert set(mis) == {(256, 64), (4, 8)}
    assert mis[(256, 64)]["measured"] == "ok" and mis[(256, 64)]["predicted_tokens"] == 0
    assert mis[(4, 8)]["measured"] == "failed"
    assert mis[(4, 8)]["predicted_tokens"] == int((40 * GIB - 4 * 0.006 * GIB * 8) // KVB // 16 * 16)


def test_fit_kv_fixes_the_lora_cost_when_no_start_without_lora_was_measured() -> None:
    out = fit_kv(_kv_obs(), pd.DataFrame({"slots": [], "rank": [], "ok": []}), int(KVB), 4096)
    aff = out["candidates"]["memory_budget_affine"]["params"]
    assert aff["lora_fixed_bytes"] == 0.0
    assert out["classification"]["total"] == 0


def test_fit_kv_refuses_fewer_than_four_measurements() -> None:
    with pytest.raises(FitError, match=r"^kv: 3 capacity measurements; need at least 4$"):
        fit_kv(_kv_obs().iloc[:3], pd.DataFrame({"slots": [], "rank": [], "ok": []}), int(KVB), 4096)
