"""Every command of the README's ``bash`` blocks runs, and the metric glossary covers the summary.

Each command line of a fenced ``bash`` block (continuations joined, comments dropped) is one
test case. ``twin ...`` commands run in-process (``twin.cli.main``) in a temporary working
directory, shortened so the suite stays fast: ``--duration`` at most :data:`SHORT_S` seconds for
``run`` and ``compare``, ``--limit 2`` for ``validate``; no progress bars. A command that needs
the real data directory skips (with the reason) when it is absent. Installation lines are
checked against ``pyproject.toml`` (the extras they name exist), ``pytest`` is this suite,
``jupyter execute`` is ``tests/test_notebooks.py``. Any other line fails: the README must not
show a command nobody runs.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import tomllib
from contextlib import redirect_stdout
from io import StringIO
from pathlib import Path

import pytest

from traces.datadir import data_dir
from traces.registry import BUILTINS

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
#: longest simulated arrival window a README command runs with in the test (s)
SHORT_S = 20.0


def readme_commands(text: str) -> list[str]:
    """The command lines of the fenced ``bash`` blocks: continuations joined, comments and
    prompts dropped, ``a && b`` split into two commands."""
    cmds = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if not line or line.startswith("#"):
                continue
            cmds += [c.strip() for c in line.split("&&") if c.strip()]
    return cmds


COMMANDS = readme_commands(README.read_text())


def _argv(cmd: str) -> list[str]:
    argv = shlex.split(os.path.expandvars(cmd.replace("$TWIN_DATA_DIR", str(data_dir()))))
    if argv[:3] in (["python3", "-m", "twin"], ["python", "-m", "twin"]):
        argv = ["twin"] + argv[3:]
    return argv


def _set_option(argv: list[str], flag: str, value: str, cap: float | None = None) -> list[str]:
    """``flag value`` in ``argv``: added, or lowered to ``cap`` when given larger."""
    if flag in argv:
        i = argv.index(flag) + 1
        if cap is not None and float(argv[i]) > cap:
            argv[i] = value
        return argv
    return argv + [flag, value]


def _needs_data(argv: list[str], cmd: str) -> str | None:
    """The file of the data directory a command reads, when it reads one."""
    root = data_dir()
    if "$TWIN_DATA_DIR" in cmd:
        for a in argv:
            if a.startswith(str(root)):
                return a
    for a in argv[1:]:  # a real trace named by --trace or by `twin traces show NAME`
        spec = BUILTINS.get(a)
        if spec is not None and spec.file:
            return str(root / spec.file)
    if argv[1:3] in (["calibrate", "replay"], ["calibrate", "fit"]):
        return str(root / "calibration")
    return None


def _run_twin(argv: list[str]) -> tuple[int, str]:
    from twin.cli import main

    buf = StringIO()
    with redirect_stdout(buf):
        rc = main(argv[1:])
    return rc, buf.getvalue()


@pytest.mark.parametrize("cmd", COMMANDS)
def test_readme_command(cmd, tmp_path, monkeypatch):
    argv = _argv(cmd)
    if argv[:3] in (["python3", "-m", "pip"], ["python", "-m", "pip"]) or argv[0] == "pip":
        extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
        for spec in argv:
            m = re.match(r"^\.?\[(.*)\]$", spec.strip("'\"").lstrip("."))
            if m:
                missing = set(m.group(1).split(",")) - extras
                assert not missing, f"README installs extras {missing} that pyproject.toml does not define"
        return
    if argv[:3] in (["python3", "-m", "pytest"], ["python", "-m", "pytest"]):
        return  # this suite
    if argv[:2] == ["jupyter", "execute"]:
        for a in argv[2:]:
            if a.endswith(".ipynb"):
                assert (ROOT / a).exists(), f"README runs {a}, which does not exist"
        return  # executed by tests/test_notebooks.py
    assert argv[0] == "twin", f"the README shows a command this test does not know how to run: {cmd!r}"
    sub = argv[1] if len(argv) > 1 else None
    if sub == "traces" and len(argv) > 2 and argv[2] == "fetch":
        pytest.skip("downloads from the network")
    if sub == "calibrate" and len(argv) > 2 and argv[2] == "bench" and "cuda" in argv:
        pytest.importorskip("torch")
        import torch

        if not torch.cuda.is_available():
            pytest.skip("needs a CUDA GPU")
    need = _needs_data(argv, cmd)
    if need and not Path(need).exists():
        pytest.skip(f"needs {need} (set TWIN_DATA_DIR to the data directory)")
    if sub in ("run", "compare"):
        argv = _set_option(argv, "--duration", str(SHORT_S), cap=SHORT_S)
    if sub == "run":
        argv += ["--no-progress"]
    if sub == "compare":
        argv = _set_option(argv, "--jobs", "1", cap=1) + ["--no-progress"]
    if sub == "validate":
        argv = _set_option(argv, "--limit", "2", cap=2) + ["--no-progress"] + (["--no-figures"] if "--out" in argv else [])
        argv = _set_option(argv, "--jobs", "1", cap=1)
    monkeypatch.chdir(tmp_path)
    rc, out = _run_twin(argv)
    assert rc == 0, f"`{' '.join(argv)}` exited {rc}:\n{out}"
    if sub == "run" and "--out" in argv:
        out_dir = tmp_path / argv[argv.index("--out") + 1]
        assert (out_dir / "summary.json").exists() and (out_dir / "requests.parquet").exists()
        if "--plot" in argv:
            assert (out_dir / "latency.png").exists() and (out_dir / "timeline.png").exists()
    if sub == "compare" and "--out" not in argv:
        assert not (tmp_path / "results").exists(), "twin compare wrote into results/ of the working directory"


def test_readme_has_commands():
    """The parser finds the README's commands (a test of the test)."""
    assert any(c.startswith("twin run") for c in COMMANDS)
    assert "twin run --trace splitwise --policy chameleon" in COMMANDS


def _glossary_keys(text: str) -> set[str]:
    section = text.split("## Metrics", 1)[1].split("\n## ", 1)[0]
    keys: set[str] = set()
    for cell in re.findall(r"^\| *([^|]+?) *\|", section, flags=re.M):
        for name in re.findall(r"`([a-z0-9_{},|*()]+)`", cell):
            # `ttft_ms_{mean,p50,p90,p99}` expands to four keys
            m = re.match(r"^(.*)\{(.*)\}(.*)$", name)
            keys |= {m.group(1) + v + m.group(3) for v in m.group(2).split(",")} if m else {name}
    return keys


@pytest.mark.parametrize("args", [
    ["run", "--ttft-slo", "0.5", "--tbt-slo", "0.05"],
    ["run", "--policy", "chameleon+prefetch"],
    ["run", "--policy", "vllm-paged"],
    ["run", "--trace", "multiturn-synth", "--policy", "fastlibra"],
], ids=["slo", "chameleon+prefetch", "vllm-paged", "fastlibra"])
def test_glossary_covers_every_summary_key(args):
    """Every key of ``twin run --json`` (core, SLO, extension and policy counters) is defined in
    the README's Metrics glossary."""
    rc, out = _run_twin(["twin", *args, "--duration", "15", "--json", "--no-progress"])
    assert rc == 0
    keys = set(json.loads(out))
    missing = keys - _glossary_keys(README.read_text())
    assert not missing, f"summary keys missing from the README's Metrics glossary: {sorted(missing)}"
