"""The disk memo of reproduction points: a point read back equals the simulated one, other code
never reads it, and an interrupted write leaves nothing behind."""

from __future__ import annotations

import json
import math

import pytest

from twin.cli import main
from twin.reproduce import base, point_cache
from twin.reproduce.base import Runner
from twin.reproduce.point_cache import PointCache, code_fingerprint
from twin.scenario import RunConfig

RUN = RunConfig(trace="synthetic", adapters=4, ranks=[8], seed=3, duration=20.0)


def test_point_read_back_equals_the_simulated_point(tmp_path, monkeypatch):
    first = Runner(cache=PointCache(tmp_path)).point(RUN, "vllm", 2.0)
    assert first["requests_finished"] > 0

    def no_simulation(*a, **k):
        raise AssertionError("a cached point was simulated again")

    monkeypatch.setattr(base, "simulate", no_simulation)
    cache = PointCache(tmp_path)
    again = Runner(cache=cache).point(RUN, "vllm", 2.0)
    assert cache.hits == 1 and cache.misses == 0
    assert list(again) == list(first)
    for k, v in first.items():
        if isinstance(v, float) and math.isnan(v):
            assert math.isnan(again[k]), k
        else:
            assert again[k] == v, k


def test_other_code_or_another_point_is_a_miss(tmp_path, monkeypatch):
    Runner(cache=PointCache(tmp_path)).point(RUN, "vllm", 2.0)
    cache = PointCache(tmp_path)
    assert cache.get((repr(RUN), "vllm", None, None, None, None, None, False)) is None  # rps not replaced: other key
    monkeypatch.setattr(point_cache, "code_fingerprint", lambda: "edited code")
    runner = Runner(cache=cache)
    calls = []
    real = base.simulate
    monkeypatch.setattr(base, "simulate", lambda *a, **k: calls.append(1) or real(*a, **k))
    runner.point(RUN, "vllm", 2.0)
    assert calls == [1], "a point stored by other code was read back"


def test_non_finite_values_round_trip(tmp_path):
    cache = PointCache(tmp_path)
    cache.put(("k",), {"a": float("nan"), "b": float("inf"), "c": 1.5, "d": "x", "e": None, "f": 3})
    got = cache.get(("k",))
    assert math.isnan(got["a"]) and got["b"] == math.inf and got[
        "c"] == 1.5 and got["d"] == "x" and got["e"] is None and got["f"] == 3
    assert not list(tmp_path.rglob("*.tmp"))


def test_fingerprint_is_stable_and_env_selects_the_cache(tmp_path, monkeypatch):
    assert code_fingerprint() == code_fingerprint() and len(code_fingerprint()) == 64
    monkeypatch.setenv(point_cache.CACHE_ENV, str(tmp_path))
    assert Runner().cache.directory == tmp_path
    assert Runner(cache=False).cache is None
    monkeypatch.setenv(point_cache.CACHE_ENV, "")
    assert Runner().cache is None


def test_cli_cache_option_errors_before_work(tmp_path, capsys):
    f = tmp_path / "file"
    f.write_text("x")
    assert main(["reproduce", "adaptive-caching", "--quick", "--cache", str(f)]) == 2
    assert "--cache" in capsys.readouterr().err


@pytest.mark.parametrize("content", ["[1, 2]", "null", '"text"', '{"key": "K"}', '{"key": "K", "point": [1]}'])
def test_a_damaged_cache_file_is_a_miss(tmp_path, content):
    """A cache file that parses but is not a stored point (another JSON value, no point, a point that is not
    a table) is ignored like a truncated one: the point is simulated again."""
    cache = PointCache(tmp_path)
    key = ("k",)
    p = cache.path(key)
    p.parent.mkdir(parents=True)
    p.write_text(content.replace('"K"', json.dumps(repr(key))))
    assert cache.get(key) is None and cache.misses == 1


@pytest.mark.parametrize("edit", [lambda pt: {k: "garbage" if isinstance(v, (int, float)) else v
                                              for k, v in pt.items()},
                                  lambda pt: {}, lambda pt: {**pt, "c": 2.5}])
def test_a_cache_file_edited_since_it_was_written_is_a_miss(tmp_path, edit):
    """A stored point whose numbers were replaced (strings, an empty table, another value) parses and has its key,
    but no longer hashes to the digest written with it: it is ignored and simulated again, not read back (its
    strings crashed the knee search with a TypeError)."""
    cache = PointCache(tmp_path)
    key = ("k",)
    cache.put(key, {"a": 1, "c": 1.5, "d": "x"})
    p = cache.path(key)
    doc = json.loads(p.read_text())
    doc["point"] = edit(doc["point"])
    p.write_text(json.dumps(doc))
    assert cache.get(key) is None and cache.misses == 1


def test_a_cache_variable_naming_a_file_is_refused(tmp_path, monkeypatch):
    f = tmp_path / "afile"
    f.write_text("x")
    monkeypatch.setenv(point_cache.CACHE_ENV, str(f))
    with pytest.raises(ValueError, match="TWIN_REPRODUCE_CACHE=.*not a directory; give a directory"):
        PointCache.from_env()


def test_a_cache_variable_under_a_file_is_refused_before_any_point(tmp_path, monkeypatch, capsys):
    """A cache directory that cannot be created (under a file) used to fail at the first point's
    write, after that point was simulated: now refused before the reproduction starts."""
    (tmp_path / "afile").write_text("x")
    monkeypatch.setenv(point_cache.CACHE_ENV, str(tmp_path / "afile" / "cache"))
    monkeypatch.setattr(base, "simulate", lambda *a, **k: pytest.fail("simulated before the check"))
    assert main(["reproduce", "adaptive-caching", "--quick"]) == 2
    err = capsys.readouterr().err
    assert f"$TWIN_REPRODUCE_CACHE={tmp_path / 'afile' / 'cache'}: {tmp_path / 'afile'} is a file" in err, err
