"""The built-in schedulers and adapter-cache policies, pluggable by name (see ``twin.registry``).

This package registers itself through the entry-point group ``lora_twin.policies``
(``builtin = "policies"`` in ``pyproject.toml``), exactly as a third-party package does; the
core never imports it. Adding a policy here: write one module that subclasses
:class:`twin.interfaces.Scheduler` or :class:`twin.interfaces.AdapterCachePolicy`, decorate
it with ``@register_scheduler`` / ``@register_cache`` and import it below.

Modules: ``fcfs``/``lru`` (vLLM 0.8.5), ``slora`` (S-LoRA scheduler, ``none`` cache),
``sjf`` (muServe-style SJF with aging), ``chameleon`` (Chameleon's scheduler, cache and
variants), ``adapter_aware`` (vLLM v1 adapter-aware extension), ``caches`` (LFU, GDSF,
EMA prefetch, contiguous/paged placement presets), ``fastlibra`` (FastLibra and its
ablations and baselines); ``common`` holds the output-length predictor and statistics.
``twin policies`` lists everything with citations.
"""

from policies import fcfs, lru  # noqa: F401,E402  (registration side effects)
from policies import (adapter_aware, caches, chameleon, fastlibra, sjf,  # noqa: F401,E402
                      slora)
from policies import client_cap  # noqa: F401,E402

# Chameleon is built on S-LoRA (MICRO'25 §5): its presets run on the S-LoRA engine (twin/slora_engine.py)
import dataclasses as _dc  # noqa: E402

from twin.registry import PRESETS as _PRESETS  # noqa: E402

for _name in [n for n in _PRESETS if n.startswith("chameleon")]:
    _PRESETS[_name] = _dc.replace(_PRESETS[_name], system="slora")
