"""The notebooks run from top to bottom (skipped when Jupyter's kernel machinery is absent)."""

from __future__ import annotations

from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path):
    nbformat = pytest.importorskip("nbformat", reason="install the notebooks extra: pip install -e '.[notebooks]'")
    nbclient = pytest.importorskip("nbclient", reason="install the notebooks extra: pip install -e '.[notebooks]'")
    pytest.importorskip("ipykernel", reason="install the notebooks extra: pip install -e '.[notebooks]'")
    nb = nbformat.read(path, as_version=4)
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}}).execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors
