"""Speed and memory of the twin on the published adapter twin's two one-hour scenarios.

Setting: Llama-3.1-8B on an H100 (KV capacity 212,032 tokens at 128 slots of max rank
16), chunked prefill with 2,048 batched tokens, ``max_num_seqs`` 2048, ShareGPT-like
lengths of mean 222 input / 196 output tokens, per-adapter Poisson rates assigned
round-robin, ranks 8 and 16, a 3600 s window (requests in flight then are unfinished).

* overloaded hour: 384 adapters, 128 slots, rates 1.6/0.8/0.4 req/s (~1.3 M arrivals);
* reference hour: 128 adapters, 128 slots, rates 0.1/0.05/0.025 req/s (~27,000 requests).

Each scenario runs in a fresh process (so peak RSS is its own) and prints
``x_realtime=<simulated s per wall s>``, ``sim_wall_s=<s>``, ``sim_cpu_s=<s>`` (CPU seconds of the
simulation: steadier than wall-clock time on a shared machine) and ``peak_rss_mb=<MB>``; the
reference hour's lines come last. Workload generation (traces package) runs in the parent and is excluded from the timing and the
RSS (it is reported separately); the child process imports only the core twin.

With ``--repeat N`` each scenario is simulated in N fresh processes and the lines give the
median wall and CPU seconds (``x_realtime`` from the median wall) and the largest peak RSS; the
issue's figures are ``--repeat 3`` on a quiet machine. ``--system slora`` replays the same workloads
through the S-LoRA engine (:mod:`twin.slora_engine`; its own memory pool and iteration model, so its
steps and outcomes differ from vLLM's); the default is vLLM v1, the issue's figures.

    python benchmarks/bench_speed.py                # both scenarios
    python benchmarks/bench_speed.py reference      # one
    python benchmarks/bench_speed.py --repeat 3     # median of three
    python benchmarks/bench_speed.py --system slora reference
    python benchmarks/bench_speed.py --repeat 3 --anchor 82c8a38   # and the ratio to the published twin

The published twin's code is not available here, so the speed issue's "10x the published twin" is measured
through an anchor: commit ``82c8a38`` of this twin ran the two hours in :data:`ANCHOR_S` on the machine where the
published twin took :data:`PUBLISHED_S` (issue 13's table). ``--anchor COMMIT`` checks that commit out into a
temporary ``git worktree``, simulates the same scenarios with its own ``benchmarks/bench_speed.py`` (``--repeat``
times each, fresh processes, alternating with this checkout's runs) and prints ``anchor_sim_wall_s=``,
``published_est_s=`` (the published twin's seconds scaled by the anchor's ratio between the two machines) and
``x_published=`` (that estimate over this checkout's median). Only the vLLM engine (the published twin's).
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

#: the serving engines ``--system`` takes (vLLM v1 by default)
SYSTEMS = ("vllm", "slora")

SCENARIOS = {
    "overloaded": dict(adapters=384, slots=128, rates=(1.6, 0.8, 0.4)),
    "reference": dict(adapters=128, slots=128, rates=(0.1, 0.05, 0.025)),
}

#: issue 13's table: the published twin's seconds per hour, run by its own code on the issue's machine
PUBLISHED_S = {"reference": 3.3, "overloaded": 11.3}
#: the anchor commit and its seconds on that machine (the same table: 0.93-0.97 s and 1.76 s)
ANCHOR_COMMIT = "82c8a38"
ANCHOR_S = {"reference": 0.95, "overloaded": 1.76}


def build(name: str, seed: int = 0):
    import numpy as np

    from traces.arrivals import per_adapter_poisson
    from traces.lengths import sharegpt_like

    sc = SCENARIOS[name]
    rng = np.random.default_rng(seed)  # arrivals and lengths from the traces package
    t, ids, _ = per_adapter_poisson(sc["rates"], sc["adapters"], 3600.0, rng)
    p, o = sharegpt_like(len(t), rng, mean_in=222, mean_out=196)
    ranks = np.array([8, 16])[np.arange(sc["adapters"]) % 2]
    # numpy columns of the workload schema
    return {"arrival_s": t, "prompt_tokens": p.astype(np.int64), "output_tokens": o.astype(np.int64),
            "adapter_id": ids, "adapter_rank": ranks[ids]}


def build_config(name: str):
    from twin.config import EngineConfig

    sc = SCENARIOS[name]
    return EngineConfig(max_num_batched_tokens=2048, max_num_seqs=2048, max_loras=sc["slots"],
                        max_cpu_loras=sc["adapters"], max_lora_rank=16, kv_capacity_tokens=212_032)


def peak_rss_mb() -> float:
    """This process's peak RSS: VmHWM (reset by exec, unlike ru_maxrss, which on Linux keeps
    the parent's high-water mark at fork time), else ru_maxrss."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_one(name: str, npz: str, gen_s: float, system: str = "vllm") -> dict:
    """Simulate the workload saved in ``npz`` (the child process imports only the core)."""
    import numpy as np

    from twin.perf.profile import load_profile
    from twin.simulate import simulate

    data = np.load(npz)
    w = {k: data[k] for k in data.files}
    cfg = build_config(name)
    c0 = time.process_time()
    res = simulate(w, load_profile(None), cfg, horizon_s=3600.0, record_steps=True,
                   system=None if system == "vllm" else system)
    cpu_s = time.process_time() - c0
    s = res.summary
    rss_mb = peak_rss_mb()
    return {"scenario": name, "arrivals": s["requests_arrived"], "finished": s["requests_finished"],
            "unfinished": s["requests_unfinished"], "engine_steps": s["engine_steps"],
            "step_segments": s["step_segments"], "sim_wall_s": s["wall_s"], "sim_cpu_s": cpu_s, "workload_gen_s": gen_s,
            "x_realtime": 3600.0 / s["wall_s"], "peak_rss_mb": rss_mb, "throughput_rps": s["throughput_rps"]}


class Anchor:
    """A temporary ``git worktree`` of ``commit`` whose own ``benchmarks/bench_speed.py`` times a scenario."""

    def __init__(self, commit: str) -> None:
        import tempfile

        self.commit = commit
        self.dir = Path(tempfile.mkdtemp(prefix="twin-anchor-")) / "tree"
        out = subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(self.dir), commit],
                             capture_output=True, text=True)
        if out.returncode != 0:
            shutil.rmtree(self.dir.parent, ignore_errors=True)
            raise SystemExit(f"bench_speed: --anchor {commit}: git worktree add failed ({out.stderr.strip()}); give a "
                             f"commit of this repository, e.g. --anchor {ANCHOR_COMMIT}")

    def wall_s(self, name: str) -> float:
        """One simulation of ``name`` by the anchor's code in a fresh process: its seconds (3600 / x_realtime)."""
        out = subprocess.run([sys.executable, str(self.dir / "benchmarks" / "bench_speed.py"), name],
                             capture_output=True, text=True, cwd=str(self.dir),
                             env={**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": str(self.dir)})
        lines = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line and not line.startswith("#"))
        if out.returncode != 0 or "x_realtime" not in lines:
            raise SystemExit(f"bench_speed: the anchor {self.commit} failed on {name}: {out.stderr.strip()[-500:]}")
        return 3600.0 / float(lines["x_realtime"])

    def close(self) -> None:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(self.dir)], capture_output=True)
        shutil.rmtree(self.dir.parent, ignore_errors=True)


def main(argv: list[str]) -> int:
    if len(argv) == 5 and argv[0] == "--child":
        print(json.dumps(run_one(argv[1], argv[2], float(argv[3]), argv[4])))
        return 0
    import tempfile

    if any(a in ("-h", "--help") for a in argv):
        print(__doc__)
        return 0
    repeat = 1
    if "--repeat" in argv:
        i = argv.index("--repeat")
        value = argv[i + 1] if i + 1 < len(argv) else ""
        if not value.isdigit() or int(value) < 1:
            print(f"bench_speed: --repeat takes a whole number of runs, at least 1 (got {value!r})", file=sys.stderr)
            return 2
        repeat = int(value)
        argv = argv[:i] + argv[i + 2:]
    system = "vllm"
    if "--system" in argv:
        i = argv.index("--system")
        system = argv[i + 1] if i + 1 < len(argv) else ""
        if system not in SYSTEMS:
            print(f"bench_speed: --system takes one of {', '.join(SYSTEMS)} (got {system!r})", file=sys.stderr)
            return 2
        argv = argv[:i] + argv[i + 2:]
    anchor_commit = None
    if "--anchor" in argv:
        i = argv.index("--anchor")
        anchor_commit = argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("-") else ""
        if not anchor_commit:
            print(f"bench_speed: --anchor takes a commit (the issue's anchor is {ANCHOR_COMMIT})", file=sys.stderr)
            return 2
        if system != "vllm":
            print("bench_speed: --anchor compares with the published twin, which models vLLM: leave out --system",
                  file=sys.stderr)
            return 2
        argv = argv[:i] + argv[i + 2:]
    unknown = [a for a in argv if a not in SCENARIOS]
    if unknown:
        print(f"bench_speed: unknown scenario {', '.join(map(repr, unknown))}; give any of "
              f"{', '.join(SCENARIOS)} (or nothing for both)", file=sys.stderr)
        return 2
    names = argv or ["overloaded", "reference"]
    tmp = tempfile.mkdtemp(prefix="twin-bench-")
    anchor = Anchor(anchor_commit) if anchor_commit else None
    try:
        return _bench(names, tmp, repeat, system, anchor)
    finally:
        if anchor is not None:
            anchor.close()


def _bench(names: list[str], tmp: str, repeat: int, system: str, anchor: "Anchor | None") -> int:
    import numpy as np

    for name in names:
        t0 = time.perf_counter()
        w = build(name)
        gen_s = time.perf_counter() - t0
        npz = os.path.join(tmp, f"{name}.npz")
        np.savez(npz, **w)
        del w
        runs, anchor_s = [], []
        for _ in range(repeat):  # a fresh process each time (peak RSS is the run's own)
            out = subprocess.run([sys.executable, __file__, "--child", name, npz, str(gen_s), system], capture_output=True,
                                 text=True, env={**os.environ, "PYTHONHASHSEED": "0"})
            if out.returncode != 0:
                print(out.stderr, file=sys.stderr)
                return out.returncode
            runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
            if anchor is not None:  # (alternating with this checkout's runs: the machine's drift hits both)
                anchor_s.append(anchor.wall_s(name))
        r = dict(runs[0])
        r["sim_wall_s"] = statistics.median(x["sim_wall_s"] for x in runs)
        r["sim_cpu_s"] = statistics.median(x["sim_cpu_s"] for x in runs)
        r["peak_rss_mb"] = max(x["peak_rss_mb"] for x in runs)
        r["x_realtime"] = 3600.0 / r["sim_wall_s"]
        walls = ", ".join(f"{x['sim_wall_s']:.3f}" for x in runs)
        of = f" (median of {repeat}: {walls} s)" if repeat > 1 else ""
        on = f" on {system}" if system != "vllm" else ""
        print(f"# {name} hour{on}: {r['arrivals']} arrivals, {r['finished']} finished, {r['unfinished']} unfinished, "
              f"{r['engine_steps']} engine steps in {r['step_segments']} segments; simulated in "
              f"{r['sim_wall_s']:.3f} s{of} (+{r['workload_gen_s']:.2f} s workload generation)")
        print(f"scenario={name}")
        print(f"x_realtime={r['x_realtime']:.1f}")
        print(f"sim_wall_s={r['sim_wall_s']:.3f}")
        print(f"sim_cpu_s={r['sim_cpu_s']:.3f}")
        print(f"peak_rss_mb={r['peak_rss_mb']:.1f}")
        if anchor is not None:
            a = statistics.median(anchor_s)
            est = PUBLISHED_S[name] * a / ANCHOR_S[name]
            print(f"# {name} hour: the anchor {anchor.commit} took {a:.3f} s here (median of {len(anchor_s)}), "
                  f"{ANCHOR_S[name]:.2f} s where the published twin took {PUBLISHED_S[name]:.1f} s: the published twin "
                  f"would take about {est:.2f} s here, {est / r['sim_wall_s']:.1f}x this checkout's time")
            print(f"anchor_sim_wall_s={a:.3f}")
            print(f"published_est_s={est:.3f}")
            print(f"x_published={est / r['sim_wall_s']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
