"""``twin reproduce``: every name's ``--quick`` variant end to end (the JSON schema, the files of
``--out``, the README of ``all``), and the errors before any work."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from twin.cli import main
from twin.reproduce import adaptive_caching, chameleon, fastlibra
from twin.reproduce.registry import REPRODUCTIONS

#: every paper number each reproduction prints, by name (the tables of the paper modules)
PAPER_TABLES = {"chameleon-fig11": chameleon.PAPER, "chameleon-caches": chameleon.PAPER_CACHES,
                "chameleon-schedulers": chameleon.PAPER_SCHEDULERS,
                "fastlibra-ttft": fastlibra.PAPER, "fastlibra-ablation": fastlibra.PAPER_ABLATION,
                "adaptive-caching": adaptive_caching.PAPER}


@pytest.fixture(scope="module")
def quick_all(tmp_path_factory) -> tuple[list[dict], Path]:
    """``twin reproduce all --quick --json --out DIR`` once (one process shares the simulations)."""
    import contextlib
    import io

    out = tmp_path_factory.mktemp("reproductions")
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(["reproduce", "all", "--quick", "--json", "--out", str(out), "--no-progress"])
    assert rc == 0
    return json.loads(buf.getvalue()), out


def test_all_names_run(quick_all):
    docs, _ = quick_all
    assert [d["name"] for d in docs] == list(REPRODUCTIONS)


@pytest.mark.parametrize("name", list(REPRODUCTIONS))
def test_quick_json_schema(quick_all, name):
    """Exactly ``{"name", "rows"}``; each row exactly metric/condition/unit/paper/twin; one row per
    paper number of the module's table, with the paper's value."""
    doc = next(d for d in quick_all[0] if d["name"] == name)
    assert set(doc) == {"name", "rows"}
    assert doc["rows"], name
    for r in doc["rows"]:
        assert list(r) == ["metric", "condition", "unit", "paper", "twin"]
        assert isinstance(r["paper"], (int, float, str))
        assert r["twin"] is None or isinstance(r["twin"], (int, float, str))
    paper = {(p.metric, p.condition): p.value for p in PAPER_TABLES[name].values()}
    got = {(r["metric"], r["condition"]): r["paper"] for r in doc["rows"]}
    assert got == paper
    measured = [r["twin"] for r in doc["rows"] if r["twin"] is not None]
    assert len(measured) >= len(doc["rows"]) // 2, f"{name}: most rows unmeasured"


@pytest.mark.parametrize("name", list(REPRODUCTIONS))
def test_quick_out_files(quick_all, name):
    docs, out = quick_all
    d = out / name
    for f in ("rows.parquet", "rows.csv", "points.csv", "summary.json", "figure.png"):
        assert (d / f).stat().st_size > 0, f
    rows = pd.read_parquet(d / "rows.parquet")
    assert list(rows.columns) == ["metric", "condition", "unit", "paper", "twin", "source"]
    assert len(rows) == len(next(x for x in docs if x["name"] == name)["rows"])
    summary = json.loads((d / "summary.json").read_text())
    assert summary["name"] == name and summary["setup"]["variant"] == "quick"
    assert len(pd.read_csv(d / "points.csv")) > 0


def test_all_writes_readme(quick_all):
    text = (quick_all[1] / "README.md").read_text()
    assert "twin reproduce all --quick --out" in text
    for name in REPRODUCTIONS:
        assert f"## {name}" in text and f"({name}/figure.png)" in text
    assert "| metric | condition | unit | paper | twin | within 10 points |" in text


def test_single_name_prints_one_object(capsys, monkeypatch):
    monkeypatch.setitem(adaptive_caching.REQUESTS, "quick", 60)  # the schema only: a shorter run
    assert main(["reproduce", "adaptive-caching", "--quick", "--json", "--no-progress"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["name"] == "adaptive-caching" and isinstance(doc["rows"], list)


def test_list(capsys):
    assert main(["reproduce", "--list"]) == 0
    out = capsys.readouterr().out
    for name in REPRODUCTIONS:
        assert name in out
    assert main(["reproduce", "--list", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [d["name"] for d in doc] == list(REPRODUCTIONS) and all(d["paper"] and d["description"] for d in doc)


@pytest.mark.parametrize("argv, words", [
    (["reproduce", "chameleon-fig12"], ["unknown reproduction 'chameleon-fig12'", "chameleon-fig11", "--list"]),
    (["reproduce"], ["give a reproduction name"]),
    (["reproduce", "--list", "chameleon-fig11"], ["--list lists the reproductions and runs none, so NAME would be "
                                                  "ignored"]),
    (["reproduce", "--list", "--quick", "--out", "x"], ["so --quick, --out would be ignored"]),
])
def test_errors_name_the_fix(capsys, argv, words):
    assert main(argv) == 2
    err = capsys.readouterr().err
    for w in words:
        assert w in err
    assert "Traceback" not in err


def test_out_onto_a_file_refused_before_work(tmp_path, capsys):
    f = tmp_path / "file"
    f.write_text("x")
    assert main(["reproduce", "chameleon-fig11", "--out", str(f)]) == 2
    err = capsys.readouterr().err
    assert "--out" in err and "Traceback" not in err


def test_verdicts():
    from twin.reproduce.base import Row
    from twin.reproduce.report import verdict

    assert verdict(Row("m", "c", "%", -24.6, -16.0)) == "yes"
    assert verdict(Row("m", "c", "%", -24.6, 46.0)) == "no"
    assert verdict(Row("m", "c", "x", 1.5, 1.41)) == "yes"
    assert verdict(Row("m", "c", "x", 1.5, 1.0)) == "no"
    assert verdict(Row("m", "c", "", "yes", "yes")) == "yes"
    assert verdict(Row("m", "c", "", "yes", "no")) == "no"
    assert verdict(Row("m", "c", "req/s", 8.6, 1.6)) == "n/a"
    assert verdict(Row("m", "c", "ms", "12-13", 46.0)) == "n/a"
    assert verdict(Row("m", "c", "%", -60.3, None)) == "n/a"


def test_rerun_writes_identical_files(tmp_path, monkeypatch):
    """No host timing leaks into the files: a regenerated results directory only changes when the twin does."""
    monkeypatch.setitem(adaptive_caching.REQUESTS, "quick", 60)
    monkeypatch.delenv("TWIN_REPRODUCE_CACHE", raising=False)  # both runs simulate
    for d in ("a", "b"):
        assert main(["reproduce", "adaptive-caching", "--quick", "--out", str(tmp_path / d), "--no-progress"]) == 0
    for f in ("rows.csv", "points.csv", "summary.json"):
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes(), f
