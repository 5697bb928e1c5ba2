"""traces/datadir.py: where the data lives, and how result files name paths."""

from __future__ import annotations

from pathlib import Path

import pytest

from traces.datadir import data_dir, require, shown_path


def test_shown_path_names_the_data_directory_and_the_working_directory(tmp_path, monkeypatch):
    data = tmp_path / "data"
    (data / "validation").mkdir(parents=True)
    proj = tmp_path / "proj"
    (proj / "models").mkdir(parents=True)
    monkeypatch.setenv("TWIN_DATA_DIR", str(data))
    monkeypatch.chdir(proj)
    assert shown_path(data / "validation" / "runs.csv") == str(Path("$TWIN_DATA_DIR") / "validation" / "runs.csv")
    assert shown_path(proj / "models" / "m.json") == str(Path("models") / "m.json")
    outside = tmp_path / "elsewhere" / "x.csv"
    assert shown_path(outside) == str(outside)  # neither: as given
    assert shown_path("models/m.json") == str(Path("models") / "m.json")  # a relative path stays relative
    monkeypatch.delenv("TWIN_DATA_DIR")
    assert shown_path(data / "validation" / "runs.csv") == str(data / "validation" / "runs.csv")


def test_require_names_the_missing_file_and_the_fix(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"validation/x\.csv not found in the data directory .*does not exist"):
        require("validation/x.csv", override=tmp_path / "none")
    with pytest.raises(ValueError, match="--data-dir: empty"):
        data_dir("  ")


def test_a_data_path_with_the_variable_unset_says_so(monkeypatch):
    """`--real $TWIN_DATA_DIR/validation/x.csv` with the variable unset reached the commands as /validation/x.csv,
    and they said only that it does not exist."""
    from traces.datadir import unset_data_dir_hint
    from twin.validation.specs import read_table

    monkeypatch.delenv("TWIN_DATA_DIR", raising=False)
    with pytest.raises(FileNotFoundError, match=r"does not exist \(TWIN_DATA_DIR is not set: was it "
                                                r"\$TWIN_DATA_DIR/validation/x\.csv\?"):
        read_table("/validation/x.csv", "real-run table (--real)")
    assert unset_data_dir_hint("/elsewhere/x.csv") == "" and unset_data_dir_hint("validation/x.csv") == ""
    monkeypatch.setenv("TWIN_DATA_DIR", "/data")
    assert unset_data_dir_hint("/validation/x.csv") == ""
