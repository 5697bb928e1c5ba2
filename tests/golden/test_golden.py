"""The golden scenarios (``tests/golden/scenarios.py``) give bit-identical results."""

from __future__ import annotations

import json
import math

import pytest

from tests.golden.scenarios import GOLDEN, SCENARIOS, compute

EXPECTED = json.loads(GOLDEN.read_text())


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_golden(name, request):
    if SCENARIOS[name][2]:
        request.getfixturevalue("real_data")
    assert name in EXPECTED, f"{name} has no stored result: run `python -m tests.golden.scenarios {name}`"
    got = compute(name)
    want = EXPECTED[name]
    if SCENARIOS[name][0] == "fit":
        _assert_fit_close(name, want, got)
        return
    for key in want:
        if isinstance(want[key], dict):
            diff = {k: (want[key].get(k), got[key].get(k)) for k in set(want[key]) | set(got[key])
                    if want[key].get(k) != got[key].get(k)}
            assert not diff, f"{name}/{key} differs (stored, now): {diff}"
        else:
            assert got[key] == want[key], f"{name}/{key} differs"


#: A fit's constants agree to this relative tolerance across machines: curve_fit's least squares run on
#: OpenBLAS, whose kernels depend on the CPU (the same wheel gives results that differ from the 6th digit on, in the least-determined constants, under
#: ``OPENBLAS_CORETYPE=Haswell`` and on an AVX-512 core), so a fit golden compares values, not their digits.
FIT_REL_TOL = 1e-5


def _fit_diff(want, now, path=""):
    """The leaves of ``want`` (nested dicts of repr'd floats, as stored) that ``now`` lacks or that differ by
    more than :data:`FIT_REL_TOL` relative, by path."""
    if isinstance(want, dict):
        if not isinstance(now, dict) or set(now) != set(want):
            return {path: (sorted(want), now if not isinstance(now, dict) else sorted(now))}
        out = {}
        for k, v in want.items():
            out.update(_fit_diff(v, now[k], f"{path}/{k}"))
        return out
    if want is None or now is None or not isinstance(want, str):
        return {} if want == now else {path: (want, now)}
    same = math.isclose(float(want), float(now), rel_tol=FIT_REL_TOL, abs_tol=1e-300)
    return {} if same else {path: (want, now)}


def _assert_fit_close(name, want, got):
    """The fitted components equal the stored ones to :data:`FIT_REL_TOL` (same components, same parameters)."""
    diff = _fit_diff(want["components"], got["components"])
    assert not diff, f"{name} differs beyond {FIT_REL_TOL:g} relative (stored, now): {diff}"


def test_fit_tolerance_catches_a_real_change():
    """The fit comparison is not blind: a constant off by 1e-4 relative fails it, one off by 1e-7 passes."""
    want = {"components": {"backbone": {"c0": "0.010797767", "c_tok": "2.053503e-05"}}}
    _assert_fit_close("t", want, {"components": {"backbone": {"c0": repr(0.010797767 * (1 + 1e-7)),
                                                               "c_tok": "2.053503e-05"}}})
    with pytest.raises(AssertionError, match="c0"):
        _assert_fit_close("t", want, {"components": {"backbone": {"c0": repr(0.010797767 * (1 + 1e-4)),
                                                                   "c_tok": "2.053503e-05"}}})
