"""How a reproduction is shown and kept: the console table, the files of ``--out`` and the
``README.md`` of ``twin reproduce all --out DIR``."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from twin.reproduce.base import Outcome, Row

HEAD = ("metric", "condition", "unit", "paper", "twin")


def _cell(v: Any) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


#: the issue's tolerance: within 10 percentage points (``%`` rows; 0.10 for ``x`` ratios, i.e. 10
#: points of the relative change)
TOLERANCE = {"%": 10.0, "x": 0.10}


def _bound(v: Any) -> tuple[str, float] | None:
    """``(">=", x)`` / ``("<=", x)`` for a twin value written as a bound, else None."""
    if isinstance(v, str) and v[:2] in (">=", "<="):
        try:
            return v[:2], float(v[2:])
        except ValueError:
            return None
    return None


def verdict(r: Row) -> str:
    """Whether the twin's value meets the paper's: ``yes``/``no`` within :data:`TOLERANCE` for
    relative rows, the same answer for findings; ``n/a`` for absolute rates and times (another
    GPU, model and scale than the paper's) and for unmeasured rows. A bound (``">= x"``, a mean with a
    point cut before its backlog drained) is ``no`` when it lies wholly outside the band, else ``n/a``."""
    if r.verdict_override:
        return r.verdict_override
    if r.twin is None:
        return "n/a"
    bound = _bound(r.twin)
    if bound is not None and r.unit in TOLERANCE and isinstance(r.paper, (int, float)):
        # a bound (">= x": the full run's value is at least x): "no" once it excludes the band
        op, x = bound
        outside = x > r.paper + TOLERANCE[r.unit] if op == ">=" else x < r.paper - TOLERANCE[r.unit]
        return "no" if outside else "n/a"
    if isinstance(r.paper, str):
        return "yes" if r.paper == r.twin else ("n/a" if r.unit else "no")
    if r.unit in TOLERANCE and isinstance(r.twin, (int, float)):
        return "yes" if abs(r.twin - r.paper) <= TOLERANCE[r.unit] else "no"
    return "n/a"


def table_lines(rows: list[Row], markdown: bool = False) -> list[str]:
    """The rows as aligned text (or a Markdown table, with the :func:`verdict` of each row)."""
    cells = [list(HEAD)] + [[r.metric, r.condition, r.unit, _cell(r.paper), _cell(r.twin)] for r in rows]
    if markdown:
        out = ["| " + " | ".join(cells[0]) + " | within 10 points |",
               "|" + "|".join(["---"] * 3 + ["---:"] * 2 + ["---"]) + "|"]
        return out + ["| " + " | ".join(c) + f" | {verdict(r)} |" for c, r in zip(cells[1:], rows)]
    w = [max(len(c[i]) for c in cells) for i in range(len(HEAD))]
    lines = ["  ".join(c[i].rjust(w[i]) if i >= 3 else c[i].ljust(w[i]) for i in range(len(HEAD))).rstrip()
             for c in cells]
    lines.insert(1, "-" * len(lines[0]))
    return lines


def format_outcome(o: Outcome) -> str:
    """Title, table and notes of one reproduction, as the console shows them."""
    subs = o.setup.get("substitutions") or {}
    lines = [f"{o.name}: {o.title} [{o.setup.get('variant', 'full')}]", *table_lines(o.rows)]
    lines += [f"note: {n}" for n in o.notes]
    lines += [f"stand-in: {a} is not registered; used {b}" for a, b in subs.items()]
    return "\n".join(lines)


def summary(o: Outcome) -> dict[str, Any]:
    """``summary.json``: the JSON of ``--json`` plus each row's source, the set-up and the notes."""
    return {**o.as_json(), "title": o.title, "sources": [r.source for r in o.rows], "setup": o.setup,
            "notes": o.notes}


def write_outcome(o: Outcome, figure: Callable[[Outcome], Any], out: Path) -> list[Path]:
    """Write ``rows.parquet``, ``rows.csv``, ``points.csv`` (every simulated point),
    ``summary.json`` and ``figure.png`` into ``out``; returns the paths."""
    out.mkdir(parents=True, exist_ok=True)
    rows = pd.DataFrame([{**r.as_json(), "source": r.source} for r in o.rows])
    for col in ("paper", "twin"):  # numbers and findings ("yes", "12-13") in one column: keep them as text
        rows[col] = rows[col].map(_cell)
    paths = [out / "rows.parquet", out / "rows.csv", out / "points.csv", out / "summary.json", out / "figure.png"]
    rows.to_parquet(paths[0], index=False)
    rows.to_csv(paths[1], index=False)
    pd.DataFrame(o.points).to_csv(paths[2], index=False)
    paths[3].write_text(json.dumps(summary(o), indent=2, default=str) + "\n")
    figure(o).savefig(paths[4], dpi=100)  # a matplotlib Figure built without pyplot (no global state)
    return paths


def readme(outcomes: list[Outcome], command: str, engine_note: str) -> str:
    """``README.md`` of a results directory: per reproduction, the command, the table (ours beside
    the paper's), the notes, the stand-ins and the figure."""
    lines = ["# Reproductions of the seed papers' results", "",
             f"Generated by `{command}` (do not edit by hand; rerun it after changing the twin).", "",
             engine_note, "",
             "Each table puts the paper's number beside the twin's. Paper numbers are only printed, never used as "
             "inputs: loads are placed relative to the twin's own knee and SLOs follow the papers' definitions on "
             "the twin's own measurements (`twin/reproduce/`, module docstrings). The last column applies the "
             "issue's target: within 10 percentage points for relative rows (0.10 for ratios), the same answer for "
             "findings, n/a for absolute rates and times (another GPU, model and scale than the paper's); a "
             "verdict with a reason overrides the test where it would mislead (rows whose runs do not exercise "
             "what they compare, a mean whose parts differ in sign from the paper's). One reproduction alone: "
             "`twin reproduce NAME [--quick] [--out DIR] [--json]`; `twin reproduce --list` names them.", ""]
    for o in outcomes:
        variant = o.setup.get("variant", "full")
        lines += [f"## {o.name}", "", o.title, "",
                  f"`twin reproduce {o.name}{' --quick' if variant == 'quick' else ''} --out DIR`", ""]
        lines += table_lines(o.rows, markdown=True)
        lines.append("")
        lines += [f"- {n}" for n in o.notes]
        by_system: dict[str, list[str]] = {}
        for p, system in (o.setup.get("presets") or {}).items():
            by_system.setdefault(system, []).append(p)
        for system, presets in by_system.items():
            lines.append(f"- on {system}: " + ", ".join(f"`{p}`" for p in presets))
        for a, b in (o.setup.get("substitutions") or {}).items():
            lines.append(f"- stand-in: `{a}` is not registered on this branch; `{b}` was used")
        lines += ["- sources: " + "; ".join(dict.fromkeys(r.source for r in o.rows)), "",
                  f"![{o.name}]({o.name}/figure.png)", ""]
    return "\n".join(lines)
