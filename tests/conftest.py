"""Shared fixtures. Tests that need the real data use ``real_data`` and skip when it is absent."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from traces.datadir import data_dir  # noqa: E402

try:  # property-based tests draw the same examples on every run (the suite is deterministic)
    from hypothesis import settings as _hypothesis_settings

    _hypothesis_settings.register_profile("lora-twin", derandomize=True, database=None)
    _hypothesis_settings.load_profile("lora-twin")
except ImportError:  # (hypothesis is in the test extra; a test module that needs it fails on its own)
    pass


@pytest.fixture(scope="session")
def real_data() -> Path:
    """The real data directory (``$TWIN_DATA_DIR``); skips the test when it is absent."""
    d = data_dir()
    if not (d / "README.md").exists():
        pytest.skip(f"real data not found in {d}: set TWIN_DATA_DIR to the shared data directory "
                    f"(CI points it at ../shared/data)")
    return d


@pytest.fixture(scope="session", autouse=True)
def shared_reproduction_points(tmp_path_factory):
    """One ``twin reproduce`` point cache for the session (``$TWIN_REPRODUCE_CACHE``, inherited by the
    notebook kernels): ``tests/reproduce`` and the reproduction notebooks run the same ``--quick``
    points, which are simulated once. The cache is keyed by the code's fingerprint, so a point is only
    ever reused by the code that made it; tests of re-run determinism switch it off. Under xdist the
    directory is the session's, shared by its workers (``tests/reproduce`` and the notebooks run on
    different ones; points are written atomically, so two workers computing one point is only work
    done twice)."""
    from twin.reproduce.point_cache import CACHE_ENV

    if os.environ.get(CACHE_ENV):
        yield
        return
    if os.environ.get("PYTEST_XDIST_WORKER"):  # the session's base directory (each worker's is below it)
        shared = tmp_path_factory.getbasetemp().parent / "reproduce-points"
        shared.mkdir(exist_ok=True)
        os.environ[CACHE_ENV] = str(shared)
    else:
        os.environ[CACHE_ENV] = str(tmp_path_factory.mktemp("reproduce-points"))
    try:
        yield
    finally:
        os.environ.pop(CACHE_ENV, None)
