"""The golden scenarios (``tests/golden/scenarios.py``) give bit-identical results."""

from __future__ import annotations

import json

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
    for key in want:
        if isinstance(want[key], dict):
            diff = {k: (want[key].get(k), got[key].get(k)) for k in set(want[key]) | set(got[key])
                    if want[key].get(k) != got[key].get(k)}
            assert not diff, f"{name}/{key} differs (stored, now): {diff}"
        else:
            assert got[key] == want[key], f"{name}/{key} differs"
