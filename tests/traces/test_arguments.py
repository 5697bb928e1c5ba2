"""traces/arguments.py: the shared parsers of list, boolean and number option values, the error of a bad table
cell, the CSV layout check, repeated values and keys, the "did you mean" hint and the output-path checks.

Contract tested: every accepted spelling gives the documented value, and every refused one raises ``ValueError``
naming the option (or file, row and column) and showing the expected form or the fix.
"""

from __future__ import annotations

import errno
import json
from fractions import Fraction
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from traces import arguments as A
from traces.arguments import (RepeatedKey, cell_error, check_writable_dir, check_writable_file, csv_layout_problem,
                              did_you_mean, first_repeat, has_empty_item, is_flag, is_real_number, is_whole_number,
                              parse_bool, parse_list, unique_keys_object)


# ------------------------------------------------------------------ number and flag predicates

@pytest.mark.parametrize("v,flag,real,whole", [
    (True, True, False, False),
    (np.bool_(False), True, False, False),
    (3, False, True, True),
    (np.int64(3), False, True, True),
    (2.0, False, True, True),
    (2.5, False, True, False),
    (np.float64(-4.0), False, True, True),
    (Fraction(1, 3), False, True, False),
    (float("inf"), False, True, False),
    (float("nan"), False, True, False),
    ("2", False, False, False),
    (None, False, False, False),
    (1 + 0j, False, False, False),
])
def test_flag_real_and_whole_number_predicates_tell_bools_strings_and_fractions_apart(
        v: object, flag: bool, real: bool, whole: bool) -> None:
    assert is_flag(v) is flag
    assert is_real_number(v) is real
    assert is_whole_number(v) is whole


# ------------------------------------------------------------------ parse_list: accepted forms

@pytest.mark.parametrize("text", ["8,16,32", "8/16/32", "8 16 32", " 8 , 16 ,32 ", "8-16-32", "8, 16/32"])
def test_parse_list_reads_commas_slashes_spaces_and_the_tables_dashes_alike(text: str) -> None:
    assert parse_list(text, int, "ranks") == [8, 16, 32]


def test_parse_list_takes_iterables_and_a_single_value_and_casts_each_item() -> None:
    assert parse_list([8, 16.0, np.int64(32)], int, "ranks") == [8, 16, 32]
    assert parse_list(np.array([0.5, 0.25]), float, "rates") == [0.5, 0.25]
    assert parse_list(7, int, "ranks") == [7]
    assert parse_list(("0.1", " 0.2 "), float, "rates") == [0.1, 0.2]
    assert all(type(x) is int for x in parse_list("8,16", int, "ranks"))


def test_parse_list_keeps_exponents_with_a_minus_as_one_number_not_a_dashed_list() -> None:
    assert parse_list("1e-3", float, "rates") == [0.001]
    assert parse_list("1E-3", float, "rates") == [0.001]
    assert parse_list("2.5E-2,1e-1", float, "rates") == [0.025, 0.1]


def test_parse_list_minimum_is_inclusive() -> None:
    assert parse_list("8,16", int, "ranks", minimum=8) == [8, 16]
    assert parse_list("0,1", float, "x", minimum=0) == [0.0, 1.0]


# ------------------------------------------------------------------ parse_list: refusals

@pytest.mark.parametrize("cast,name,example", [(int, "ranks", "8,16,32"), (float, "rates", "0.4,0.05,0.00625"),
                                               (float, "Arrival_Rate", "0.4,0.05,0.00625"),
                                               (float, "scales", "0.5,1,2")])
def test_parse_list_without_a_value_names_the_option_and_an_example_of_its_kind(cast, name: str, example: str) -> None:
    with pytest.raises(ValueError) as e:
        parse_list(None, cast, name)
    assert str(e.value) == f"{name}: a list is required, e.g. {example}"


@pytest.mark.parametrize("text", ["8,,16", "8,16,", ",8", "8, ,16"])
def test_parse_list_refuses_an_empty_item_rather_than_dropping_it(text: str) -> None:
    with pytest.raises(ValueError, match=r"^ranks: .* has an empty item \(two commas in a row, or a comma at an end\); "
                                         r"give comma-separated values, e.g. 8,16,32$"):
        parse_list(text, int, "ranks")


@pytest.mark.parametrize("value", ["", "   ", ",", " , ", []])
def test_parse_list_refuses_an_empty_list(value: object) -> None:
    with pytest.raises(ValueError, match=r"^ranks: empty list; give comma-separated values, e.g. 8,16,32$"):
        parse_list(value, int, "ranks")


def test_parse_list_refuses_the_dashed_form_where_it_reads_as_a_range_and_suggests_commas() -> None:
    with pytest.raises(ValueError) as e:
        parse_list("8-128", int, "--ranks", dashes=False)
    assert str(e.value) == "--ranks: '8-128' is ambiguous (a range or a list?); list the values with commas, e.g. 8,128"


@pytest.mark.parametrize("text", ["-0.4-0.1", "0.4--0.1", "8-16-"])
def test_parse_list_refuses_a_dashed_list_with_an_empty_or_negative_item(text: str) -> None:
    with pytest.raises(ValueError, match="has an empty or negative item .*e.g. 8-16-32"):
        parse_list(text, float, "rates")


def test_parse_list_refuses_a_leading_minus_when_values_must_be_non_negative() -> None:
    with pytest.raises(ValueError, match=r"^rates: values must be >= 0, got '-0.4,0.1'$"):
        parse_list("-0.4,0.1", float, "rates", minimum=0)
    with pytest.raises(ValueError, match=r"^rates: values must be >= 0, got ' -0.4-0.1'$"):
        parse_list(" -0.4-0.1", float, "rates", minimum=0)  # (before the dashes could drop the sign)


def test_parse_list_refuses_items_below_the_minimum_naming_the_item() -> None:
    with pytest.raises(ValueError, match=r"^ranks: values must be >= 8, got '4'$"):
        parse_list("8,4", int, "ranks", minimum=8)
    with pytest.raises(ValueError, match=r"^ranks: values must be >= 1, got 0$"):
        parse_list([2, 0], int, "ranks", minimum=1)


@pytest.mark.parametrize("value,cast,bad,kind", [
    ("8,x", int, "'x'", "int"),
    ("0.1,abc", float, "'abc'", "float"),
    ("nan", float, "'nan'", "float"),
    ([8, 2.5], int, "2.5", "int"),       # (int() would truncate it silently)
    ([8, True], int, "True", "int"),     # (int(True) is 1)
    ([float("inf")], int, "inf", "int"),
    ("8.5", int, "'8.5'", "int"),
])
def test_parse_list_refuses_items_that_are_not_numbers_of_the_kind(value: object, cast, bad: str, kind: str) -> None:
    with pytest.raises(ValueError) as e:
        parse_list(value, cast, "ranks")
    msg = str(e.value)
    assert msg.startswith(f"ranks: {bad} is not a valid {kind}; give comma-separated values, e.g. "), msg
    assert e.value.__suppress_context__  # (raised from None: one clear line, no chained traceback)


@pytest.mark.parametrize("value", [b"8,16", {"a": 8}])
def test_parse_list_refuses_bytes_and_mappings(value: object) -> None:
    with pytest.raises(ValueError, match=r"^ranks: expected a list, e.g. 8,16,32, got "):
        parse_list(value, int, "ranks")


def test_has_empty_item_finds_a_missing_item_anywhere() -> None:
    assert [has_empty_item(t) for t in ("8,,16", "8,16,", ",8", "8, ,16", "8,16", "8", "")] == \
        [True, True, True, True, False, False, True]


# ------------------------------------------------------------------ cell_error

def test_cell_error_names_source_row_line_column_value_problem_and_fix() -> None:
    frame = pd.DataFrame({"rank": [8, -4], "name": ["a", "b"]})
    e = cell_error("runs.csv", frame, 1, "rank", "is negative", "give a rank >= 1")
    assert isinstance(e, ValueError)
    # row i = 1 is the second data row: the header is line 1, so it sits on line 3
    assert str(e) == "runs.csv: row 2 (line 3), column rank: -4 is negative; give a rank >= 1"
    s = cell_error(Path("t.csv"), frame, 0, "name", "is unknown", "fix it", csv_line=False)
    assert str(s) == "t.csv: row 1, column name: 'a' is unknown; fix it"


@pytest.mark.parametrize("missing", [None, float("nan"), np.nan])
def test_cell_error_shows_a_missing_value_as_an_empty_cell(missing: object) -> None:
    frame = pd.DataFrame({"rate": pd.Series([0.1, missing], dtype=object)})
    assert str(cell_error("x.csv", frame, 1, "rate", "is required", "give a rate")) == \
        "x.csv: row 2 (line 3), column rate: an empty cell is required; give a rate"


# ------------------------------------------------------------------ csv_layout_problem

def test_csv_layout_problem_accepts_a_well_formed_file_and_ignores_unreadable_ones(tmp_path: Path) -> None:
    ok = tmp_path / "ok.csv"
    ok.write_text("a,b\n1,2\n\n3,4\n")
    assert csv_layout_problem(ok) is None
    assert csv_layout_problem(tmp_path / "missing.csv") is None
    binary = tmp_path / "bin.csv"
    binary.write_bytes(b"\xff\xfe\x00a,b\n")
    assert csv_layout_problem(binary) is None
    later = tmp_path / "later.csv"  # (a later long row is pandas' own error)
    later.write_text("a,b\n1,2\n1,2,3\n")
    assert csv_layout_problem(later) is None


def test_csv_layout_problem_finds_a_column_named_twice_even_behind_a_bom_and_spaces(tmp_path: Path) -> None:
    p = tmp_path / "t.csv"
    p.write_bytes("\ufeffrank, rate,rank\n8,0.1,16\n".encode("utf-8"))
    assert csv_layout_problem(p) == ("the header names column 'rank' twice; give every column once (the second one's "
                                     "values would be lost)")


def test_csv_layout_problem_finds_a_trailing_comma_on_the_first_data_row(tmp_path: Path) -> None:
    p = tmp_path / "t.csv"
    p.write_text("\na,b\n\n1,2,\n")  # (blank lines skipped, as pandas does; the data row is on line 4)
    msg = csv_layout_problem(p)
    assert msg is not None
    assert msg.startswith("row 1 (line 4) has 3 cells but the header names 2 columns (a trailing comma?)"), msg
    assert "give one cell per column" in msg


# ------------------------------------------------------------------ first_repeat, unique keys

@pytest.mark.parametrize("values,index", [
    ([], -1),
    ([1, 2, 3], -1),
    ([1, 2, 1, 2], 2),
    ([[8, 16], [16, 8], [8.0, 16]], 2),  # (lists compare as lists, 8 == 8.0)
    ([(1, [2, 3]), (1, [2, 3])], 1),
    ([{"a": 1}, {"a": 2}, {"a": 1}], 2),  # (unhashable: compared with every earlier one)
    ([{"a": 1}, {"a": 2}], -1),
])
def test_first_repeat_gives_the_index_of_the_first_value_seen_before(values: list, index: int) -> None:
    assert first_repeat(values) == index


def test_unique_keys_object_refuses_a_repeated_key_at_any_depth() -> None:
    assert json.loads('{"a": 1, "b": {"c": 2}}', object_pairs_hook=unique_keys_object) == {"a": 1, "b": {"c": 2}}
    with pytest.raises(RepeatedKey) as e:
        json.loads('{"a": 1, "b": {"c": 2, "c": 3}}', object_pairs_hook=unique_keys_object)
    assert e.value.key == "c" and e.value.where == ""
    assert isinstance(e.value, ValueError)
    assert RepeatedKey("k", " (line 3)").where == " (line 3)"


# ------------------------------------------------------------------ did_you_mean

def test_did_you_mean_suggests_the_closest_known_name_only_when_close() -> None:
    choices = ["chameleon", "fastlibra", "fcfs"]
    assert did_you_mean("chamelon", choices) == " (did you mean 'chameleon'?)"
    assert did_you_mean("fastlibr", iter(choices)) == " (did you mean 'fastlibra'?)"
    assert did_you_mean("zzzzzz", choices) == ""
    assert did_you_mean(8, ["8", "16"]) == " (did you mean '8'?)"
    assert did_you_mean("x", []) == ""


# ------------------------------------------------------------------ parse_bool

@pytest.mark.parametrize("value,expected", [
    (True, True), (False, False), ("true", True), ("YES", True), (" On ", True), ("1", True), (1, True),
    (1.0, True), ("false", False), ("No", False), ("off", False), ("0", False), (0, False), (0.0, False)])
def test_parse_bool_reads_the_usual_spellings(value: object, expected: bool) -> None:
    assert parse_bool(value, "--flag") is expected


@pytest.mark.parametrize("value", ["maybe", "", "2", 2, -1, None, 0.5, [True]])
def test_parse_bool_refuses_anything_else_naming_the_option(value: object) -> None:
    with pytest.raises(ValueError) as e:
        parse_bool(value, "--preload")
    assert str(e.value) == f"--preload: expected true or false, got {value!r}"


# ------------------------------------------------------------------ output directories and files

def test_check_writable_dir_accepts_new_and_existing_directories_and_creates_nothing(tmp_path: Path) -> None:
    new = tmp_path / "a" / "b"
    assert check_writable_dir("--out", str(new)) == new
    assert not (tmp_path / "a").exists()
    assert check_writable_dir("--out", tmp_path) == tmp_path
    assert list(tmp_path.iterdir()) == []  # (the write probe is removed)


@pytest.mark.parametrize("value", [None, "", "   "])
def test_check_writable_dir_refuses_an_empty_value_with_an_example(value: object) -> None:
    with pytest.raises(ValueError, match=r"^--out: empty; give a directory, e.g. --out runs/a$"):
        check_writable_dir("--out", value)


def test_check_writable_dir_refuses_an_existing_file_and_a_path_under_a_file(tmp_path: Path) -> None:
    f = tmp_path / "f.txt"
    f.write_text("x")
    with pytest.raises(ValueError, match="is an existing file, not a directory; give a directory"):
        check_writable_dir("--out", f)
    with pytest.raises(ValueError) as e:
        check_writable_dir("--out", f / "sub" / "dir")
    assert str(e.value) == (f"--out {f / 'sub' / 'dir'}: {f} is a file, so no directory can be created under it; "
                            f"give another path")


def test_check_writable_dir_refuses_a_folder_without_write_access(tmp_path: Path, monkeypatch) -> None:
    # (permission bits do not stop root, who runs these tests in CI's containers: the access check is simulated)
    monkeypatch.setattr(A.os, "access", lambda path, mode: False)
    with pytest.raises(ValueError, match=rf"^--out {tmp_path / 'x'}: {tmp_path} is not writable; give a path you can "
                                         rf"write to$"):
        check_writable_dir("--out", tmp_path / "x")


def test_check_writable_dir_refuses_a_folder_where_nothing_can_be_created(tmp_path: Path, monkeypatch) -> None:
    def read_only(*a, **k):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(A.tempfile, "mkdtemp", read_only)
    with pytest.raises(ValueError, match=r"nothing can be created in .* \(Read-only file system\); give a path you "
                                         r"can write to"):
        check_writable_dir("--out", tmp_path / "x")


def test_check_writable_file_accepts_a_listed_suffix_in_any_case(tmp_path: Path) -> None:
    assert check_writable_file("--plot", tmp_path / "new" / "f.PNG", (".png", ".pdf")) == tmp_path / "new" / "f.PNG"
    assert check_writable_file("--out", tmp_path / "any.name") == tmp_path / "any.name"
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("suffixes,fix", [((".csv",), "give a .csv file"),
                                          ((".png", ".pdf"), "give a .png or .pdf file"),
                                          ((".png", ".pdf", ".svg"), "give a .png, .pdf or .svg file")])
def test_check_writable_file_refuses_another_suffix_listing_the_ones_it_takes(tmp_path: Path, suffixes,
                                                                             fix: str) -> None:
    with pytest.raises(ValueError) as e:
        check_writable_file("--plot", tmp_path / "f.txt", suffixes)
    assert str(e.value) == f"--plot {tmp_path / 'f.txt'}: {fix}"


def test_check_writable_file_refuses_empty_a_directory_and_a_folder_under_a_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"^--plot: empty; give a file name$"):
        check_writable_file("--plot", " ")
    with pytest.raises(ValueError, match="is a directory; give a file"):
        check_writable_file("--plot", tmp_path)
    f = tmp_path / "f"
    f.write_text("x")
    with pytest.raises(ValueError, match="is a file, so no directory can be created under it"):
        check_writable_file("--plot", f / "x.png", (".png",))
