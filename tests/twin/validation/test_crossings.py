"""twin.validation.crossings: the twin at the real runs' 90 % crossings of a validation pass."""

from __future__ import annotations

import pandas as pd
import pytest

from twin.validation.crossings import crossings_from_per_run, main, summary


def _per_run(real_ratios, twin_ratios, source="dt_modelling", slots=16):
    served = [16, 32, 64, 96][: len(real_ratios)]
    return pd.DataFrame({"scenario": "s", "source": source, "adapter_slots": slots, "served_adapters": served,
                         "status": "ok", "offered_tok_s_est": 1000.0,
                         "real_throughput": [1000.0 * r for r in real_ratios],
                         "twin_throughput": [1000.0 * t for t in twin_ratios]})


def test_the_first_crossing_of_each_walk_gives_both_sides_with_twin_minus_real_points():
    cr = crossings_from_per_run(_per_run([0.99, 0.95, 0.85, 0.70], [0.99, 0.93, 0.90, 0.80]))
    assert cr["side"].tolist() == ["last_above", "first_below"]
    assert cr["served_adapters"].tolist() == [32, 64]
    assert cr["twin_minus_real_points"].tolist() == pytest.approx([-2.0, 5.0])
    assert cr["within_tolerance"].tolist() == [True, False]
    s = summary(cr)
    assert s["crossings"] == 2 and s["within_2_points"] == 1
    assert s["median_last_above_points"] == pytest.approx(-2.0) and s["largest_abs_points"] == pytest.approx(5.0)


def test_a_walk_that_never_crosses_and_other_subsets_give_no_row():
    assert crossings_from_per_run(_per_run([0.99, 0.95, 0.92], [0.5, 0.5, 0.5])).empty
    assert crossings_from_per_run(_per_run([0.99, 0.5], [0.99, 0.5], source="ml_test")).empty
    assert summary(crossings_from_per_run(_per_run([0.99, 0.95], [0.9, 0.9]))) == {"crossings": 0}


def test_a_table_without_the_offered_tokens_names_the_missing_column():
    with pytest.raises(ValueError, match="offered_tok_s_est"):
        crossings_from_per_run(_per_run([0.99, 0.5], [0.99, 0.5]).drop(columns="offered_tok_s_est"))


def test_main_refuses_a_missing_file_before_any_work(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TWIN_DATA_DIR", str(tmp_path))
    assert main([str(tmp_path / "per_run.csv")]) == 2
    assert "vllm085_h100_llama31_8b.csv not found" in capsys.readouterr().err
    real = tmp_path / "real.csv"
    real.write_text("run_dir,scenario,source,offered_tok_s_est\n")
    assert main([str(tmp_path / "per_run.csv"), "--real", str(real)]) == 2
    assert "per_run.csv' not found" in capsys.readouterr().err


@pytest.mark.parametrize("content,real_content,extra,fragment", [
    (bytes(range(256)), None, [], "per_run.csv {p} is not a text file"),
    (b"", None, [], "per_run.csv {p} is empty"),
    (b"run_id,x\n1,2\n", None, [], "{p}: not the per_run.csv of a twin validate --out pass (missing columns "
                                  "['run_dir', 'scenario', 'source', 'status'])"),
    (b"run_dir,scenario,source,status\nr,s,dt_modelling,ok\n", b"a,b\n1,2\n", [],
     "not a real-run validation table (missing columns ['run_dir'"),
    (b"run_dir,scenario,source,status\nr,s,dt_modelling,ok\n", None, ["--out", "{tmp}/afile/x.csv"],
     "--out {tmp}/afile/x.csv: {tmp}/afile is a file"),
])
def test_main_refuses_bad_tables_with_a_message(tmp_path, capsys, content, real_content, extra, fragment):
    """A binary, empty or foreign per_run.csv or real table (a KeyError, UnicodeDecodeError or pandas
    traceback before), and an --out under a file: exit 2 with the file and the fix."""
    p, real = tmp_path / "per_run.csv", tmp_path / "real.csv"
    p.write_bytes(content)
    real.write_bytes(real_content or b"run_dir,scenario,source,offered_tok_s_est\nr,s,dt_modelling,100\n")
    (tmp_path / "afile").write_text("x")
    argv = [str(p), "--real", str(real)] + [a.format(tmp=tmp_path) for a in extra]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert fragment.format(p=p, tmp=tmp_path) in err and "Traceback" not in err, err


def test_the_validation_summary_and_report_give_each_splits_crossings():
    """``twin validate``'s summary holds the crossings per split (``fit_test.<split>.crossings_90``) and its
    console table prints them beside the SMAPEs."""
    from twin.validation.report import _fit_test_lines
    from twin.validation.scoring import split_crossings

    runs = pd.concat([_per_run([0.99, 0.95, 0.85, 0.70], [0.99, 0.93, 0.90, 0.80]).assign(split="fit"),
                      _per_run([0.99, 0.85], [0.98, 0.86], source="ml_test").assign(split="test", scenario="t")])
    fit, test = split_crossings(runs, "fit"), split_crossings(runs, "test")
    assert (fit["crossings"], fit["within_2_points"]) == (2, 1) and (test["crossings"], test["within_2_points"]) == (2, 2)
    assert split_crossings(runs.drop(columns="offered_tok_s_est"), "fit") == {"crossings": 0}
    ft = {"fit": {"runs": 4, "crossings_90": fit}, "test": {"runs": 2, "crossings_90": test}}
    line = _fit_test_lines({"fit_test": ft})[-1]
    assert "fit 1 of 2 (largest miss 5.0 points); test 2 of 2" in line


def test_seed_spread_sets_the_passes_side_by_side():
    """Several passes of the same runs (seeds): the twin's ratio per pass, its spread, and the crossings within
    the tolerance per pass, at the mean and in every pass."""
    from twin.validation.crossings import seed_spread

    real = [0.99, 0.95, 0.85, 0.70]
    passes = [_per_run(real, [0.99, 0.96, 0.86, 0.80]), _per_run(real, [0.99, 0.92, 0.90, 0.80]),
              _per_run(real, [0.99, 0.95, 0.81, 0.80])]
    table, s = seed_spread(passes)
    assert table["side"].tolist() == ["last_above", "first_below"]
    assert table["spread_points"].tolist() == pytest.approx([4.0, 9.0])
    assert table["twin_ratio_mean"].tolist() == pytest.approx([0.9433, 0.8567], abs=1e-4)
    assert s["within_2_points_per_pass"] == [2, 0, 1] and s["within_2_points_at_mean"] == 2
    assert s["within_2_points_in_every_pass"] == 0 and s["spread_over_2_points"] == 2
    with pytest.raises(ValueError, match="do not hold the same runs"):
        seed_spread([passes[0], _per_run([0.99, 0.5], [0.99, 0.5])])


def test_main_with_several_passes_writes_the_spread_table(tmp_path, capsys):
    real = tmp_path / "real.csv"
    pd.DataFrame({"run_dir": ["a", "b"], "scenario": "s", "source": "dt_modelling",
                  "offered_tok_s_est": 1000.0}).to_csv(real, index=False)
    files = []
    for i, twin in enumerate(([0.99, 0.80], [0.98, 0.86])):
        f = tmp_path / f"p{i}.csv"
        _per_run([0.99, 0.85], twin).drop(columns="offered_tok_s_est").assign(run_dir=["a", "b"]).to_csv(f, index=False)
        files.append(str(f))
    out = tmp_path / "spread.csv"
    assert main(files + ["--real", str(real), "--out", str(out)]) == 0
    assert "'within_2_points_per_pass': [1, 2]" in capsys.readouterr().out
    assert pd.read_csv(out)["spread_points"].tolist() == pytest.approx([1.0, 6.0])


def test_the_saturated_runs_error_by_served_adapters_per_slot():
    """Only KV-saturated runs count; each falls in its N/G range (N = G in the first), per split, with the
    N = G runs also by slots; a run the server kept below saturation or the twin did not run is left out."""
    from twin.validation.diagnostics import saturated_throughput_by_share

    runs = pd.DataFrame({
        "source": ["ml_test"] * 6 + ["dt_modelling"],
        "served_adapters": [96, 96, 128, 384, 384, 96, 64],
        "adapter_slots": [96, 96, 96, 96, 96, 96, 64],
        "ts_mean_kv_usage": [0.95, 0.97, 0.92, 0.99, 0.91, 0.50, 0.93],
        "real_throughput": [1000.0, 1000.0, 1000.0, 1000.0, 1000.0, 1000.0, 2000.0],
        "twin_throughput": [940.0, 960.0, 970.0, 1050.0, None, 800.0, 2100.0]})
    out = saturated_throughput_by_share(runs)
    test = out["test"]["by_served_per_slot"]
    assert test == {"N/G = 1": {"runs": 2, "median_pct": -5.0}, "N/G 1-1.5": {"runs": 1, "median_pct": -3.0},
                    "N/G 2-4": {"runs": 1, "median_pct": 5.0}}  # (384 / 96 = 4: the upper end is in the range)
    assert out["test"]["at_one_per_slot_by_slots"] == {96: {"runs": 2, "median_pct": -5.0}}
    assert out["fit"]["by_served_per_slot"] == {"N/G = 1": {"runs": 1, "median_pct": 5.0}}
    assert saturated_throughput_by_share(runs.drop(columns="ts_mean_kv_usage")) == {}


def test_one_pass_prints_the_saturated_slope_after_the_crossings(tmp_path, capsys):
    per_run = _per_run([0.99, 0.95, 0.85, 0.70], [0.99, 0.93, 0.90, 0.80])
    per_run["ts_mean_kv_usage"] = 0.95
    per_run["run_dir"] = [f"r{i}" for i in range(len(per_run))]
    real = per_run[["run_dir", "scenario", "source", "offered_tok_s_est"]]
    per_run.drop(columns="offered_tok_s_est").to_csv(tmp_path / "per_run.csv", index=False)
    real.to_csv(tmp_path / "real.csv", index=False)
    assert main([str(tmp_path / "per_run.csv"), "--real", str(tmp_path / "real.csv")]) == 0
    out = capsys.readouterr().out
    assert "fit split: N/G = 1 +0.0 % (1); N/G 1.5-2 -2.1 % (1); N/G 2-4 +5.9 % (1)" in out
