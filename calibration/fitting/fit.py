"""``twin calibrate fit``: one profile from a directory of measurement tables (format detected)."""


from __future__ import annotations

from pathlib import Path
from typing import Any

from calibration.fitting.split64 import add_split64_and_mixed
from calibration.fitting.tables import detect_format
from calibration.fitting.vidur import fit_vidur
from calibration.fitting.vllm050 import fit_vllm050
from calibration.fitting.vllm085 import fit_vllm085


def fit_profile(measurements: str | Path, model: str, fmt: str = "auto", gpu: str = "a40",
                references: list[str] | None = None, vidur_dir: str | Path | None = None, k: int = 5,
                command: str = "", data_root: Path | None = None) -> dict[str, Any]:
    """Fit a profile of ``model`` from the tables in ``measurements`` (format detected when ``auto``)."""
    d = Path(measurements)
    fmt = detect_format(d) if fmt == "auto" else fmt
    if fmt == "vllm085":
        # the serving step's excess over the calibrated model (calibration.fitting.mixed), fitted to a fixed
        # point with the kernel grid's 64-split price (calibration.fitting.split64)
        return add_split64_and_mixed(fit_vllm085(d, model, command=command, k=k, data_root=data_root), d, k)
    if fmt == "vllm050":
        return fit_vllm050(d, model, command=command, k=k, data_root=data_root,
                           vidur_dir=Path(vidur_dir) if vidur_dir else None)
    if fmt == "vidur":
        return fit_vidur(d, model, gpu=gpu, command=command, references=references, k=k, data_root=data_root)
    raise ValueError(f"unknown measurement format {fmt!r}; use vllm085, vllm050 or vidur")


