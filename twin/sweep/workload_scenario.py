"""A sweep scenario read from a workload file: a user's own trace, replayed at every configuration.

A grid's ``[scenarios] workload = ["my-trace.parquet"]`` (any file ``twin run --trace FILE`` reads:
:func:`traces.workload.read_workload_file`) makes one scenario per file (and per policy) instead of the
synthetic rates x ranks x lengths x arrival product. The file gives the requests: their arrival times,
lengths, adapters and ranks; the configuration axes are the grid's.

**Served adapters.** A run that serves ``N`` adapters replays the requests of ``N`` of the file's adapters,
the first ``N`` of one random order of them (seeded by the scenario and the grid's seed, not by ``N``), and
every base-model request (adapter ``-1``: no slot needed). So the served axis walks nested subsets: each run
adds adapters to the previous one, its offered load grows with ``N`` as in the published walk, and the
``throughput90`` rule reads "how many of these adapters one GPU can serve". A served value above the file's
adapter count is left out of that scenario's walk (:func:`served_values`); the adapters keep their ranks and
are numbered ``0 .. N-1`` in that order.

**Window.** The requests arriving before the grid's ``window_s`` are replayed (the window's end cancels
those in flight, as in every sweep run); a file none of whose requests arrives in the window is refused.

**Scenario features** (the row columns :func:`twin.sweep.walk.scenario_columns` writes; computed over all the
file's adapters in the window): the published 8 over the adapters instead of a rate and rank triple (each
adapter's rate is its requests in the window / ``window_s``; with round-robin classes these are the triples'
statistics), the mean input and output tokens, and ``arrival_cv``, the median per-adapter gap CV
(:func:`traces.arrivals.per_adapter_interarrival_cv`; NaN with no adapter of 10 requests).

The scenario key is ``workload_<file stem>_<first 12 hex of the file's SHA-256>``: a file edited in place
is a new scenario (its old shards are another task's, which the resume names), and the same content under
the same file name in another directory is the same one.
"""

from __future__ import annotations

import hashlib
import math
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from traces.arrivals import per_adapter_interarrival_cv
from traces.workload import Workload, read_workload_file

#: the ``arrival`` column of a workload scenario's rows (its arrivals are the file's)
FILE_ARRIVAL = "file"

_CACHE: dict[tuple[str, str, float], dict[str, Any]] = {}


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _adapter_table(w: Workload, window_s: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(adapter ids, their ranks, their requests)`` of the adapters with requests in ``w``'s window, ids
    ascending (an adapter whose requests all come later is not one of the scenario's)."""
    df = w.df
    ids = df["adapter_id"].to_numpy()
    a = (ids >= 0) & (df["arrival_s"].to_numpy() < window_s)
    uniq, first, counts = np.unique(ids[a], return_index=True, return_counts=True)
    ranks = df["adapter_rank"].to_numpy()[a][first]
    return uniq.astype(np.int64), ranks.astype(np.int64), counts


def load_workload_scenario(path: str | Path, window_s: float) -> dict[str, Any]:
    """What a grid needs of a workload file (cached per process by path, content hash and window): its
    ``sha256``, ``adapters`` (count), ``ranks`` (the distinct adapter ranks), ``requests`` in the window and
    the scenario ``features``. Every problem is a ``ValueError`` naming the file and the fix."""
    p = Path(path)
    where = f"grid [scenarios] workload {p}"
    if not p.exists():
        raise ValueError(f"{where}: no such file; give a workload file (.parquet, .csv, .jsonl) as `twin run --trace "
                         f"FILE` takes it (a relative path is read from the grid file's directory)")
    try:
        sha, w = _read(str(p.resolve()))
    except OSError as e:
        raise ValueError(f"{where}: cannot read it ({e.strerror or e})") from None
    except ValueError as e:  # (a malformed file: its message names the file)
        raise ValueError(f"grid [scenarios] workload: {e}") from None
    key = (str(p.resolve()), sha, float(window_s))
    if key in _CACHE:
        return _CACHE[key]
    df = w.df
    t = df["arrival_s"].to_numpy()
    inw = t < window_s
    if not inw.any():
        raise ValueError(f"{where}: none of its {len(df):,} requests arrives before window_s {window_s:g} s (the first "
                         f"at {t.min():g} s); give a window_s beyond it, or a file whose times start near 0")
    ids, ranks, counts = _adapter_table(w, window_s)
    if not ids.size:
        raise ValueError(f"{where}: every request in the window is for the base model (adapter_id -1); a sweep walks "
                         f"served adapters and slots, so give a file whose requests name adapters")
    rates = counts / float(window_s)
    cv, _ = per_adapter_interarrival_cv(t[inw], df["adapter_id"].to_numpy()[inw])
    d = df[inw]
    feats = {"rate_max": float(rates.max()), "rate_min": float(rates.min()), "rate_mean": float(rates.mean()),
             "rate_std": float(rates.std()), "rank_max": float(ranks.max()), "rank_min": float(ranks.min()),
             "rank_mean": float(ranks.mean()), "rank_std": float(ranks.std()),
             "mean_input_tokens": float(d["prompt_tokens"].mean()),
             "mean_output_tokens": float(d["output_tokens"].mean()),
             "arrival_cv": float(cv)}
    info = {"path": str(p.resolve()), "sha256": sha, "adapters": int(ids.size),
            "ranks": sorted({int(r) for r in ranks}), "requests": int(inw.sum()), "features": feats,
            "last_arrival_s": float(t[inw].max())}
    _CACHE[key] = info
    return info


_READ: dict[str, tuple[tuple[int, int], str, Workload]] = {}


def _read(path: str) -> tuple[str, Workload]:
    """``(SHA-256 of the content, workload)`` of the file at ``path``: hashed and read once per process while its
    size and modification time stay the same (the grid reads it, then a walk replays it at every
    configuration)."""
    st = Path(path).stat()
    sig = (st.st_size, st.st_mtime_ns)
    hit = _READ.get(path)
    if hit is None or hit[0] != sig:
        hit = (sig, file_sha256(path), read_workload_file(path))
        _READ.clear()  # (one file at a time: a walk is one scenario's)
        _READ[path] = hit
    return hit[1], hit[2]


#: the share of the window past a file's last arrival beyond which :func:`grace_note` warns
GRACE_SHARE = 0.01


def grace_note(path: str, window_s: float, flag: str) -> str:
    """A warning when the file's requests stop well before the window ends (more than :data:`GRACE_SHARE` of
    it): a run's backlog then has that long to drain before the window's end cuts it, which the published runs,
    whose arrivals fill their window, do not have, so the 90 % line reads a run that drains in time as keeping
    up; empty otherwise. ``flag`` names the setting (``window_s``, ``--window``)."""
    info = load_workload_scenario(path, window_s)
    grace = float(window_s) - info["last_arrival_s"]
    if grace <= GRACE_SHARE * float(window_s):
        return ""
    return (f"{flag} {window_s:g}: the last request of {path} arrives at {info['last_arrival_s']:.1f} s, so each run's "
            f"backlog has {grace:.0f} s to drain before the window ends, a time the published runs do not have (their "
            f"arrivals fill the window): a run whose queue drains in that time reads as keeping up; give {flag} "
            f"{math.floor(info['last_arrival_s']):g} to cut as they do (and rule slo for the latencies: throughput90 "
            f"reads tokens, not waiting)")


def scenario_key(path: str | Path, sha256: str) -> str:
    """``workload_<stem>_<12 hex of the content's SHA-256>`` (characters outside ``[A-Za-z0-9._-]`` as ``-``)."""
    stem = "".join(c if c.isalnum() or c in "._-" else "-" for c in Path(path).stem) or "file"
    return f"workload_{stem}_{sha256[:12]}"


def served_values(served: list[int], adapters: int) -> list[int]:
    """The grid's served values a file of ``adapters`` adapters can serve (at most ``adapters``)."""
    return [int(n) for n in served if int(n) <= adapters]


def order_seed(workload_key: str, seed: int) -> int:
    """The seed of the adapters' order: the file's scenario key (:func:`scenario_key`: its content, not the
    policy, so every policy replays the same subsets) and the grid's seed, not the served count (so the served
    walk's subsets are nested)."""
    return zlib.crc32(f"{workload_key}|adapter-order|seed={seed}".encode()) & 0x7FFFFFFF


def served_workload(scenario: dict[str, Any], served: int, seed: int, window_s: float) -> Workload:
    """The requests one run of ``scenario`` replays at ``served`` adapters (module docstring): the first
    ``served`` adapters of the seeded order, renumbered ``0 .. served-1``, their requests and the base
    model's, arriving before ``window_s``."""
    path, sha = scenario["workload"], scenario["workload_sha256"]
    now, w = _read(path)
    if now != sha:
        raise ValueError(f"workload file {path} changed since the grid was read (its SHA-256 is no longer "
                         f"{sha[:12]}...); run the sweep again to replay the new content as a new scenario")
    ids, _, _ = _adapter_table(w, window_s)
    rng = np.random.default_rng(order_seed(scenario_key(path, sha), seed))
    chosen = rng.permutation(ids)[: int(served)]
    df = w.df
    df = df[df["arrival_s"].to_numpy() < window_s]
    a = df["adapter_id"].to_numpy()
    new_id = np.full(int(ids.max()) + 1, -1, np.int64)
    new_id[chosen] = np.arange(chosen.size, dtype=np.int64)
    mapped = np.where(a >= 0, new_id[np.maximum(a, 0)], -1)
    keep = (a < 0) | (mapped >= 0)
    out = df[keep].copy()
    out["adapter_id"] = mapped[keep]
    out["request_id"] = np.arange(len(out), dtype=np.int64)
    return Workload(out.reset_index(drop=True), {"source": "sweep-workload", "file": path, "sha256": sha,
                                                 "served": int(served), "seed": int(seed)})
