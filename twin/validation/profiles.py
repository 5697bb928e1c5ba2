"""Which profile re-creates the runs, loaded once per process.

By default the calibrated vLLM 0.8.5 / H100 profile of the runs' model
(:func:`profile_for_model`); a profile that describes another model is refused
(:func:`check_profile_model`). :func:`cached_profile` keeps each loaded profile for the
process, so the worker processes of :mod:`twin.validation.runner` load it once each.
"""

from __future__ import annotations

import pandas as pd

from twin.perf.profile import Profile, available_profiles, load_profile

_PROFILES: dict[str, Profile] = {}


def cached_profile(name: str | None) -> Profile:
    """:func:`twin.perf.profile.load_profile` of ``name``, once per process. A profile given as a
    JSON file is also found under its own name afterwards (the summary's diagnostics look it up
    by name)."""
    key = name or ""
    if key not in _PROFILES:
        p = _PROFILES[key] = load_profile(name)
        _PROFILES.setdefault(p.name, p)
    return _PROFILES[key]


def profile_for_model(model: str | None) -> str | None:
    """The calibrated vLLM 0.8.5 / H100 profile of ``model`` (``qwen-2.5-7b-instruct`` ->
    ``qwen-2.5-7b_h100_vllm085``) when it is shipped, else None (the default profile)."""
    if not model:
        return None
    tag = str(model).lower().replace("-instruct", "")
    avail = available_profiles()
    for name in (f"{tag}_h100_vllm085",):
        if avail.get(name):
            return name
    return None


def check_profile_model(prof: Profile, sel: pd.DataFrame) -> None:
    """Refuse a profile of another model than the selected runs'."""
    models = {str(m).lower() for m in sel["model"].dropna().unique()}
    tag = prof.model.name.lower().replace("-instruct", "")
    bad = [m for m in models if tag not in m.replace("-instruct", "")]
    if bad:
        raise ValueError(f"profile {prof.name!r} describes {prof.model.name}, but the runs are of {sorted(bad)}; "
                         f"pass --profile with that model's calibrated profile")
