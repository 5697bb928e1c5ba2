"""The notebooks run from top to bottom with ``nbclient`` (as ``jupyter execute`` does), show
their figures inline, and the text they print is the text committed with them.

The notebooks print every statement they make about a result (computed from the numbers), and
the committed notebook carries its outputs; a fresh execution must print the same lines, so the
committed text cannot drift from what the code computes. After a change that is meant to move
the results, re-execute: ``jupyter execute --inplace notebooks/NAME.ipynb`` (from the repository
root, with ``pip install -e '.[notebooks]'``). Skipped when Jupyter's kernel machinery is absent.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))
REASON = "install the notebooks (or test) extra: pip install -e '.[notebooks]'"


def _stdout(nb) -> list[str]:
    """The printed lines of every code cell, cell by cell."""
    out = []
    for i, c in enumerate(nb.cells):
        if c.cell_type == "code":
            text = "".join(o.get("text", "") for o in c.get("outputs", [])
                           if o.output_type == "stream" and o.get("name") == "stdout")
            out.append((i, text))
    return out


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs_and_matches_its_text(path):
    nbformat = pytest.importorskip("nbformat", reason=REASON)
    nbclient = pytest.importorskip("nbclient", reason=REASON)
    pytest.importorskip("ipykernel", reason=REASON)
    committed = nbformat.read(path, as_version=4)
    source = "\n".join(c.source for c in committed.cells if c.cell_type == "code")
    assert "matplotlib.use(" not in source, "a notebook must not switch the backend: its figures would not show"
    nb = copy.deepcopy(committed)
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}}).execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors, "\n".join(f"{e.ename}: {e.evalue}" for e in errors)
    figures = sum("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code"
                  for o in c.get("outputs", []))
    if re.search(r"figure|plt\.|display\(", source):
        assert figures, "the notebook draws figures but none was displayed inline"
    stale = [(i, want, got) for (i, want), (_, got) in zip(_stdout(committed), _stdout(nb)) if want != got]
    assert not stale, (f"{path.name}: the committed outputs differ from a fresh run (cells "
                       f"{[i for i, _, _ in stale]}; first: committed {stale[0][1]!r}, now {stale[0][2]!r}); "
                       f"re-execute it: jupyter execute --inplace notebooks/{path.name}")
