"""GPU microbenchmark harness (``twin calibrate bench``): measures the tables ``fit`` consumes.

Importing this package (and :mod:`calibration.bench.cli`, :mod:`.config`, :mod:`.schema`)
never imports torch, triton or safetensors: they are the optional ``calibration`` extra and
are imported only when a bench runs (:func:`require_torch`; the entry point is
:func:`calibration.bench.harness.run_bench`). Modules that need them
(``kernels``, ``timing``, ``linear_ops``, ``lora``, ``transfer``, ``harness``) import them at
their top and are themselves imported lazily.
"""

from __future__ import annotations

import importlib
from typing import Any

INSTALL_HINT = "install the calibration extra: pip install -e '.[calibration]'"


class BenchDependencyError(ImportError):
    """torch / triton / safetensors is missing for the bench."""


def require(module: str, what: str) -> Any:
    """Import ``module`` or raise :class:`BenchDependencyError` with the install hint."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise BenchDependencyError(f"the calibration bench needs {what} ({module} could not be imported: {e}); "
                                   f"{INSTALL_HINT}") from e


def require_torch() -> Any:
    return require("torch", "torch")


__all__ = ["BenchDependencyError", "INSTALL_HINT", "require", "require_torch"]
