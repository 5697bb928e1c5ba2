"""What a compiled event loop would cost and gain (issue 13's "compiled path"): a Numba probe, not the twin.

The speed issue's targets (reference hour <= 0.33 s, a mean of 1.0 s per simulated hour over the validation
mix) sit 3-4x below what the pure-Python engine reaches (``bench_speed.py``, ``bench_mix.py``), and its rules
allow a compiled path only from wheels (no compiler at install). Numba has wheels for this platform. Before
anyone ports the engine (its policies, adapter tiers, host link and the profile's forms, bit for bit), this
script measures the two figures that decide whether a port can meet the targets at all:

* the **one-time cost** a fresh process pays: importing Numba, compiling the loop (no cache), or loading it
  from Numba's on-disk cache (``cache=True``; what every later process pays);
* the **steady cost** of the loop itself, per simulated hour and per engine step.

The loop here is a simplified continuous-batching engine written for Numba, *not* the twin's semantics: FCFS
admission with a token budget, chunked prefill, KV blocks of 16 tokens, adapter slots with LRU eviction and a
fixed load time, a step-time form with batch, context, slot and host terms. It steps one iteration at a time
(no run skipping), so it does more steps than the twin's engine, which skips runs of identical decode steps.
The workload is ``bench_speed.py``'s reference hour (same generator and seed: ~27,000 requests of 128 adapters
over 3600 s), on 128 slots, 2,048 batched tokens and the H100's 212,032 KV tokens.

Each phase runs in a fresh child process with its own Numba cache directory: ``cold`` (compile, then run) and
``warm`` (load from that cache, then run); both print the first call's seconds and a second call's (the steady
run). Needs ``pip install numba`` (not a dependency of the twin).

    python benchmarks/compiled_loop_probe.py

prints ``numba=<version>``, ``import_numba_s``, ``first_call_cold_s`` (compile + run), ``first_call_cached_s``
(cache load + run), ``steady_run_s``, ``steps`` and ``ns_per_step``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


try:  # (module level: Numba caches only module-level functions on disk)
    from numba import njit
except ImportError:  # main() says what to install
    njit = None

if njit is not None:

    @njit(cache=True)
    def step_s(prefill, n_dec, ctx, n_act, slots, running, waiting):
        base = 4.5e-3 + 2.1e-5 * (prefill + n_dec) + 1.3e-9 * ctx
        lora = 0.0
        if n_act > 0:
            lora = 1.1e-4 * ((slots + 15) // 16) + 2.0e-6 * n_act * (1.0 + 0.01 * prefill ** 0.5)
        return base + lora + 1.8e-5 * running + 1.4e-7 * waiting

    @njit(cache=True)
    def run(arr, prompt, out, adapter, n_adapters, slots, max_tokens, max_seqs, total_blocks, bs, horizon):
        n = arr.shape[0]
        first_tok = np.full(n, np.nan)
        finish = np.full(n, np.nan)
        computed = np.zeros(n, np.int64)
        emitted = np.zeros(n, np.int64)
        held = np.zeros(n, np.int64)
        waitq = np.empty(n, np.int64)
        running = np.empty(max_seqs, np.int64)
        active = np.zeros(n_adapters, np.int64)
        resident = np.zeros(n_adapters, np.bool_)
        last_used = np.zeros(n_adapters)
        wq_head = wq_tail = n_run = n_res = n_act = used = ptr = steps = 0
        t = 0.0
        while t < horizon:
            while ptr < n and arr[ptr] <= t:  # arrivals join the waiting queue
                waitq[wq_tail] = ptr
                wq_tail += 1
                ptr += 1
            budget = max_tokens
            prefill = n_dec = ctx = 0
            load_s = 0.0
            for k in range(n_run):  # decodes: one token each
                r = running[k]
                if computed[r] >= prompt[r]:
                    budget -= 1
                    n_dec += 1
                    ctx += computed[r]
            for k in range(n_run):  # prefill chunks of running requests
                r = running[k]
                if computed[r] < prompt[r] and budget > 0:
                    c = min(prompt[r] - computed[r], budget)
                    need = (computed[r] + c + bs - 1) // bs - held[r]
                    if used + need > total_blocks:
                        continue
                    used += need
                    held[r] += need
                    computed[r] += c
                    prefill += c
                    budget -= c
            while wq_head < wq_tail and budget > 0 and n_run < max_seqs:  # FCFS admission
                r = waitq[wq_head]
                a = adapter[r]
                if active[a] == 0 and not resident[a]:
                    if n_res >= slots:  # evict the least recently used idle adapter
                        best = -1
                        for b in range(n_adapters):
                            if resident[b] and active[b] == 0 and (best < 0 or last_used[b] < last_used[best]):
                                best = b
                        if best < 0:
                            break
                        resident[best] = False
                        n_res -= 1
                    resident[a] = True
                    n_res += 1
                    load_s += 1e-3
                c = min(prompt[r], budget)
                need = (c + bs - 1) // bs
                if used + need > total_blocks:
                    break
                used += need
                held[r] = need
                computed[r] = c
                prefill += c
                budget -= c
                if active[a] == 0:
                    n_act += 1
                active[a] += 1
                running[n_run] = r
                n_run += 1
                wq_head += 1
            if n_run == 0:  # idle until the next arrival
                if ptr < n:
                    t = arr[ptr]
                    continue
                break
            t += step_s(prefill, n_dec, ctx, n_act, slots, n_run, wq_tail - wq_head) + load_s
            steps += 1
            k = 0
            while k < n_run:  # emit a token; finishes leave the batch
                r = running[k]
                if computed[r] >= prompt[r]:
                    if emitted[r] == 0:
                        first_tok[r] = t
                    emitted[r] += 1
                    computed[r] += 1
                    if (computed[r] + bs - 1) // bs > held[r]:
                        held[r] += 1
                        used += 1
                    if emitted[r] >= out[r]:
                        finish[r] = t
                        used -= held[r]
                        a = adapter[r]
                        active[a] -= 1
                        if active[a] == 0:
                            n_act -= 1
                            last_used[a] = t
                        running[k] = running[n_run - 1]
                        n_run -= 1
                        continue
                k += 1
        return first_tok, finish, steps


def child() -> dict:
    sys.path.insert(0, str(HERE))
    from bench_speed import build

    w = build("reference")
    args = (np.ascontiguousarray(w["arrival_s"], float), w["prompt_tokens"], w["output_tokens"],
            w["adapter_id"].astype(np.int64), 128, 128, 2048, 2048, 212_032 // 16, 16, 3600.0)
    t1 = time.perf_counter()
    _, finish, steps = run(*args)
    first = time.perf_counter() - t1
    t2 = time.perf_counter()
    run(*args)
    steady = time.perf_counter() - t2
    return {"first_call_s": first, "steady_run_s": steady,
            "steps": int(steps), "finished": int(np.isfinite(finish).sum()), "requests": len(finish)}


def main(argv: list[str]) -> int:
    if argv == ["--child"]:
        print(json.dumps(child()))
        return 0
    if argv:
        print(__doc__)
        return 0 if argv[0] in ("-h", "--help") else 2
    if njit is None:
        print("compiled_loop_probe: needs Numba (pip install numba); the twin itself does not use it",
              file=sys.stderr)
        return 2
    cache = tempfile.mkdtemp(prefix="twin-numba-probe-")
    env = {**os.environ, "NUMBA_CACHE_DIR": cache}
    runs = {}
    for phase in ("cold", "warm"):  # the warm child loads what the cold one compiled into the cache
        out = subprocess.run([sys.executable, __file__, "--child"], capture_output=True, text=True, env=env)
        if out.returncode != 0:
            print(out.stderr, file=sys.stderr)
            return out.returncode
        runs[phase] = json.loads(out.stdout.strip().splitlines()[-1])
    c, w = runs["cold"], runs["warm"]
    imp = subprocess.run([sys.executable, "-c", "import time; t = time.perf_counter(); import numba; "
                          "print(numba.__version__, time.perf_counter() - t)"], capture_output=True, text=True)
    version, import_s = imp.stdout.split()
    print(f"# probe loop (not the twin's engine) on the reference hour: {w['requests']} requests, {w['finished']} "
          f"finished, {w['steps']} steps stepped one at a time")
    print(f"numba={version}")
    print(f"import_numba_s={float(import_s):.3f}")
    print(f"first_call_cold_s={c['first_call_s']:.3f}")
    print(f"first_call_cached_s={w['first_call_s']:.3f}")
    print(f"steady_run_s={w['steady_run_s']:.4f}")
    print(f"steps={w['steps']}")
    print(f"ns_per_step={1e9 * w['steady_run_s'] / max(w['steps'], 1):.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
