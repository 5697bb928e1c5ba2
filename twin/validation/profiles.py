"""Which profile re-creates the runs, loaded once per process.

By default the calibrated vLLM 0.8.5 / H100 profile of the runs' model
(:func:`profile_for_model`); a profile that describes another model is refused
(:func:`check_profile_model`). :func:`cached_profile` keeps each loaded profile for the
process, so the worker processes of :mod:`twin.validation.runner` load it once each.
"""

from __future__ import annotations

import re

import pandas as pd

from twin.perf.profile import Profile, available_profiles, default_variant, load_profile

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


#: suffixes of a checkpoint name that do not change the model the profile describes
_VARIANT_SUFFIXES = ("-instruct", "-chat", "-hf")


def model_tag(model: str | None) -> str:
    """A model name as the profiles name it: ``Qwen/Qwen2.5-7B-Instruct``, ``qwen2.5-7b-instruct``
    and ``qwen-2.5-7b-instruct`` all give ``qwen-2.5-7b``; ``meta-llama/Meta-Llama-3.1-8B-Instruct``
    gives ``llama-3.1-8b`` (the organisation, a ``meta-`` prefix and the instruct/chat suffix go; a
    family name runs into its version with a hyphen)."""
    tag = str(model or "").strip().lower().rsplit("/", 1)[-1].replace("_", "-")
    for suf in _VARIANT_SUFFIXES:
        if tag.endswith(suf):
            tag = tag[: -len(suf)]
    tag = re.sub(r"^meta-", "", tag)
    return re.sub(r"(?<=[a-z])(?=\d)", "-", tag)


def _calibrated_profiles() -> list[str]:
    return sorted(n for n in available_profiles() if n.endswith("_h100_vllm085"))


def profile_for_model(model: str | None) -> str | None:
    """The calibrated vLLM 0.8.5 / H100 profile of ``model`` (``qwen-2.5-7b-instruct`` ->
    ``qwen-2.5-7b_h100_vllm085``; names normalised by :func:`model_tag`) when it is shipped, else None;
    its default variant where one is shipped (:func:`twin.perf.profile.default_variant`:
    ``llama-3.1-8b-instruct`` -> ``llama-3.1-8b_h100_vllm085_adaptercheck``)."""
    if not model or (isinstance(model, float) and model != model):
        return None
    name = f"{model_tag(model)}_h100_vllm085"
    avail = available_profiles()
    if not avail.get(name):
        return None
    variant = default_variant(name)
    return variant if avail.get(variant) else name


def profile_of_runs(sel: pd.DataFrame, profile: str | None, what: str = "the real runs") -> str:
    """The profile that re-creates the runs ``sel``: ``profile`` when given, else the calibrated profile
    of their ``model`` column (:func:`profile_for_model`). Without a ``model`` column, with an empty
    one or with a model no profile is calibrated for, an error naming the fix (before any run)."""
    if profile is not None:
        return profile
    avail = ", ".join(_calibrated_profiles())
    if "model" not in sel.columns or not sel["model"].notna().any():
        raise ValueError(f"{what} name no model (the 'model' column is {'missing' if 'model' not in sel.columns else 'empty'}): "
                         f"add it (e.g. llama-3.1-8b-instruct) or pass --profile (calibrated profiles: {avail})")
    models = sorted({str(m) for m in sel["model"].dropna().unique()})
    of = {m: profile_for_model(m) for m in models}
    found = set(of.values())
    if None in found:
        missing = [m for m, p in of.items() if p is None]
        raise ValueError(f"no calibrated profile for the model(s) {missing} of {what} (calibrated profiles: {avail}); "
                         f"pass --profile NAME_OR_JSON with a profile fitted for that model (twin calibrate fit)")
    if len(found) > 1:
        raise ValueError(f"{what} mix models {models} with different profiles ({sorted(found)}); select one model's "
                         f"runs (e.g. --filter \"model=='{models[0]}'\")")
    return found.pop()


def check_profile_model(prof: Profile, sel: pd.DataFrame) -> None:
    """Refuse a profile of another model than the selected runs' (names compared by :func:`model_tag`)."""
    if "model" not in sel.columns:
        return
    models = {str(m) for m in sel["model"].dropna().unique()}
    tag = model_tag(prof.model.name)
    bad = [m for m in models if model_tag(m) != tag]
    if bad:
        own = [n for n in (profile_for_model(m) for m in bad) if n]
        hint = (f"pass --profile {own[0]}, that model's calibrated profile" if len(set(own)) == 1 and len(own) == len(bad)
                else f"pass --profile with a profile fitted for that model (calibrated: {', '.join(_calibrated_profiles())})")
        raise ValueError(f"profile {prof.name!r} describes {prof.model.name}, but the runs are of {sorted(bad)}; {hint}")
