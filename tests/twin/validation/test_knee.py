"""twin/validation/knee.py: the twin at the real runs' 90 % crossings.

Contract tested: per (scenario, slot count), walking the runs in the order of the served adapters, the *first*
step from a real throughput / offered at or above 0.9 to one below it gives two rows (``last_above``,
``first_below``) with the real and twin ratios and ``twin - real`` in points, within +-2 points or not; runs
that are not ``ok``, have no real throughput or come from another source are left out; :func:`summary` counts
and summarises them; :func:`seed_spread` sets several passes of the same runs side by side (ratio per pass,
mean, spread) and refuses passes of different runs. Expected values are computed here from the definition.
(``tests/twin/validation/test_crossings.py`` covers the command line and one simple walk.)
"""

from __future__ import annotations

import math
import statistics

import numpy as np
import pandas as pd
import pytest

from twin.validation.knee import LINE, TOLERANCE_POINTS, crossings_from_per_run, seed_spread, summary

OFFERED = 2000.0


def _walk(real: list[float], twin: list[float], served: list[int] | None = None, scenario: str = "s",
          slots: int = 16, source: str = "dt_modelling", status: str | list[str] = "ok") -> pd.DataFrame:
    """One scenario and slot count: runs at ``served`` adapters with these real / twin throughput over offered."""
    served = served or [8 * (i + 1) for i in range(len(real))]
    return pd.DataFrame({"scenario": scenario, "source": source, "adapter_slots": slots, "served_adapters": served,
                         "status": status, "offered_tok_s_est": OFFERED,
                         "real_throughput": [OFFERED * r for r in real],
                         "twin_throughput": [OFFERED * t for t in twin]})


def test_the_constants_are_the_issues_90_percent_line_and_two_points() -> None:
    assert LINE == 0.9 and TOLERANCE_POINTS == 2.0


def test_the_ratios_are_throughput_over_the_runs_own_offered_tokens() -> None:
    df = _walk([0.95, 0.80], [0.96, 0.83])
    df["offered_tok_s_est"] = [1000.0, 4000.0]
    df["real_throughput"] = [950.0, 3200.0]
    df["twin_throughput"] = [940.0, 3400.0]
    cr = crossings_from_per_run(df)
    assert cr["real_ratio"].tolist() == pytest.approx([0.95, 0.80])
    assert cr["twin_ratio"].tolist() == pytest.approx([0.94, 0.85])
    assert cr["twin_minus_real_points"].tolist() == pytest.approx([-1.0, 5.0])
    assert cr["within_tolerance"].tolist() == [True, False]
    assert cr[["scenario", "adapter_slots"]].values.tolist() == [["s", 16], ["s", 16]]


def test_a_run_exactly_on_the_line_counts_as_above() -> None:
    cr = crossings_from_per_run(_walk([0.95, 0.90, 0.89], [0.95, 0.90, 0.89]))
    assert cr["side"].tolist() == ["last_above", "first_below"]
    assert cr["served_adapters"].tolist() == [16, 24]
    assert cr["real_ratio"].tolist() == pytest.approx([0.90, 0.89])


def test_only_the_first_crossing_of_a_walk_counts_even_when_it_comes_back_above() -> None:
    cr = crossings_from_per_run(_walk([0.99, 0.85, 0.95, 0.70], [0.99, 0.85, 0.95, 0.70]))
    assert cr["served_adapters"].tolist() == [8, 16]


def test_the_walk_follows_the_served_adapters_not_the_row_order() -> None:
    # rows given out of order: sorted by served adapters the walk is 0.99 (8), 0.93 (16), 0.60 (32)
    df = _walk([0.60, 0.99, 0.93], [0.61, 0.98, 0.90], served=[32, 8, 16])
    cr = crossings_from_per_run(df)
    assert cr["served_adapters"].tolist() == [16, 32]
    assert cr["twin_minus_real_points"].tolist() == pytest.approx([-3.0, 1.0])


def test_each_scenario_and_slot_count_is_its_own_walk() -> None:
    df = pd.concat([_walk([0.95, 0.85], [0.95, 0.85], slots=16),
                    _walk([0.99, 0.60], [0.99, 0.60], served=[12, 20], slots=32),
                    _walk([0.95, 0.91], [0.95, 0.91], slots=64),        # never crosses
                    _walk([0.99, 0.50], [0.97, 0.60], scenario="t", slots=16)])
    cr = crossings_from_per_run(df)
    assert len(cr) == 6
    assert sorted(set(zip(cr["scenario"], cr["adapter_slots"]))) == [("s", 16), ("s", 32), ("t", 16)]
    assert cr[cr["adapter_slots"] == 32]["served_adapters"].tolist() == [12, 20]
    t = cr[cr["scenario"] == "t"]
    assert t["twin_minus_real_points"].tolist() == pytest.approx([-2.0, 10.0])


def test_runs_not_ok_without_a_real_throughput_or_of_another_source_are_left_out() -> None:
    df = _walk([0.95, 0.80, 0.85], [0.95, 0.80, 0.85], status=["ok", "failed_oom", "ok"])
    # the failed run at 16 adapters is not a step of the walk: the crossing is 8 -> 24
    assert crossings_from_per_run(df)["served_adapters"].tolist() == [8, 24]
    nan_real = _walk([0.95, 0.80, 0.85], [0.95, 0.80, 0.85])
    nan_real.loc[1, "real_throughput"] = np.nan
    assert crossings_from_per_run(nan_real)["served_adapters"].tolist() == [8, 24]
    other = pd.concat([_walk([0.95, 0.80], [0.95, 0.80], source="ml_test"),
                       _walk([0.99, 0.50], [0.99, 0.50], served=[40, 48])])
    assert crossings_from_per_run(other)["served_adapters"].tolist() == [40, 48]
    assert crossings_from_per_run(other, source="ml_test")["served_adapters"].tolist() == [8, 16]
    # source=None: every source in one walk per scenario and slots (8, 16, 40, 48: the first crossing 8 -> 16)
    assert crossings_from_per_run(other, source=None)["served_adapters"].tolist() == [8, 16]


def test_points_inside_the_tolerance_are_within_and_a_failed_twin_run_is_not() -> None:
    df = _walk([0.95, 0.80], [0.935, 0.81])  # -1.5 and +1.0 points
    assert crossings_from_per_run(df)["within_tolerance"].tolist() == [True, True]
    df = _walk([0.95, 0.80], [0.95, np.nan])
    cr = crossings_from_per_run(df)
    assert cr["within_tolerance"].tolist() == [True, False]
    assert math.isnan(cr["twin_minus_real_points"].iloc[1])


def test_a_twin_exactly_two_points_off_is_within_the_tolerance() -> None:
    cr = crossings_from_per_run(_walk([0.95, 0.90, 0.70], [0.95, 0.92, 0.70]))
    row = cr.iloc[0]
    assert row["twin_minus_real_points"] == 2.0
    assert row["within_tolerance"]


def test_no_crossing_gives_an_empty_table() -> None:
    assert crossings_from_per_run(_walk([0.99, 0.95, 0.91], [0.5, 0.5, 0.5])).empty   # all above
    assert crossings_from_per_run(_walk([0.80, 0.70], [0.9, 0.9])).empty              # all below
    assert crossings_from_per_run(_walk([0.80, 0.95], [0.9, 0.9])).empty              # rises, never falls
    assert crossings_from_per_run(_walk([0.99], [0.5])).empty                         # one run
    assert crossings_from_per_run(_walk([0.99, 0.5], [0.99, 0.5]).iloc[0:0]).empty    # no run


@pytest.mark.parametrize("drop", ["scenario", "adapter_slots", "served_adapters", "real_throughput",
                                  "twin_throughput", "offered_tok_s_est", "status"])
def test_a_missing_column_is_named_with_the_fix(drop: str) -> None:
    with pytest.raises(ValueError) as e:
        crossings_from_per_run(_walk([0.95, 0.8], [0.95, 0.8]).drop(columns=drop))
    msg = str(e.value)
    assert f"lacks columns ['{drop}']" in msg and "pass a validation per_run.csv" in msg, msg


def test_summary_counts_and_takes_medians_of_the_points_per_side() -> None:
    df = pd.concat([_walk([0.95, 0.80], [0.94, 0.83], scenario="a"),     # -1, +3
                    _walk([0.92, 0.60], [0.87, 0.59], scenario="b"),     # -5, -1
                    _walk([0.99, 0.85], [0.985, 0.855], scenario="c")])  # -0.5, +0.5
    cr = crossings_from_per_run(df)
    s = summary(cr)
    pts = [-1.0, 3.0, -5.0, -1.0, -0.5, 0.5]
    assert s["crossings"] == 6
    assert s["within_2_points"] == sum(abs(p) <= 2 for p in pts) == 4
    assert s["median_abs_points"] == pytest.approx(statistics.median(abs(p) for p in pts))
    assert s["largest_abs_points"] == pytest.approx(5.0)
    assert s["median_last_above_points"] == pytest.approx(statistics.median([-1.0, -5.0, -0.5]))
    assert s["median_first_below_points"] == pytest.approx(statistics.median([3.0, -1.0, 0.5]))


def test_summary_of_no_crossing_is_just_the_count() -> None:
    assert summary(pd.DataFrame()) == {"crossings": 0}


def test_seed_spread_gives_each_passes_ratio_their_mean_and_spread() -> None:
    real = [0.95, 0.80]
    passes = [_walk(real, [0.975, 0.81]), _walk(real, [0.94, 0.79]), _walk(real, [0.925, 0.80])]
    table, s = seed_spread(passes)
    assert table[["side", "served_adapters"]].values.tolist() == [["last_above", 8], ["first_below", 16]]
    assert table["real_ratio"].tolist() == pytest.approx(real)
    assert table["twin_ratio_0"].tolist() == pytest.approx([0.975, 0.81])
    assert table["twin_ratio_2"].tolist() == pytest.approx([0.925, 0.80])
    assert table["twin_ratio_mean"].tolist() == pytest.approx([round((0.975 + 0.94 + 0.925) / 3, 4), 0.80])
    assert table["spread_points"].tolist() == pytest.approx([5.0, 2.0])
    # |twin - real| in points: pass 0 (2.5, 1), pass 1 (1, 1), pass 2 (2.5, 0); at the passes' mean (0.33, 0)
    assert table["within_in_every_pass"].tolist() == [False, True]
    assert s["passes"] == 3 and s["crossings"] == 2
    assert s["within_2_points_per_pass"] == [1, 2, 1]
    assert s["within_2_points_at_mean"] == 2
    assert s["within_2_points_in_every_pass"] == 1
    assert s["median_spread_points"] == pytest.approx(3.5) and s["largest_spread_points"] == pytest.approx(5.0)
    assert s["spread_over_2_points"] == 1  # (2.0 points is not over 2)


def test_seed_spread_of_one_pass_has_no_spread() -> None:
    table, s = seed_spread([_walk([0.95, 0.80], [0.90, 0.85])])
    assert table["spread_points"].tolist() == [0.0, 0.0]
    assert s["within_2_points_per_pass"] == [0] and s["within_2_points_in_every_pass"] == 0


def test_seed_spread_without_crossings_or_passes_reports_none() -> None:
    table, s = seed_spread([_walk([0.99, 0.95], [0.9, 0.9]), _walk([0.99, 0.95], [0.9, 0.9])])
    assert table.empty and s == {"crossings": 0, "passes": 2}
    table, s = seed_spread([])
    assert table.empty and s == {"crossings": 0, "passes": 0}


def test_seed_spread_refuses_passes_of_different_runs() -> None:
    a = _walk([0.95, 0.80], [0.95, 0.80])
    b = _walk([0.95, 0.80], [0.95, 0.80], served=[8, 24])  # same walk shape, another run below the line
    with pytest.raises(ValueError) as e:
        seed_spread([a, b])
    assert "do not hold the same runs" in str(e.value) and "same real table and selection" in str(e.value)
    with pytest.raises(ValueError, match="do not hold the same runs"):
        seed_spread([a, pd.concat([a, _walk([0.99, 0.5], [0.99, 0.5], scenario="t")])])
