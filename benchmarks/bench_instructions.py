"""Instructions the twin executes to simulate the reference hour: a speed figure that a shared machine's noise does not move.

Wall-clock figures (``bench_speed.py``, ``bench_mix.py``) swing by 15-25 % on a shared 2-core machine, more
than most single changes to the engine's hot path gain or lose. This script counts the instructions instead,
under Valgrind's ``callgrind`` (``apt install valgrind``): the same code gives the same count in every run,
so a before/after comparison of a change needs one run of each, in any order, on any machine load. (A change
off the engine's path can still move the count by a few tenths of a percent: the interpreter's dictionaries
and memory layout differ.) It is a relative figure (instructions are not seconds: the interpreter's cache behaviour and
the CPU decide how long they take), so the issue's targets stay wall-clock ones, measured by
``bench_speed.py`` on a quiet machine.

The workload is ``bench_speed.py``'s (the same generator, seed and engine configuration), simulated for
``--horizon`` seconds (default 900: under a minute under Valgrind; 3600 is the whole hour). A child process
loads the workload, simulates its first second (a warm-up: the modules a run imports on first use, not counted)
and then the horizon, called through ``operator.call``, the one function callgrind counts in
(``--toggle-collect``): the count is that ``simulate()`` call's alone (its summary included; start-up
excluded), and the same in every run of the same code. Per-step recording is on, as in ``bench_speed.py``.

    python benchmarks/bench_instructions.py                       # reference, first 900 s
    python benchmarks/bench_instructions.py --horizon 3600        # the whole hour (~2 min)
    python benchmarks/bench_instructions.py overloaded --horizon 60
    python benchmarks/bench_instructions.py --code /tmp/old      # an older commit's twin, same workload
    python benchmarks/bench_instructions.py --profile llama-3.1-8b_h100_vllm085   # another shipped profile

prints ``scenario=``, ``horizon_s=``, ``instructions=<count>`` and ``instructions_per_simulated_s=``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

CHILD = """
import sys
sys.path.insert(0, {bench!r})
import numpy as np
import bench_speed  # (it puts this checkout first on the path: the code's root goes before it)
sys.path.insert(0, {root!r})
# (an editable install's finder would resolve the checkout's missing modules from the installed one)
sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, "__module__", "").startswith("__editable__")]
assert not any(m == "twin" or m.startswith("twin.") for m in sys.modules)
try:
    from twin.perf.profile import load_profile
except ImportError:  # (a checkout from before the twin.perf package)
    from twin.profile import load_profile
import twin
assert twin.__file__.startswith({root!r}), twin.__file__
from twin.simulate import simulate
data = np.load({npz!r})
w = {{k: data[k] for k in data.files}}
cfg = bench_speed.build_config({name!r})
profile = load_profile({profile!r})
simulate(w, profile, cfg, horizon_s=1.0, record_steps=True)  # (warm-up: whatever a run imports on first use)
import operator
# the one call of operator.call in the process: callgrind counts only while it runs (--toggle-collect)
operator.call(simulate, w, profile, cfg, horizon_s={horizon!r}, record_steps=True)
"""


def count(name: str, npz: str, horizon: float, code_root: Path = ROOT, profile: str | None = None) -> int:
    """Instructions of the simulation of ``horizon`` seconds, with the twin of the checkout ``code_root`` and its
    ``profile`` (None: its default), in a child that loads the workload and warms up first (neither counted)."""
    code = CHILD.format(bench=str(Path(__file__).resolve().parent), root=str(code_root), npz=npz, name=name,
                        horizon=float(horizon), profile=profile)
    out = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", "--collect-atstart=no",
                          "--toggle-collect=_operator_call*", sys.executable, "-c", code],
                         capture_output=True, text=True, env={**os.environ, "PYTHONHASHSEED": "0"})
    m = re.search(r"I\s+refs:\s+([\d,]+)", out.stderr)
    if out.returncode != 0 or m is None:
        sys.stderr.write(out.stderr[-3000:])
        raise SystemExit(f"bench_instructions: the child under valgrind failed (exit {out.returncode})")
    n = int(m.group(1).replace(",", ""))
    if n == 0:
        raise SystemExit("bench_instructions: callgrind counted nothing: this Python's operator.call is not the C "
                         "function _operator_call that --toggle-collect names")
    return n


def main(argv: list[str]) -> int:
    from bench_speed import SCENARIOS, build

    ap = argparse.ArgumentParser(prog="python benchmarks/bench_instructions.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("scenario", nargs="?", default="reference", choices=sorted(SCENARIOS),
                    help="bench_speed.py's scenario (default reference)")
    ap.add_argument("--horizon", type=float, default=900.0,
                    help="simulated seconds (default 900; 3600 the whole hour)")
    ap.add_argument("--code", metavar="DIR", default=None,
                    help="simulate with the twin of another checkout (e.g. a worktree of an older commit: "
                         "git worktree add /tmp/old COMMIT): the same workload and engine configuration, that "
                         "checkout's default profile")
    ap.add_argument("--profile", default=None, metavar="NAME",
                    help="a profile that checkout ships (default: its default profile; e.g. "
                         "llama-3.1-8b_h100_vllm085, the calibrated profile without the adapter check, which was "
                         "the default until stop 63)")
    args = ap.parse_args(argv)
    code_root = Path(args.code).resolve() if args.code else ROOT
    if not (code_root / "twin" / "simulate.py").is_file():
        ap.error(f"--code {args.code}: no twin/simulate.py there; give the root of a checkout of this project")
    if not args.horizon > 0 or args.horizon > 3600:
        ap.error(f"--horizon {args.horizon:g}: give simulated seconds in (0, 3600], e.g. --horizon 900")
    if shutil.which("valgrind") is None:
        print("bench_instructions: valgrind is not installed; install it (Debian: apt install valgrind) or use "
              "bench_speed.py for wall-clock figures", file=sys.stderr)
        return 2
    import numpy as np

    with tempfile.TemporaryDirectory(prefix="twin-instr-") as tmp:
        npz = os.path.join(tmp, f"{args.scenario}.npz")
        np.savez(npz, **build(args.scenario))
        n = count(args.scenario, npz, args.horizon, code_root, args.profile)
    of = f" with the twin of {code_root}" if args.code else ""
    of += f", profile {args.profile}" if args.profile else ""
    print(f"# {args.scenario}: first {args.horizon:g} simulated s{of}: {n:,} instructions under callgrind")
    print(f"scenario={args.scenario}")
    print(f"horizon_s={args.horizon:g}")
    print(f"instructions={n}")
    print(f"instructions_per_simulated_s={n / args.horizon:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
