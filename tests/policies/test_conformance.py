"""Every registered scheduler, cache and preset through the conformance battery
(:mod:`twin.policy_checks`): engine invariants, accounting, determinism, exact run-skipping
and the ``get_params`` contract; and the battery itself catches broken policies."""

from __future__ import annotations

import pytest

from twin.policy_checks import (as_subject, check_deterministic, check_get_params, check_scheduler,
                                check_victim_keeps_reclaim_pin, parametrize_with_checks, registered_policies)
from twin.registry import CACHES, SCHEDULERS, load_entry_points


@parametrize_with_checks(registered_policies())
def test_policy_conforms(policy, check):
    check(policy)


load_entry_points()


class MisreportedParams(SCHEDULERS["fcfs"]):
    """Takes ``patience`` but reports another parameter."""

    name = "test-misreported"
    description = "fcfs whose get_params() does not return its constructor arguments"
    citation = "none"

    def __init__(self, patience: float = 1.0) -> None:
        self.patience = patience

    def get_params(self) -> dict:
        return {"wait": self.patience}


class DriftingCache(CACHES["lru"]):
    """Keeps idle adapters resident on even-numbered instances and discards them at once on
    odd-numbered ones: two fresh instances disagree."""

    name = "test-drifting"
    description = "lru on one instance, no cache on the next"
    citation = "none"
    instances = 0

    def __init__(self) -> None:
        super().__init__()
        self.discard = DriftingCache.instances % 2 == 1
        DriftingCache.instances += 1

    def evict_when_idle(self, a: int) -> bool:
        return self.discard


def test_battery_catches_misreported_params():
    with pytest.raises(AssertionError, match=r"get_params\(\) lacks constructor arguments \['patience'\]"):
        check_get_params(as_subject(MisreportedParams))


def test_battery_catches_a_nondeterministic_policy():
    with pytest.raises(AssertionError, match="two runs of fresh instances"):
        check_deterministic(as_subject(DriftingCache))


class PinBlindCache(CACHES["lru"]):
    """LRU whose victim ignores ``reclaim_pin`` (the built-in orders before stop 69)."""

    name = "test-pin-blind"
    description = "lru that may evict the admitting request's own adapter"
    citation = "none"

    def victim(self, now: float) -> int:
        return next(iter(self.idle))


def test_battery_catches_a_victim_that_evicts_the_pinned_adapter():
    with pytest.raises(AssertionError, match=r"victim\(\) named adapter 0 with reclaim_pin = 0 and adapters \[0, 1, 2\]"):
        check_victim_keeps_reclaim_pin(as_subject(PinBlindCache))
    check_victim_keeps_reclaim_pin(as_subject(CACHES["lru"]))  # (the same order, told the pin)


def test_battery_refuses_what_is_not_a_scheduler():
    with pytest.raises(TypeError):
        check_scheduler(CACHES["lru"])
