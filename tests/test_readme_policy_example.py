"""The README's example cache policy runs and passes the conformance battery."""

from __future__ import annotations

import re
from pathlib import Path

from twin import registry
from twin.policy_checks import check_cache

README = Path(__file__).resolve().parents[1] / "README.md"


def _example_source() -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    src = [b for b in blocks if "@register_cache" in b]
    assert len(src) == 1, "the README should hold exactly one example cache policy"
    return src[0]


def test_readme_example_cache_conforms():
    ns: dict = {}
    try:
        exec(compile(_example_source(), str(README), "exec"), ns)
        cls = ns["MostRecentlyLoaded"]
        assert registry.CACHES["mru-load"] is cls
        check_cache(cls)
        check_cache(cls(tie_break="rank"))
    finally:
        registry.CACHES.pop("mru-load", None)


def test_readme_example_scheduler_conforms():
    from twin.policy_checks import check_scheduler

    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    src = [b for b in blocks if "@register_scheduler" in b]
    assert len(src) == 1, "the README should hold exactly one example scheduler"
    ns: dict = {}
    try:
        exec(compile(src[0], str(README), "exec"), ns)
        cls = ns["ShortestPromptFirst"]
        assert registry.SCHEDULERS["spf"] is cls
        check_scheduler(cls)
    finally:
        registry.SCHEDULERS.pop("spf", None)
