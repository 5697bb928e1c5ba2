"""The train/test split of the real runs in ``twin validate`` (fit = dt_modelling, test = ml_test)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from twin.validation.metrics import METRICS
from twin.validation.report import _fit_test_lines
from twin.validation.scoring import FIT_TEST_METRICS, SPLIT_OF_SOURCE, SUBSETS, score, subset_table


def _runs() -> pd.DataFrame:
    """Four runs: two fit (one failed), two test; real / twin figures chosen so each SMAPE is known."""
    d = pd.DataFrame({"run_id": list("abcd"), "source": ["dt_modelling", "dt_modelling", "ml_test", "ml_test"],
                      "status": ["ok", "failed_port_in_use", "ok", "ok"], "twin_status": ["ok"] * 4,
                      "has_peer": [True, False, False, False], "requests_sent": [100.0, np.nan, np.nan, np.nan],
                      "rates": ["0.01-0.01"] * 4, "served_adapters": [2] * 4, "benchmark_time_s": [3600.0] * 4})
    for m in METRICS:
        d[m.real] = [100.0, 100.0, 100.0, 100.0]
        d[f"twin_{m.name}"] = [110.0, 500.0, 100.0, 300.0]
        if m.peer:
            d[f"peer_{m.name}"] = [100.0, np.nan, np.nan, np.nan]
    return d


def test_split_column_and_subsets():
    assert SPLIT_OF_SOURCE == {"dt_modelling": "fit", "ml_test": "test"}
    assert {"fit", "test"} <= set(SUBSETS)
    runs = score(_runs())
    assert list(runs["split"]) == ["fit", "fit", "test", "test"]
    fit, test = subset_table(runs, "fit"), subset_table(runs, "test")
    assert fit["scored"] == 1 and test["scored"] == 2  # the failed fit run is not scored
    # fit: |110-100|/210; test: mean(0, 200/400)
    assert fit["metrics"]["itl"]["smape"] == pytest.approx(100 * 10 / 210)
    assert test["metrics"]["itl"]["smape"] == pytest.approx(100 * 0.25)


def test_report_prints_both_splits():
    runs = score(_runs())
    s = {"fit_test": {name: {"runs": subset_table(runs, name)["scored"],
                             **{k: subset_table(runs, name)["metrics"][k]["smape"] for k in FIT_TEST_METRICS}}
                      for name in ("fit", "test")}}
    text = "\n".join(_fit_test_lines(s))
    assert "fit / test split" in text
    rows = {ln.split()[0]: ln.split() for ln in text.splitlines()[3:]}
    fit_line, test_line = " ".join(rows["fit"]), " ".join(rows["test"])
    assert "4.8" in fit_line and "25.0" in test_line
    assert _fit_test_lines({}) == []
