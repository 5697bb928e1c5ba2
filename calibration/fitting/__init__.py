"""Fitting LoRA Twin profiles from calibration measurements.

* :mod:`.core` -- ``curve_fit`` wrapper (bounds, initial guesses, standard errors), R^2 /
  MAPE, deterministic grouped k-fold held-out scoring, form selection;
* :mod:`.tables` -- reading the vLLM 0.8.5 tables and turning ~2 s windows into observations;
* :mod:`.components` -- the five component fits with their candidate forms;
* :mod:`.vllm085`, :mod:`.vllm050`, :mod:`.vidur` -- one profile builder per data source;
* :mod:`.peer` -- the published twin's models, scored on the same observations;
* :mod:`.synthetic` -- measurement tables generated from known constants (recovery tests);
* :mod:`.profile_io` -- provenance, validation and writing of the JSON files.

:func:`fit_profile` is the entry point of ``twin calibrate fit``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def fit_profile(measurements: str | Path, model: str, fmt: str = "auto", gpu: str = "a40",
                references: list[str] | None = None, vidur_dir: str | Path | None = None, k: int = 5,
                command: str = "", data_root: Path | None = None) -> dict[str, Any]:
    """Fit a profile of ``model`` from the tables in ``measurements`` (format detected when ``auto``)."""
    from calibration.fitting.tables import detect_format

    d = Path(measurements)
    fmt = detect_format(d) if fmt == "auto" else fmt
    if fmt == "vllm085":
        from calibration.fitting.vllm085 import fit_vllm085
        return fit_vllm085(d, model, command=command, k=k, data_root=data_root)
    if fmt == "vllm050":
        from calibration.fitting.vllm050 import fit_vllm050
        return fit_vllm050(d, model, command=command, k=k, data_root=data_root,
                           vidur_dir=Path(vidur_dir) if vidur_dir else None)
    if fmt == "vidur":
        from calibration.fitting.vidur import fit_vidur
        return fit_vidur(d, model, gpu=gpu, command=command, references=references, k=k, data_root=data_root)
    raise ValueError(f"unknown measurement format {fmt!r}; use vllm085, vllm050 or vidur")


__all__ = ["fit_profile"]
