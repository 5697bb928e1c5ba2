"""Schedulers and adapter-cache policies, pluggable by name (see ``policies.registry``).

Adding a policy: write one module that subclasses :class:`twin.interfaces.Scheduler` or
:class:`twin.interfaces.AdapterCachePolicy` and decorates it with
``@register_scheduler`` / ``@register_cache``; import it from ``policies/__init__.py``, or
expose it from another package through the entry-point group ``lora_twin.policies``.
"""

from policies.registry import (PRESETS, make_cache, make_scheduler, register_cache, register_preset,  # noqa: F401
                               register_scheduler, resolve_policy)
from policies import fcfs, lru  # noqa: F401,E402  (registration side effects)
