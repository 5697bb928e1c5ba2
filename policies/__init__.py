"""Schedulers and adapter-cache policies, pluggable by name (see ``policies.registry``).

Adding a policy: write one module that subclasses :class:`twin.interfaces.Scheduler` or
:class:`twin.interfaces.AdapterCachePolicy` and decorates it with
``@register_scheduler`` / ``@register_cache``; import it from ``policies/__init__.py``, or
expose it from another package through the entry-point group ``lora_twin.policies``.

Modules: ``fcfs``/``lru`` (vLLM 0.8.5), ``slora`` (S-LoRA scheduler, ``none`` cache),
``sjf`` (muServe-style SJF with aging), ``chameleon`` (Chameleon's scheduler, cache and
variants), ``adapter_aware`` (vLLM v1 adapter-aware extension), ``caches`` (LFU, GDSF,
EMA prefetch, contiguous/paged placement presets), ``fastlibra`` (FastLibra and its
ablations and baselines); ``common`` holds the output-length predictor and statistics.
``twin policies`` lists everything with citations.
"""

from policies.registry import (PRESETS, make_cache, make_scheduler, register_cache, register_preset,  # noqa: F401
                               register_scheduler, resolve_policy)
from policies import fcfs, lru  # noqa: F401,E402  (registration side effects)
from policies import (adapter_aware, caches, chameleon, fastlibra, sjf,  # noqa: F401,E402
                      slora)
