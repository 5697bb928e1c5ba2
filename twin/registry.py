"""Registries of schedulers, adapter-cache policies and presets (scheduler + cache).

Adding a policy takes one file: subclass :class:`twin.interfaces.Scheduler` or
:class:`twin.interfaces.AdapterCachePolicy`, give it ``name``, ``description`` and
``citation``, decorate it with :func:`register_scheduler` / :func:`register_cache`, and
optionally :func:`register_preset` a system that uses it. The registry lives in the core
and never imports a policy package: policies arrive through the entry-point group
``lora_twin.policies``, the built-in ones (``policies/``) exactly as a third-party package's::

    [project.entry-points."lora_twin.policies"]
    builtin = "policies"                 # this project's pyproject.toml
    mypolicy = "mypkg.mypolicy"          # a module that registers on import
    other = "mypkg.other:register"       # or a callable that registers

Every cache policy also accepts the engine-memory options :data:`MEMORY_OPTS` (e.g.
``adapter_memory="unified"``) as constructor arguments -- its ``__init__`` takes ``**memory``
and passes them to :class:`twin.interfaces.AdapterCachePolicy` -- so a preset can put any
cache into S-LoRA's unified pool.
"""

from __future__ import annotations

import copy
import inspect
import types
import warnings
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, Callable, Mapping

from traces.arguments import did_you_mean
from twin.interfaces import (AdapterCachePolicy, PolicyError, Scheduler, check_option_kinds, check_policy_class,
                             check_policy_name, is_builtin, name_unusable)

SCHEDULERS: dict[str, type[Scheduler]] = {}
CACHES: dict[str, type[AdapterCachePolicy]] = {}
#: constructor arguments of every cache policy that configure the engine's memory
#: (:class:`twin.interfaces.AdapterCachePolicy`; used by ``twin/extensions.py``)
MEMORY_OPTS = ("adapter_memory", "adapter_placement", "prefix_kv", "lora_share", "history_to_host", "prefetch_sync")


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
    #: the serving system its paper builds on (:data:`SYSTEMS`): the engine it runs on
    system: str = "vllm"


#: serving systems: the engine each runs (``twin.simulate.ENGINES``)
SYSTEMS = {"vllm": "vLLM 0.8.5 v1 engine (twin/engine.py)", "slora": "S-LoRA router and unified pool (twin/slora_engine.py)"}


def resolve_system(policy: str | None = None, system: str | None = None) -> str:
    """``system`` when given, else the preset's (``vllm`` without a preset); ``KeyError``
    naming the choices for an unknown one."""
    if system is None:
        load_entry_points()
        p = PRESETS.get(policy or "vllm")
        system = p.system if p is not None else "vllm"
    if system not in SYSTEMS:
        raise KeyError(f"unknown serving system {system!r}{did_you_mean(system, SYSTEMS)}; choose one of "
                       f"{', '.join(SYSTEMS)} (--system)")
    return system


PRESETS: dict[str, Preset] = {}
_entry_points_loaded = False


def _register(cls: Any, kind: str, reg: dict[str, type]) -> None:
    """Validate ``cls`` (:func:`twin.interfaces.check_policy_class`, its name) and add it to ``reg``.
    A name another class holds is refused (a class redefined under the same module and name, e.g.
    a re-run notebook cell, replaces itself)."""
    if isinstance(cls, type):
        check_policy_name(cls)
    check_policy_class(cls, kind)
    name = cls.name
    old = reg.get(name)
    if old is not None and old is not cls and (old.__module__, old.__qualname__) != (cls.__module__, cls.__qualname__):
        builtin = " (built in)" if is_builtin(old) else ""
        raise PolicyError(f"{kind} name {name!r} of {cls.__module__}.{cls.__qualname__} is already registered by "
                          f"{old.__module__}.{old.__qualname__}{builtin}; give {cls.__qualname__} another `name`")
    reg[name] = cls


def register_scheduler(cls: type[Scheduler]) -> type[Scheduler]:
    """Class decorator: register a scheduler under its ``name`` (validated: :class:`PolicyError`)."""
    _register(cls, "scheduler", SCHEDULERS)
    return cls


def register_cache(cls: type[AdapterCachePolicy]) -> type[AdapterCachePolicy]:
    """Class decorator: register an adapter-cache policy under its ``name`` (validated: :class:`PolicyError`)."""
    _register(cls, "cache", CACHES)
    return cls


def register_preset(preset: Preset) -> Preset:
    """Register a named system (validated: its name, its serving system, a name another preset holds)."""
    if not isinstance(preset, Preset):
        raise PolicyError(f"{preset!r} is not a twin.registry.Preset; register Preset(name, scheduler, cache, ...)")
    name = preset.name
    if not isinstance(name, str) or not name or name_unusable(name):
        raise PolicyError(f"preset name {name!r}: give a non-empty name without spaces, commas or '=' "
                          f"(--policy NAME must be able to name it)")
    for part in ("scheduler", "cache"):
        v = getattr(preset, part)
        if not isinstance(v, str) or not v:
            raise PolicyError(f"preset {name!r}: {part} {v!r} is not a {part} name; give the name a "
                              f"{'register_scheduler' if part == 'scheduler' else 'register_cache'} class holds, "
                              f"e.g. {'fcfs' if part == 'scheduler' else 'lru'!r}")
    for part in ("scheduler_opts", "cache_opts"):
        v = getattr(preset, part)
        if not isinstance(v, dict) or not all(isinstance(k, str) for k in v):
            raise PolicyError(f"preset {name!r}: {part} {v!r} is not a dict of keyword arguments (names to values)")
    for part in ("description", "citation"):
        if not isinstance(getattr(preset, part), str):
            raise PolicyError(f"preset {name!r}: {part} {getattr(preset, part)!r} is not a string")
    if preset.system not in SYSTEMS:
        raise PolicyError(f"preset {name!r}: unknown serving system {preset.system!r}; choose one of "
                          f"{', '.join(SYSTEMS)}")
    old = PRESETS.get(name)
    if old is not None and old != preset:
        raise PolicyError(f"preset name {name!r} is already registered ({old.scheduler} + {old.cache}); give the "
                          f"new preset another name")
    PRESETS[name] = preset
    return preset


def load_entry_points() -> None:
    """Import third-party policies declared under the ``lora_twin.policies`` group."""
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    eps = list(metadata.entry_points(group="lora_twin.policies"))
    if not eps:
        raise RuntimeError("no policy package is installed under the entry-point group lora_twin.policies; "
                           "install the project (`python3 -m pip install -e .`) so the built-in policies register")
    for ep in eps:
        try:
            obj = ep.load()
        except Exception as e:  # a broken third-party package must not break the twin
            warnings.warn(f"entry point {ep.name!r} of group lora_twin.policies failed to load: {e}")
            continue
        try:
            if isinstance(obj, type) and issubclass(obj, Scheduler):
                register_scheduler(obj)
            elif isinstance(obj, type) and issubclass(obj, AdapterCachePolicy):
                register_cache(obj)
            elif isinstance(obj, Preset):
                register_preset(obj)
            elif callable(obj):
                obj()
            elif not isinstance(obj, types.ModuleType):  # (a module registers its policies on import)
                raise PolicyError(f"{obj!r} is not a Scheduler or AdapterCachePolicy class, a Preset or a callable "
                                  f"that registers policies")
        except PolicyError as e:  # a malformed plug-in is refused, the others still load
            warnings.warn(f"entry point {ep.name!r} of group lora_twin.policies was refused: {e}")


def _unknown(kind: str, name: str, known: dict) -> KeyError:
    return KeyError(f"unknown {kind} {name!r}; available: {', '.join(sorted(known))} "
                    f"(`twin policies` lists them with descriptions)")


def _construct(kind: str, name: str, cls: type, opts: dict[str, Any]) -> Any:
    """``cls(**opts)``; an option its constructor does not take is a :class:`PolicyError` naming the
    policy and the options it takes (not Python's bare ``__init__() got an unexpected keyword``)."""
    try:
        sig = inspect.signature(cls)
    except (TypeError, ValueError):  # pragma: no cover - a class without a readable signature
        return cls(**opts)
    params = sig.parameters.values()
    takes: list[str] | None = None
    if not any(p.kind is p.VAR_KEYWORD for p in params):
        takes = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    elif isinstance(getattr(cls, "_param_names", None), Callable):  # **memory passed on: the names along the MRO
        takes = cls._param_names()
    if takes is not None:
        unknown = [k for k in opts if k not in takes]
        if unknown:
            raise PolicyError(f"{kind} {name!r} takes no option(s) {', '.join(map(repr, unknown))}; its options: "
                              f"{', '.join(takes) or 'none'}")
    check_option_kinds(cls, opts, f"{kind} {name!r} ({cls.__qualname__})")
    try:
        return cls(**opts)
    except TypeError as e:
        if "unexpected keyword argument" not in str(e):
            raise
        raise PolicyError(f"{kind} {name!r}: {e}; check the option names of {cls.__qualname__}") from None


def make_scheduler(name: str, /, **opts: Any) -> Scheduler:
    load_entry_points()
    if name not in SCHEDULERS:
        raise _unknown("scheduler", name, SCHEDULERS)
    return _construct("scheduler", name, SCHEDULERS[name], opts)


def make_cache(name: str, /, **opts: Any) -> AdapterCachePolicy:
    load_entry_points()
    if name not in CACHES:
        raise _unknown("adapter-cache policy", name, CACHES)
    return _construct("adapter-cache policy", name, CACHES[name], opts)


def resolve_policy(policy: str | None = None, scheduler: str | None = None,
                   cache: str | None = None, scheduler_opts: dict[str, Any] | None = None,
                   cache_opts: dict[str, Any] | None = None) -> tuple[Scheduler, AdapterCachePolicy, str]:
    """``--policy`` preset, optionally overridden by ``--scheduler`` / ``--cache``; ``scheduler_opts`` /
    ``cache_opts`` (``--scheduler-opt`` / ``--cache-opt``) are constructor arguments of the scheduler and
    the cache, over the preset's own."""
    load_entry_points()
    name = policy or "vllm"
    if name not in PRESETS:
        raise KeyError(f"unknown policy {name!r}{did_you_mean(name, PRESETS)}; available presets: "
                       f"{', '.join(sorted(PRESETS))}; "
                       f"or mix with --scheduler ({', '.join(sorted(SCHEDULERS))}) and --cache "
                       f"({', '.join(sorted(CACHES))})")
    p = PRESETS[name]
    # (the preset's options are copied: a policy that keeps and changes a list it was given does not change
    # the preset for the next run)
    for flag, opts in (("scheduler_opts", scheduler_opts), ("cache_opts", cache_opts)):
        if opts is not None and not (isinstance(opts, Mapping) and all(isinstance(k, str) for k in opts)):
            raise TypeError(f"{flag} {opts!r}: give the policy's constructor arguments as a dict of names to values, "
                            f"e.g. {{'max_wait_s': 2.0}} (None: the preset's own)")
    s_opts, c_opts = dict(scheduler_opts or {}), dict(cache_opts or {})
    preset_s, preset_c = copy.deepcopy(p.scheduler_opts), copy.deepcopy(p.cache_opts)
    s = make_scheduler(scheduler, **s_opts) if scheduler else make_scheduler(p.scheduler, **{**preset_s, **s_opts})
    if cache:  # the preset's memory set-up stays (e.g. S-LoRA's unified pool)
        c = make_cache(cache, **{**{k: v for k, v in preset_c.items() if k in MEMORY_OPTS and k != "prefetch_sync"},
                                 **c_opts})
    else:
        c = make_cache(p.cache, **{**preset_c, **c_opts})
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
                     "citation": p.citation, "system": p.system})
    return rows

