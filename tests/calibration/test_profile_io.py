"""calibration/fitting/profile_io.py: assembling, validating and writing profile JSON files with their provenance.

Contract tested: :func:`provenance` names the measurement directory relative to the data root and the SHA-256
of each table it read; :func:`build_profile` lays a profile out in the schema's order, refuses a missing
component or one the engine would refuse, and makes it JSON-safe (private ``_`` keys dropped, numpy values as
Python ones, NaN and infinities as null); :func:`write_profile` refuses what the engine would not load and
writes a file that reads back identical and loads as the same profile; a file corrupted afterwards is refused
by the loader with the file named.
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from calibration.fitting.profile_io import build_profile, provenance, write_profile
from twin.perf.profile import DEFAULT_PROFILE, KINDS, PROFILE_SCHEMA, load_profile


def _components() -> dict[str, Any]:
    return copy.deepcopy(DEFAULT_PROFILE["components"])


def _build(**kw: Any) -> dict[str, Any]:
    args: dict[str, Any] = dict(name="t-fit", model="llama-3.1-8b", gpu="H100-64GB", software="vllm-0.8.5",
                                description="a test fit", components=_components(),
                                provenance_={"command": "twin calibrate fit"}, lora_targets=("q_proj", "v_proj"))
    args.update(kw)
    return build_profile(**args)


# ------------------------------------------------------------------ provenance

def test_provenance_hashes_each_table_it_read_and_names_the_directory_under_the_data_root(tmp_path: Path) -> None:
    d = tmp_path / "calibration" / "vllm085"
    d.mkdir(parents=True)
    (d / "b.csv").write_bytes(b"x,y\n1,2\n")
    (d / "a.csv").write_bytes(b"")
    p = provenance(d, ["b.csv", "missing.csv", "a.csv"], "twin calibrate fit --x", "least squares",
                   data_root=tmp_path)
    assert p["measurements"]["directory"] == str(Path("calibration") / "vllm085")
    tables = p["measurements"]["tables"]
    assert list(tables) == ["a.csv", "b.csv"]  # sorted; a table that is not there is left out
    assert tables["b.csv"] == hashlib.sha256(b"x,y\n1,2\n").hexdigest()
    assert tables["a.csv"] == hashlib.sha256(b"").hexdigest()
    assert p["command"] == "twin calibrate fit --x" and p["method"] == "least squares"
    assert "curve_fit" in p["code"]


def test_provenance_outside_the_data_root_or_without_one_gives_the_directory_name(tmp_path: Path) -> None:
    d = tmp_path / "meas"
    d.mkdir()
    assert provenance(d, [], "c", "m", data_root=tmp_path / "elsewhere")["measurements"]["directory"] == "meas"
    assert provenance(d, [], "c", "m")["measurements"]["directory"] == "."
    assert provenance(d, [], "c", "m")["measurements"]["tables"] == {}


def test_provenance_adds_the_extra_entries(tmp_path: Path) -> None:
    p = provenance(tmp_path, [], "c", "m", extra={"data_source": "peer tables", "method": "overridden"})
    assert p["data_source"] == "peer tables" and p["method"] == "overridden"


# ------------------------------------------------------------------ build_profile

def test_build_profile_lays_the_profile_out_in_the_schemas_order() -> None:
    comps = _components()
    shuffled = {k: comps[k] for k in reversed(KINDS)}
    d = _build(components=shuffled, version=3)
    assert list(d) == ["schema", "name", "version", "model", "gpu", "software", "description", "lora_targets",
                       "provenance", "components"]
    assert d["schema"] == PROFILE_SCHEMA and d["version"] == 3
    assert list(d["components"]) == list(KINDS)
    assert d["lora_targets"] == ["q_proj", "v_proj"]
    assert d["components"] == comps


def test_build_profile_adds_the_comparison_and_notes_only_when_given() -> None:
    d = _build(comparison={"peer": {"mape": 3.0}}, notes=["fitted on H100"])
    assert d["comparison_with_published_twin"] == {"peer": {"mape": 3.0}} and d["notes"] == ["fitted on H100"]
    plain = _build(comparison={}, notes=[])
    assert "comparison_with_published_twin" not in plain and "notes" not in plain


def test_build_profile_makes_every_value_json_safe() -> None:
    comps = _components()
    comps["backbone"]["params"]["c0"] = np.float64(0.0105)
    comps["backbone"]["_oof_ms"] = np.arange(3.0)  # (a fit's private working array)
    comps["backbone"]["fit"] = {"heldout": {"mape_pct": np.float32(2.5), "n": np.int64(40), "r2": float("nan"),
                                            "_private": 1}, "ok": np.bool_(True), "ranks": (8, np.int32(16)),
                                "curve": np.array([1.0, np.inf])}
    d = _build(components=comps, provenance_={"score": -np.inf, "tables": {"_tmp": "x", "a.csv": "h"}})
    bb = d["components"]["backbone"]
    assert "_oof_ms" not in bb and "_private" not in bb["fit"]["heldout"]
    assert bb["fit"] == {"heldout": {"mape_pct": 2.5, "n": 40, "r2": None}, "ok": True, "ranks": [8, 16],
                         "curve": [1.0, None]}
    assert type(bb["params"]["c0"]) is float and type(bb["fit"]["heldout"]["n"]) is int
    assert type(bb["fit"]["ok"]) is bool
    assert d["provenance"] == {"score": None, "tables": {"a.csv": "h"}}
    json.dumps(d, allow_nan=False)  # (strict JSON: raises on any NaN or numpy value left)


def test_build_profile_leaves_its_inputs_unchanged() -> None:
    comps = _components()
    comps["lora"]["_oof_ms"] = [1.0]
    before = copy.deepcopy(comps)
    _build(components=comps)
    assert comps == before


def test_build_profile_refuses_a_missing_component_naming_it() -> None:
    comps = _components()
    del comps["kv"], comps["load"]
    with pytest.raises(ValueError, match=r"^profile 't-fit' lacks components \['load', 'kv'\]$"):
        _build(components=comps)


def test_build_profile_refuses_a_component_the_engine_would_refuse() -> None:
    comps = _components()
    comps["lora"]["form"] = "no_such_form"
    with pytest.raises(ValueError, match=r"component 'lora' names unknown form 'no_such_form'; known forms"):
        _build(components=comps)
    comps = _components()
    comps["backbone"]["params"]["c0"] = np.nan  # (made null by the cleaning, then refused)
    with pytest.raises(ValueError, match=r"fitted profile t-fit: components\.backbone\.params\.c0 is null.*finite "
                                         r"number"):
        _build(components=comps)
    with pytest.raises(ValueError, match="model"):
        _build(model="no-such-model")


# ------------------------------------------------------------------ write_profile and the round trip

def test_a_written_profile_reads_back_identical_and_loads_as_the_same_profile(tmp_path: Path) -> None:
    d = _build(notes=["n"])
    out = write_profile(d, tmp_path / "new" / "dir" / "p.json")
    assert out == tmp_path / "new" / "dir" / "p.json"
    text = out.read_text()
    assert text.endswith("}\n") and text.startswith('{\n "schema"')  # (indent 1, a final newline)
    assert json.loads(text) == d
    prof = load_profile(str(out))
    assert prof.name == "t-fit" and prof.model.name == "llama-3.1-8b" and prof.lora_targets == ("q_proj", "v_proj")
    for k in KINDS:
        assert prof.components[k].form == d["components"][k]["form"]
        assert prof.components[k].params == d["components"][k]["params"]
    # the same durations as the dict it was written from
    assert prof.step_s(100, 8, 4000, 9, 2, 16, 4, 9, 3, 8) == pytest.approx(
        load_profile("embedded").step_s(100, 8, 4000, 9, 2, 16, 4, 9, 3, 8), rel=0, abs=0)


def test_write_profile_refuses_a_profile_the_engine_would_not_load_and_writes_nothing(tmp_path: Path) -> None:
    d = _build()
    bad = copy.deepcopy(d)
    bad["components"]["backbone"]["params"]["c0"] = -1.0
    out = tmp_path / "sub" / "p.json"
    with pytest.raises(ValueError, match=rf"{out}.*backbone"):
        write_profile(bad, out)
    assert not out.exists()
    bad = copy.deepcopy(d)
    bad["schema"] = "something/2"
    with pytest.raises(ValueError, match="not a LoRA Twin profile"):
        write_profile(bad, out)
    assert not out.exists()


def test_write_profile_replaces_an_existing_file(tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    out.write_text("old")
    write_profile(_build(description="second"), out)
    assert json.loads(out.read_text())["description"] == "second"


@pytest.mark.parametrize("corrupt,fragment", [
    (lambda text: text[: len(text) // 2], "is not valid JSON"),
    (lambda text: text.replace(PROFILE_SCHEMA, "lora-twin-profile/0"), "is not a LoRA Twin profile"),
    (lambda text: text.replace('"c0": 0.0105', '"c0": "fast"'), "is not a valid profile"),
    (lambda text: text.replace('"kv": {', '"kv_": {'), "is not a valid profile"),
])
def test_a_written_profile_corrupted_afterwards_is_refused_naming_the_file(tmp_path: Path, corrupt,
                                                                          fragment: str) -> None:
    out = write_profile(_build(), tmp_path / "p.json")
    text = out.read_text()
    changed = corrupt(text)
    assert changed != text
    out.write_text(changed)
    with pytest.raises(ValueError) as e:
        load_profile(str(out))
    assert str(out) in str(e.value) and fragment in str(e.value), str(e.value)


def test_write_profile_refuses_a_profile_its_own_loader_refuses(tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    with pytest.raises(ValueError, match="gpu"):
        write_profile(_build(gpu="H100-8GB"), out)  # (the weights and KV memory do not fit in 8 GB)
    assert not out.exists()


def test_a_failed_write_leaves_the_previous_profile_intact(tmp_path: Path) -> None:
    out = write_profile(_build(), tmp_path / "p.json")
    good = out.read_text()
    d = _build()
    d["provenance"]["score"] = float("nan")  # (not through build_profile's cleaning)
    with pytest.raises(ValueError):
        write_profile(d, out)
    assert out.read_text() == good
