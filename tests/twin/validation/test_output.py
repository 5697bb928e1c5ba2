"""twin/validation/output.py: a validation's files (``per_run.csv``, ``summary.json``, figures).

Contract tested: :func:`per_run_frame` gives the run facts of :data:`PER_RUN_COLUMNS` that the runs have (in
that order), then real / twin / error per metric of :data:`twin.validation.metrics.METRICS` (with the peer's
figure and error where the metric has one), then ``sim_wall_s`` and ``error``, errors in percent and nothing
else; :func:`json_summary` writes numpy numbers as JSON numbers and anything else as text; :func:`write_outputs`
creates the directory and writes both files (6 significant digits in the CSV), the figures only when asked,
and returns the paths it wrote.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import twin.validation.output as out_mod
from twin.validation.metrics import METRICS
from twin.validation.output import PER_RUN_COLUMNS, json_summary, per_run_frame, write_outputs
from twin.validation.runner import ValidationResult

PEER = [m.name for m in METRICS if m.peer]


def _runs(n: int = 2) -> pd.DataFrame:
    """A validation's run table: some facts (out of order), every metric's columns, and columns not written."""
    d: dict[str, object] = {"status": ["ok"] * n, "scored": [True] * n, "run_id": [f"r{i}" for i in range(n)],
                            "adapter_slots": [16 * (i + 1) for i in range(n)], "internal_only": [7] * n,
                            "sim_wall_s": [0.5 + i for i in range(n)], "error": [""] * n}
    for k, m in enumerate(METRICS):
        d[f"real_{m.name}"] = [100.0 + k + i for i in range(n)]
        d[f"twin_{m.name}"] = [110.0 + k + i for i in range(n)]
        d[f"err_{m.name}"] = [0.05 * (i + 1) for i in range(n)]
        if m.peer:
            d[f"peer_{m.name}"] = [90.0 + k for _ in range(n)]
            d[f"peer_err_{m.name}"] = [0.25 for _ in range(n)]
    return pd.DataFrame(d)


def _result(runs: pd.DataFrame | None = None, summary: dict | None = None) -> ValidationResult:
    return ValidationResult(runs=_runs() if runs is None else runs, summary=summary or {"runs": 2})


def test_per_run_frame_orders_facts_then_each_metric_then_the_run_time_and_error() -> None:
    frame = per_run_frame(_result())
    expected = ["run_id", "adapter_slots", "status"]  # (PER_RUN_COLUMNS' order, not the table's)
    assert [c for c in PER_RUN_COLUMNS if c in expected] == expected
    for m in METRICS:
        expected += [f"real_{m.name}", f"twin_{m.name}", f"err_{m.name}"]
        if m.peer:
            expected += [f"peer_{m.name}", f"peer_err_{m.name}"]
    expected += ["sim_wall_s", "error"]
    assert list(frame.columns) == expected
    assert "internal_only" not in frame and "scored" not in frame


def test_per_run_frame_has_peer_columns_only_for_metrics_the_published_twin_reports() -> None:
    frame = per_run_frame(_result())
    assert PEER == ["throughput", "request_throughput", "itl", "ttft_incl_unfinished"]
    assert {c for c in frame if c.startswith("peer_") and not c.startswith("peer_err_")} == {f"peer_{n}" for n in PEER}
    assert "peer_tpot" not in frame and "peer_err_ttft_mean" not in frame


def test_per_run_frame_gives_errors_in_percent_and_leaves_the_figures_and_the_input_as_they_are() -> None:
    runs = _runs()
    before = runs.copy()
    frame = per_run_frame(_result(runs))
    for m in METRICS:
        assert frame[f"err_{m.name}"].tolist() == pytest.approx([5.0, 10.0])
        assert frame[f"real_{m.name}"].tolist() == runs[f"real_{m.name}"].tolist()
        assert frame[f"twin_{m.name}"].tolist() == runs[f"twin_{m.name}"].tolist()
        if m.peer:
            assert frame[f"peer_err_{m.name}"].tolist() == pytest.approx([25.0, 25.0])
            assert frame[f"peer_{m.name}"].tolist() == runs[f"peer_{m.name}"].tolist()
    assert frame["sim_wall_s"].tolist() == [0.5, 1.5]
    pd.testing.assert_frame_equal(runs, before)


def test_per_run_frame_without_run_time_or_error_columns_ends_with_the_metrics() -> None:
    frame = per_run_frame(_result(_runs().drop(columns=["sim_wall_s", "error"])))
    assert list(frame.columns)[-1] == f"peer_err_{METRICS[-1].name}"


def test_json_summary_writes_numpy_numbers_as_numbers_and_other_objects_as_text() -> None:
    s = {"runs": np.int64(3), "smape": np.float32(2.5), "ok": np.bool_(True), "where": Path("a/b"),
         "nested": {"n": [np.int32(1), 2.0]}, "none": None}
    text = json_summary(_result(summary=s))
    back = json.loads(text)
    assert back == {"runs": 3, "smape": 2.5, "ok": True, "where": str(Path("a/b")), "nested": {"n": [1, 2.0]},
                    "none": None}
    assert type(back["runs"]) is int and type(back["ok"]) is bool
    assert text.startswith('{\n  "runs": 3')  # (indented by 2)


def test_write_outputs_creates_the_directory_and_writes_the_table_and_the_summary(tmp_path: Path) -> None:
    runs = _runs()
    runs.loc[0, "real_throughput"] = 1234567.0
    runs.loc[1, "twin_itl"] = 1.0 / 3.0
    res = _result(runs, {"runs": np.int64(2), "smape_throughput": 4.25})
    d = tmp_path / "a" / "b"
    paths = write_outputs(res, d, figures=False)
    assert paths == [d / "per_run.csv", d / "summary.json"]
    back = pd.read_csv(d / "per_run.csv")
    assert list(back.columns) == list(per_run_frame(res).columns)
    assert back["run_id"].tolist() == ["r0", "r1"]
    text = (d / "per_run.csv").read_text()
    assert "1.23457e+06" in text and "0.333333" in text and "0.3333333" not in text  # 6 significant digits
    assert back["err_itl"].tolist() == pytest.approx([5.0, 10.0])
    assert json.loads((d / "summary.json").read_text()) == {"runs": 2, "smape_throughput": 4.25}


def test_write_outputs_overwrites_an_earlier_pass_in_the_same_directory(tmp_path: Path) -> None:
    write_outputs(_result(_runs(3)), tmp_path, figures=False)
    write_outputs(_result(_runs(1), {"runs": 1}), tmp_path, figures=False)
    assert len(pd.read_csv(tmp_path / "per_run.csv")) == 1
    assert json.loads((tmp_path / "summary.json").read_text()) == {"runs": 1}


def test_write_outputs_adds_the_figures_only_when_asked(tmp_path: Path, monkeypatch) -> None:
    made: list[Path] = []

    def fake_figures(res: ValidationResult, out: Path) -> list[Path]:
        p = Path(out) / "fig.png"
        made.append(p)
        return [p]

    monkeypatch.setattr(out_mod, "make_figures", fake_figures)
    assert write_outputs(_result(), tmp_path, figures=False) == [tmp_path / "per_run.csv", tmp_path / "summary.json"]
    assert made == []
    assert write_outputs(_result(), tmp_path) == [tmp_path / "per_run.csv", tmp_path / "summary.json",
                                                  tmp_path / "fig.png"]
    assert made == [tmp_path / "fig.png"]


def test_write_outputs_with_no_scored_run_writes_no_figure(tmp_path: Path) -> None:
    runs = _runs()
    runs["scored"] = False
    paths = write_outputs(_result(runs), tmp_path)
    assert [p.name for p in paths] == ["per_run.csv", "summary.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["per_run.csv", "summary.json"]
