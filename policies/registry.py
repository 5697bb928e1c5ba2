"""Registries of schedulers, adapter-cache policies and presets (scheduler + cache).

Third-party packages register theirs through the entry-point group ``lora_twin.policies``:
each entry point names a module (or callable) that registers on import.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, Callable

from twin.interfaces import AdapterCachePolicy, Scheduler

SCHEDULERS: dict[str, type[Scheduler]] = {}
CACHES: dict[str, type[AdapterCachePolicy]] = {}


@dataclass(frozen=True)
class Preset:
    """A named system: a scheduler and a cache policy, with options for each."""

    name: str
    scheduler: str
    cache: str
    description: str = ""
    citation: str = ""
    scheduler_opts: dict[str, Any] = field(default_factory=dict)
    cache_opts: dict[str, Any] = field(default_factory=dict)


PRESETS: dict[str, Preset] = {}
_entry_points_loaded = False


def register_scheduler(cls: type[Scheduler]) -> type[Scheduler]:
    if not cls.name:
        raise ValueError(f"{cls.__name__} needs a class attribute `name` to be registered")
    SCHEDULERS[cls.name] = cls
    return cls


def register_cache(cls: type[AdapterCachePolicy]) -> type[AdapterCachePolicy]:
    if not cls.name:
        raise ValueError(f"{cls.__name__} needs a class attribute `name` to be registered")
    CACHES[cls.name] = cls
    return cls


def register_preset(preset: Preset) -> Preset:
    PRESETS[preset.name] = preset
    return preset


def load_entry_points() -> None:
    """Import third-party policies declared under the ``lora_twin.policies`` group."""
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    for ep in metadata.entry_points(group="lora_twin.policies"):
        obj = ep.load()
        if callable(obj) and not isinstance(obj, type):
            obj()


def _unknown(kind: str, name: str, known: dict) -> KeyError:
    return KeyError(f"unknown {kind} {name!r}; available: {', '.join(sorted(known))} "
                    f"(`twin policies` lists them with descriptions)")


def make_scheduler(name: str, **opts: Any) -> Scheduler:
    load_entry_points()
    if name not in SCHEDULERS:
        raise _unknown("scheduler", name, SCHEDULERS)
    return SCHEDULERS[name](**opts)


def make_cache(name: str, **opts: Any) -> AdapterCachePolicy:
    load_entry_points()
    if name not in CACHES:
        raise _unknown("adapter-cache policy", name, CACHES)
    return CACHES[name](**opts)


def resolve_policy(policy: str | None = None, scheduler: str | None = None,
                   cache: str | None = None) -> tuple[Scheduler, AdapterCachePolicy, str]:
    """``--policy`` preset, optionally overridden by ``--scheduler`` / ``--cache``."""
    load_entry_points()
    name = policy or "vllm"
    if name not in PRESETS:
        raise KeyError(f"unknown policy {name!r}; available presets: {', '.join(sorted(PRESETS))}; "
                       f"or mix with --scheduler ({', '.join(sorted(SCHEDULERS))}) and --cache "
                       f"({', '.join(sorted(CACHES))})")
    p = PRESETS[name]
    s = make_scheduler(scheduler, **({} if scheduler else p.scheduler_opts)) if scheduler else \
        make_scheduler(p.scheduler, **p.scheduler_opts)
    c = make_cache(cache) if cache else make_cache(p.cache, **p.cache_opts)
    label = name if not (scheduler or cache) else f"{scheduler or p.scheduler}+{cache or p.cache}"
    return s, c, label


def describe_all() -> list[dict[str, str]]:
    """Rows for ``twin policies``."""
    load_entry_points()
    rows = []
    for kind, reg in (("scheduler", SCHEDULERS), ("cache", CACHES)):
        for n, cls in sorted(reg.items()):
            rows.append({"kind": kind, "name": n, "description": cls.description, "citation": cls.citation})
    for n, p in sorted(PRESETS.items()):
        rows.append({"kind": "preset", "name": n, "description": p.description or f"{p.scheduler} + {p.cache}",
                     "citation": p.citation})
    return rows


Factory = Callable[..., Any]
