"""``twin traces show`` (:mod:`traces.stats`) says how many requests ``adapters_from=key`` dropped and why (the
workload's meta recorded it, ``transform.dropped_by_adapters_from_key`` and ``.adapters_from_key_reason``, but the
summary did not print it), and only when it dropped some."""

from __future__ import annotations

import argparse
import json

import pytest

from traces.registry import get_workload
from traces.samples import write_sample_data_dir
from traces.stats import format_summary, summarize, to_json
from traces.workload import Workload


@pytest.fixture(scope="module")
def sample_dir(tmp_path_factory):
    return write_sample_data_dir(tmp_path_factory.mktemp("data"), n=200)


@pytest.mark.parametrize("trace", ["burstgpt", "lmsys"])
def test_show_prints_the_requests_adapters_from_key_dropped(sample_dir, trace):
    w = get_workload(trace, data_dir=sample_dir, adapters_from="key", adapters=1)
    tr = w.meta["transform"]
    n = tr["dropped_by_adapters_from_key"]
    assert n > 0
    if trace == "burstgpt":  # (single requests, replayed as they are: the drop is the whole difference)
        assert len(get_workload(trace, data_dir=sample_dir)) == len(w) + n
    s = summarize(w)
    assert s["dropped_by_adapters_from_key"] == {"requests": n, "reason": tr["adapters_from_key_reason"]}
    line = [r for r in format_summary(s).splitlines() if r.startswith("dropped requests")]
    assert len(line) == 1
    assert f"{n:,} of the trace: adapters_from=key maps the 1 most frequent" in line[0]
    assert "(adapters=1)" in line[0] and "were dropped before re-timing" in line[0]
    assert json.loads(to_json(s))["dropped_by_adapters_from_key"]["requests"] == n


def test_show_says_nothing_when_nothing_was_dropped(sample_dir):
    for w in (get_workload("burstgpt", data_dir=sample_dir, adapters_from="key", adapters=2),  # (0 dropped)
              get_workload("burstgpt", data_dir=sample_dir), get_workload("synthetic", duration=30.0)):
        s = summarize(w)
        assert "dropped_by_adapters_from_key" not in s
        assert "dropped" not in format_summary(s)


def test_the_cli_show_prints_the_line(sample_dir, capsys):
    from traces.cli import register_cli

    ap = argparse.ArgumentParser(prog="twin")
    register_cli(ap.add_subparsers(dest="cmd"))
    args = ap.parse_args(["traces", "show", "burstgpt", "--data-dir", str(sample_dir), "--adapters-from", "key",
                          "--adapters", "1"])
    assert args.func(args) in (0, None)
    out = capsys.readouterr().out
    assert "dropped requests" in out and "adapters_from=key maps the 1 most frequent" in out


@pytest.mark.parametrize("times, rate, cv", [([0.0], "n/a (1 request: their arrivals span 0 s)",
                                              "n/a (1 request: fewer than 2 gaps)"),
                                             ([5.0, 5.0, 5.0], "n/a (3 requests: their arrivals span 0 s)",
                                              "n/a (3 requests: every gap is 0 s)"),
                                             ([0.0, 1.0, 3.0], "1.000 req/s", "0.333")])
def test_undefined_rate_and_cv_say_why(times, rate, cv):
    """``twin traces show splitwise --duration 0.001`` printed "mean rate nan req/s, inter-arrival CV nan"."""
    n = len(times)
    w = Workload.from_arrays(times, [10] * n, [5] * n, [0] * n, [8] * n)
    text = format_summary(summarize(w))
    assert f"mean rate            {rate}" in text and f"inter-arrival CV     {cv}" in text
