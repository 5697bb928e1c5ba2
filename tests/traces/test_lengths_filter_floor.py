"""Length filters that keep (almost) nothing are refused after a round or two, and a committed fit asked for
a section it lacks says which fits have it; filters that keep a normal share draw exactly as before."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from traces.lengths import (CopulaLengths, FixedLengths, LengthError, LengthFilter, LognormalLengths, load_fitted,
                            sample_lengths, scale_lengths)

COPULA = CopulaLengths.from_dict(load_fitted("splitwise_conv_fit")["lengths"]["copula"])
#: more draws than one round of a refused filter may ask for (the old rounds asked for 2.4e6 at 2,000 requests,
#: up to 200 times, and 1.2e8 at 100,000)
ROUND_LIMIT = 3_000_000


@dataclass
class Counted:
    """A length model that counts its draws and fails a test that asks for an oversized round."""

    model: Any
    drawn: int = 0

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        if n > ROUND_LIMIT:
            raise AssertionError(f"one round asked for {n:,} draws")
        self.drawn += n
        return self.model.sample(n, rng)

    def describe(self) -> dict[str, Any]:
        return self.model.describe()


def _plain_rounds(model: Any, n: int, rng: np.random.Generator, scale: float, filt: LengthFilter,
                  max_rounds: int = 200) -> tuple[np.ndarray, np.ndarray]:
    """The rejection rounds of sample_lengths before the acceptance floor (the reference the draws must match)."""
    ps, os_, have, drawn = [], [], 0, 0
    for _ in range(max_rounds):
        need = n - have
        if need <= 0:
            break
        m = need if have == drawn == 0 else int(need * min(drawn / max(have, 1), 1000) * 1.2) + 16
        p, o = scale_lengths(*model.sample(max(m, 1), rng), scale)
        keep = filt.mask(p, o)
        drawn += p.size
        have += int(keep.sum())
        ps.append(p[keep])
        os_.append(o[keep])
    return np.concatenate(ps)[:n], np.concatenate(os_)[:n]


@pytest.mark.parametrize("model,n,filt,max_drawn", [
    # copula, 300 requests: 14.2 s (7.2e7 draws) before the error; now two rounds
    (COPULA, 300, LengthFilter(max_prompt=2, min_output=900), 110_000),
    # fixed lengths, 2,000 requests: 477 M draws before the error; now two rounds
    (FixedLengths(100, 100), 2000, LengthFilter(max_prompt=2), 2_500_000),
    # 100,000 requests: the second round would have drawn 1.2e8 pairs; now the first round decides
    (COPULA, 100_000, LengthFilter(max_prompt=2, min_output=900), 100_000),
])
def test_an_impossible_filter_is_refused_after_a_round_or_two(model, n, filt, max_drawn):
    counted = Counted(model)
    with pytest.raises(LengthError, match=r"length filter .*max_prompt=2 rejects almost every draw of \w+ lengths: "
                                          r"it kept 0 of [\d,]+ \(0 %\), below the 0.1 % a workload may be drawn at; "
                                          r"relax the limits") as e:
        sample_lengths(counted, n, np.random.default_rng(0), filt=filt)
    assert counted.drawn <= max_drawn, counted.drawn
    assert ("min_output=900" in str(e.value)) == (filt.min_output == 900)  # (the limits that bind, by name)


def test_a_filter_below_the_acceptance_floor_names_the_share_it_keeps():
    # P(prompt <= 8) under lognormal(mu=log 1000, sigma=1) is about 7e-7: a few in 100,000 draws
    model = LognormalLengths(float(np.log(1000.0)), 1.0, float(np.log(100.0)), 1.0)
    filt = LengthFilter(max_prompt=8)
    with pytest.raises(LengthError, match=r"rejects almost every draw of lognormal lengths: it kept \d+ of 200,000 "
                                          r"\([\d.e-]+ %\)"):
        sample_lengths(Counted(model), 200_000, np.random.default_rng(1), scale=1.0, filt=filt)


@pytest.mark.parametrize("model,n,scale,filt", [
    (COPULA, 5000, 0.5, LengthFilter(max_prompt=2048, max_total=2048)),
    (COPULA, 3000, 1.0, LengthFilter(min_prompt=4, min_output=4, max_prompt=1024, max_total=2048)),
    (COPULA, 50, 1.0, LengthFilter(min_prompt=3000)),  # a rare region (~2 %): many rounds, each 1,000x
    (LognormalLengths(float(np.log(200.0)), 1.0, float(np.log(100.0)), 1.0, 0.3), 2000, 1.0,
     LengthFilter(min_output=600)),  # ~4 %
    (LognormalLengths(float(np.log(200.0)), 1.0, float(np.log(100.0)), 1.0), 400, 1.0,
     LengthFilter(min_prompt=4000)),  # ~0.1 %, at the floor: served, as before
    (FixedLengths(250, 231), 100, 1.0, LengthFilter(max_total=4096)),
    (COPULA, 1, 1.0, LengthFilter(min_output=500)),
])
def test_a_satisfiable_filter_draws_exactly_as_the_plain_rounds(model, n, scale, filt):
    """Existing workloads stay bit-identical: the floor only ever refuses, it never changes a round."""
    p, o = sample_lengths(model, n, np.random.default_rng(3), scale=scale, filt=filt)
    rp, ro = _plain_rounds(model, n, np.random.default_rng(3), scale, filt)
    assert p.tolist() == rp.tolist() and o.tolist() == ro.tolist()
    assert p.size == n and filt.mask(p, o).all()


def test_the_floor_is_documented_as_a_tenth_of_a_percent():
    from traces.lengths import MIN_ACCEPTANCE

    assert MIN_ACCEPTANCE == 1e-3
    assert "MIN_ACCEPTANCE" in (sample_lengths.__doc__ or "")


# ---------------------------------------------------------------- a fit without the section asked of it
def test_a_fit_without_arrivals_says_which_fits_have_them():
    fit = load_fitted("sharegpt_lengths")
    with pytest.raises(KeyError) as e:  # (a KeyError still: callers that catch one keep working)
        fit["arrivals"]
    msg = str(e.value)
    assert isinstance(e.value, ValueError)
    assert msg.startswith("fitted statistics 'sharegpt_lengths' (traces/data/sharegpt_lengths.json) hold no "
                          "'arrivals', read by arrival=fitted")
    assert msg.endswith("use a fit that has it: splitwise_code_fit, splitwise_conv_fit")
    assert load_fitted("splitwise_conv_fit")["arrivals"]["mean_rps"] > 0  # (the fits that have it are read as before)
    assert fit.get("arrivals") is None and "arrivals" not in fit


def test_show_with_a_lengths_fit_as_the_arrival_fit_names_the_fix(capsys):
    """`twin traces show synthetic --arrival fitted --fit sharegpt_lengths` printed only `error: arrivals`."""
    from traces.cli import register_cli

    ap = argparse.ArgumentParser(prog="twin")
    register_cli(ap.add_subparsers(dest="cmd"))
    args = ap.parse_args(["traces", "show", "synthetic", "--arrival", "fitted", "--fit", "sharegpt_lengths"])
    assert args.func(args) == 2
    err = capsys.readouterr().err
    assert "hold no 'arrivals'" in err and "use a fit that has it: splitwise_code_fit, splitwise_conv_fit" in err
    assert not err.strip().endswith("error: arrivals")


def test_fits_copy_pickle_and_serialise_as_dicts():
    import copy
    import json
    import pickle

    fit = load_fitted("splitwise_conv_fit")
    for other in (copy.deepcopy(fit), pickle.loads(pickle.dumps(fit))):
        assert other == fit
        with pytest.raises(KeyError, match="hold no 'nope'"):
            other["nope"]
    assert json.loads(json.dumps(fit)) == fit
