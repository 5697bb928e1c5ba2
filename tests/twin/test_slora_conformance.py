"""The conformance battery (``twin/policy_checks.py``) on the S-LoRA engine: every registered
scheduler and adapter-cache policy that the S-LoRA system can run passes it there unchanged
(the presets whose system is ``slora`` run on it in ``tests/policies/test_conformance.py``)."""

from __future__ import annotations

import pytest

from twin.config import ConfigError, EngineConfig
from twin.interfaces import AdapterCachePolicy
from twin.policy_checks import on_system, parametrize_with_checks, registered_policies
from twin.registry import Preset, make_cache
from twin.slora_engine import check_slora_config


def _cache_of(p) -> AdapterCachePolicy | None:
    if isinstance(p, Preset):
        return make_cache(p.cache, **dict(p.cache_opts))
    if isinstance(p, type) and issubclass(p, AdapterCachePolicy):
        return p()
    return None


def runs_on_slora(p) -> bool:
    """Schedulers and caches that need no vLLM-engine memory extension (fixed regions, prefix KV)."""
    if isinstance(p, Preset):
        return False  # presets run on their own system (tests/policies/test_conformance.py)
    c = _cache_of(p)
    if c is None:
        return True
    try:
        check_slora_config(EngineConfig(), c)
    except ConfigError:
        return False
    return True


SLORA_POLICIES = [on_system(p, "slora") for p in registered_policies() if runs_on_slora(p)]


@parametrize_with_checks(SLORA_POLICIES)
def test_policy_conforms_on_slora(policy, check):
    check(policy)


def test_some_policies_are_refused_with_a_reason():
    refused = [p for p in registered_policies() if not isinstance(p, Preset) and not runs_on_slora(p)]
    assert refused, "expected the vLLM-only caches (prefix KV, fixed regions) to be refused on S-LoRA"
    with pytest.raises(ConfigError, match="--system vllm"):
        check_slora_config(EngineConfig(), _cache_of(refused[0]))
