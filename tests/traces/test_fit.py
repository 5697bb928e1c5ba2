"""The committed fits in traces/data are reproduced by this package's fitting code."""

from __future__ import annotations

import json

import pytest

from traces.fit import main
from traces.lengths import DATA


@pytest.mark.data
def test_fit_reproduces_committed_json(real_data, tmp_path):
    assert main(["--data-dir", str(real_data), "--out", str(tmp_path)]) == 0
    for name in ("splitwise_conv_fit.json", "splitwise_code_fit.json", "sharegpt_lengths.json"):
        fresh = json.loads((tmp_path / name).read_text())
        committed = json.loads((DATA / name).read_text())
        assert fresh == committed, f"{name} differs from a fresh fit: rerun `python -m traces.fit`"


def test_committed_fit_contents():
    conv = json.loads((DATA / "splitwise_conv_fit.json").read_text())
    a = conv["arrivals"]
    assert a["requests"] == 19366 and a["mean_rps"] == pytest.approx(5.530, abs=1e-3)
    assert a["raw_cv"] == pytest.approx(1.094, abs=1e-3) and len(a["profile"]) == 59
    assert conv["lengths"]["prompt"]["p50"] == 1020.0 and conv["sha256"].startswith("2f1e5b66")
