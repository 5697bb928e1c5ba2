"""Run a grid: executors (local processes, Dask, Ray), Parquet shards, resume, progress.

Output directory layout::

    OUT/sweep.json                  grid, its digest, profile hash, twin version, started/finished
    OUT/shards/<task_hash>.parquet  one shard per finished task (a scenario's walk), one row per run

A shard is written (to a temporary name, then renamed) as soon as its task's result arrives, so
an interrupted sweep loses at most the tasks in flight; ``--resume`` (the default when
``OUT/sweep.json`` matches the grid) skips every task whose shard exists. Results do not depend
on the executor or the number of workers: every run is seeded by its key
(:func:`twin.sweep.scenario.run_seed`). ``sweep.json`` lists the grid's task hashes: a shard file
named for no task of the grid (another grid's shards copied in, a stray file) is refused by the
resume, by ``--summary`` and by :func:`read_results`, naming it (:class:`ForeignShards`).

One sweep at a time writes into an ``OUT``: it holds an exclusive lock on ``OUT/.sweep.lock`` (flock, which
ends with the process) from before it reads ``sweep.json`` to its end, and a second sweep into ``OUT`` is refused
up front, naming the holder's pid and start (:class:`OutInUse`). Shards of one grid (``--shard i/k``) run at once
go to separate ``OUT`` directories (``twin configure dataset`` / ``train`` take several).
"""

from __future__ import annotations

import errno
import json
import numbers
import os
import signal
import socket
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import pandas as pd

try:
    import fcntl
except ImportError:  # (a platform without flock, e.g. Windows: a sweep there takes no lock on its --out)
    fcntl = None  # type: ignore[assignment]

from traces.datadir import unset_data_dir_hint
from twin.sweep.grid import GridSpec
from twin.sweep.walk import run_task
from twin.sweep.scenario import (check_engine_overrides, check_some_config_starts, get_profile, profile_hash,
                                 twin_version)

EXECUTORS = ("local", "dask", "ray")


class MissingExtra(RuntimeError):
    pass


# --------------------------------------------------------------------------- shards
def shard_dir(out: Path) -> Path:
    return Path(out) / "shards"


#: columns every shard's run rows have (:func:`twin.sweep.scenario.run_config`'s rows)
SHARD_COLUMNS = ("task_hash", "status", "scenario")


def _shard_problem(p: Path) -> str | None:
    """Why ``p`` is not a shard of its task, or None: not readable as Parquet (a shard cut short by a crash, or
    garbage, has no footer), a table without the run rows' columns (:data:`SHARD_COLUMNS`), or rows of another
    task than the one its name says (another file copied over it)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        names = pq.read_schema(p).names
        missing = [c for c in SHARD_COLUMNS if c not in names]
        if missing:
            return f"a Parquet table but not a sweep's run rows (missing columns {', '.join(missing)})"
        hashes = set(pq.read_table(p, columns=["task_hash"]).column("task_hash").to_pylist())
    except (OSError, pa.ArrowException) as e:
        return "not readable as Parquet (" + ((str(e).strip().splitlines() or [type(e).__name__])[0]) + ")"
    if hashes != {p.stem}:
        whose = "task " + ", ".join(sorted(map(str, hashes))[:2]) if hashes else "no task"
        return f"rows of {whose}, not of task {p.stem}"
    return None


def _shard_readable(p: Path) -> bool:
    """Whether ``p`` is its task's shard (:func:`_shard_problem`)."""
    return _shard_problem(p) is None


def damaged_shards(out: Path) -> list[Path]:
    """The shards under ``out`` that are not their task's run rows (:func:`_shard_problem`: truncated, overwritten,
    another table or another task's rows copied in): their tasks count as not done, so a resumed sweep runs them
    again (and replaces the shard)."""
    d = shard_dir(out)
    return [p for p in sorted(d.glob("*.parquet")) if not _shard_readable(p)] if d.exists() else []


def done_tasks(out: Path) -> set[str]:
    """The tasks whose shard is on disk and readable (a damaged shard's task is not done)."""
    d = shard_dir(out)
    if not d.exists():
        return set()
    bad = set(damaged_shards(out))
    return {p.stem for p in d.glob("*.parquet") if p not in bad}


def write_shard(out: Path, task_hash: str, rows: list[dict[str, Any]]) -> Path:
    d = shard_dir(out)
    d.mkdir(parents=True, exist_ok=True)
    df = pd.DataFrame(rows)
    for c in ("startup_reason", "error", "traceback"):
        if c in df:
            df[c] = df[c].astype(str)
    tmp = d / f".{task_hash}.{os.getpid()}.parquet.tmp"  # (the writer's own: two processes never share one)
    df.to_parquet(tmp, index=False)
    final = d / f"{task_hash}.parquet"
    os.replace(tmp, final)
    return final


def write_meta(path: Path, meta: dict[str, Any]) -> None:
    """``sweep.json`` written whole or not at all (to a temporary name, then renamed, as the shards are): a sweep
    killed while writing it left half a record, which made its finished shards unusable."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(meta, indent=1, default=str))
    os.replace(tmp, path)


def remove_stale_temporaries(out: Path) -> None:
    """Temporary files a killed writer left in ``out`` (a shard or the record half written; never read): removed
    when a sweep starts there, unless the process named in them (:func:`write_shard`, :func:`write_meta`) still runs
    on this host."""
    for p in (*shard_dir(out).glob(".*.tmp"), *out.glob(".sweep.json.*.tmp")):
        parts = p.name.split(".")
        pid = parts[-3] if p.name.endswith(".parquet.tmp") else parts[-2]
        if pid.isdigit() and len(pid) <= 9 and _running(int(pid)):
            continue
        try:
            p.unlink()
        except OSError:  # (renamed meanwhile)
            pass


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # (exists, another user's)
        return True
    return True


class ForeignShards(ValueError):
    """Shard files under a sweep's ``shards/`` that belong to no task of its grid (another grid's shards
    copied in, a stray file): reading or resuming would mix them into the grid's rows."""


def grid_task_hashes(out: str | os.PathLike) -> set[str] | None:
    """The task hashes (shard names) of the grid ``OUT/sweep.json`` records: its ``task_hashes``, or
    for a record written before them the tasks of its grid rebuilt (when their digest and profile hash
    match the record's). None where no record says: no ``sweep.json`` (e.g. a ``configure search``
    cache, shared by many grids), a directory shared by several grids (``run_sweep(check_grid=False)``),
    or a grid this twin cannot rebuild."""
    p = Path(out)
    if not (p / "sweep.json").is_file():
        return None
    meta = read_meta(p)
    if meta.get("shared_by_grids"):
        return None
    if isinstance(meta.get("task_hashes"), list):
        return {str(h) for h in meta["task_hashes"]}
    try:  # (a record of an earlier twin: no list of task hashes)
        grid = GridSpec(**meta["grid"])
        if grid.digest() != meta.get("grid_digest") or profile_hash(grid.profile) != meta.get("profile_hash"):
            return None
        return {t["task_hash"] for t in grid.tasks()}
    except (KeyError, TypeError, ValueError, OSError):
        return None


def foreign_shards(out: str | os.PathLike, task_hashes: set[str]) -> list[Path]:
    """The shard files under ``out`` (readable or not) named for no task in ``task_hashes``."""
    d = shard_dir(Path(out))
    return [p for p in sorted(d.glob("*.parquet")) if p.stem not in task_hashes] if d.exists() else []


def check_foreign_shards(out: str | os.PathLike, task_hashes: set[str] | None, grid_name: str | None) -> None:
    """:class:`ForeignShards` naming the shard files under ``out`` that belong to no task of the grid
    (``task_hashes``; None: nothing to check), and what to do, before their rows are read or a resume
    counts them."""
    if task_hashes is None:
        return
    bad = foreign_shards(out, task_hashes)
    if not bad:
        return
    names = ", ".join(p.name for p in bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
    unreadable = sum((_shard_problem(p) or "").startswith("not readable") for p in bad)
    what = (f"{len(bad)} shard file{'s' if len(bad) != 1 else ''} under {shard_dir(Path(out))} belong"
            f"{'s' if len(bad) == 1 else ''} to no task of grid {grid_name or '?'} ({names}"
            f"{f'; {unreadable} not readable as Parquet' if unreadable else ''})")
    raise ForeignShards(f"{what}: another grid's shards or stray files, which would be mixed into this sweep's rows; "
                        f"remove {'it' if len(bad) == 1 else 'them'} (or move {'it' if len(bad) == 1 else 'them'} to "
                        f"the --out of the sweep {'it belongs' if len(bad) == 1 else 'they belong'} to), or sweep into "
                        f"another --out (--no-resume starts over in this one, deleting every shard there)")


def read_results(out: str | os.PathLike, task_hashes: set[str] | None = None,
                 grid_name: str | None = None) -> pd.DataFrame:
    """Every row of a sweep directory (or of one shard file) as one table. A directory's shards must
    belong to its grid (``task_hashes`` of grid ``grid_name``, else those ``OUT/sweep.json`` records,
    :func:`grid_task_hashes`): :class:`ForeignShards` names any that do not."""
    p = Path(out)
    if not p.is_file():
        if task_hashes is None:
            task_hashes = grid_task_hashes(p)
            grid_name = (read_meta(p).get("grid") or {}).get("name") if (p / "sweep.json").is_file() else None
        check_foreign_shards(p, task_hashes, grid_name)
    files = [p] if p.is_file() else sorted(shard_dir(p).glob("*.parquet"))
    if not files:
        raise FileNotFoundError(f"no sweep shards under {p}; give the --out directory of a `twin sweep` that has "
                                f"finished at least one task")
    return pd.concat([_read_shard(f) for f in files], ignore_index=True)


def _read_shard(f: Path) -> pd.DataFrame:
    import pyarrow as pa

    try:
        df = pd.read_parquet(f)
    except (OSError, pa.ArrowException) as e:
        why = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ValueError(f"{f}: a damaged sweep shard, not readable as Parquet ({why}); run the sweep again with the "
                         f"same --out (a resumed sweep recomputes the tasks of damaged shards), or delete the file")
    if f.parent.name == "shards" and (why := _shard_problem(f)) is not None:
        raise ValueError(f"{f}: a damaged sweep shard, {why}; run the sweep again with the same --out (a resumed "
                         f"sweep recomputes the tasks of damaged shards), or delete the file")
    return df


def _probe_writable(d: Path, name: str) -> None:
    """Create (exclusively) and remove ``d/name``: a directory's permission bits do not tell whether a file can be
    made there (a read-only mount; root's access to everything)."""
    fd = os.open(d / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    os.close(fd)
    os.unlink(d / name)


def check_out_writable(out: Path) -> None:
    """``out``'s record (``sweep.json``) and shard folder can be written, checked before any task runs (a read-only
    ``OUT/shards`` was found only when the first task's shard was written, the task's work lost, in an error naming no
    path); a ``ValueError`` naming the path and the fix, else. Makes ``OUT/shards``."""
    meta_p = out / "sweep.json"
    if meta_p.exists() and not meta_p.is_file():
        raise ValueError(f"{meta_p} is not a file, where the sweep keeps its record; move or remove it, or sweep into "
                         f"another --out")
    d = shard_dir(out)
    for where, what, probe in ((out, "its record (sweep.json)", f".sweep.json.{os.getpid()}.tmp"),
                               (d, "its shards", f".write-probe.{os.getpid()}.parquet.tmp")):
        try:
            if where == d:
                d.mkdir(exist_ok=True)
            _probe_writable(where, probe)
        except OSError as e:
            raise ValueError(f"{where}: cannot write there ({e.strerror or e}), where the sweep keeps {what}; make it "
                             f"writable (e.g. chmod u+w {where}; a read-only mount: remount it) or sweep into another "
                             f"--out") from None


# --------------------------------------------------------------------------- the --out lock
#: the lock file of a sweep's --out: held (flock, exclusive) by the ``twin sweep`` process that writes there
LOCK_NAME = ".sweep.lock"

#: the lock files' descriptors this process holds (a forked pool worker closes its copies: :func:`_worker_init`)
_HELD_LOCK_FDS: set[int] = set()


class OutInUse(ValueError):
    """The --out directory is locked by another sweep writing there (two sweeps at once ran every task twice and
    lost one's record in ``sweep.json``)."""


def _lock_holder(fd: int) -> str:
    """What the lock file says of the sweep that holds it: ``pid N, started T`` (and its grid and shard)."""
    try:
        info = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
    except (OSError, ValueError):
        info = {}
    if not isinstance(info, dict) or "pid" not in info:  # (a holder that recorded nothing, or not yet)
        return "its pid and start not recorded"
    parts = [f"pid {info.get('pid', '?')}" + (f" on {info['host']}" if info.get("host") and
                                                 info.get("host") != socket.gethostname() else ""),
             f"started {info.get('started', '?')}"]
    if info.get("grid"):
        parts.append(f"grid {info['grid']}")
    if info.get("shard"):
        parts.append(f"--shard {info['shard']}")
    return ", ".join(parts)


def lock_out(out: Path, grid_name: str | None = None, shard: str | None = None) -> int | None:
    """Take the exclusive lock of ``out`` (``OUT/.sweep.lock``, non-blocking) for a sweep writing there, recording
    this process's pid and start time in it; :class:`OutInUse` naming the holder where another sweep has it. The lock
    goes with the process (released on exit, Ctrl-C, an error, even ``kill -9``); :func:`unlock_out` releases it
    earlier. Returns the lock's descriptor (None where the platform or the file system has no flock)."""
    if fcntl is None:
        return None
    p = Path(out) / LOCK_NAME
    try:
        fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise ValueError(f"{out}: cannot write there ({e.strerror or e}), where the sweep keeps its record and shards; "
                         f"make it writable or sweep into another --out") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):  # (a file system without flock)
            os.close(fd)
            warnings.warn(f"{p}: cannot lock it ({e.strerror or e}); two sweeps run into {out} at once would both run "
                          f"every task")
            return None
        holder = _lock_holder(fd)
        os.close(fd)
        shards = ("; shards of one grid (--shard i/k) cannot run into one --out at once: give each its own --out "
                  "(`twin configure dataset` and `twin configure train` take several sweep directories: DIR1 DIR2 "
                  "...) or run them one after another into this one") if shard or "--shard" in holder else ""
        raise OutInUse(f"--out {out} is in use by another twin sweep ({holder}); wait for it to finish or give another "
                       f"--out{shards}") from None
    info = {"pid": os.getpid(), "host": socket.gethostname(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "grid": grid_name, "shard": shard}
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
    except OSError:  # (the holder's details are for the message of a refused sweep only)
        pass
    _HELD_LOCK_FDS.add(fd)
    return fd


def unlock_out(fd: int | None) -> None:
    """Release a lock :func:`lock_out` took (closing its descriptor releases the flock)."""
    if fd is None:
        return
    _HELD_LOCK_FDS.discard(fd)
    try:
        os.close(fd)
    except OSError:
        pass


# --------------------------------------------------------------------------- executors
def _worker_init() -> None:
    """A local pool worker's start: Ctrl-C (SIGINT, sent to the terminal's whole process group) is the parent's to
    handle (it stops the pool and says how to resume), so a worker ignores it instead of printing a
    ``KeyboardInterrupt`` traceback; and a forked worker closes its copies of the parent's --out lock
    (:func:`lock_out`), so the lock ends with the sweep's own process even where a worker outlives it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # (the pool's terminate: a forked worker ends, whatever the parent's)
    for fd in list(_HELD_LOCK_FDS):
        try:
            os.close(fd)
        except OSError:
            pass
    _HELD_LOCK_FDS.clear()


def _local(tasks: list[dict], jobs: int, **_: Any) -> Iterator[list[dict]]:
    if jobs <= 1 or len(tasks) <= 1:
        for t in tasks:
            yield run_task(t)
        return
    import multiprocessing as mp

    ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else mp.get_context()
    with ctx.Pool(min(jobs, len(tasks)), initializer=_worker_init, maxtasksperchild=20) as pool:  # (no idle workers)
        yield from pool.imap_unordered(run_task, tasks, chunksize=1)  # (Ctrl-C: the with block terminates the pool)


def _dask(tasks: list[dict], jobs: int, address: str | None = None, **_: Any) -> Iterator[list[dict]]:
    try:
        from dask.distributed import Client, LocalCluster, as_completed
    except ImportError:
        raise MissingExtra("the Dask executor needs dask.distributed: pip install 'lora-twin[sweep]' "
                           "(or pip install 'dask[distributed]')") from None
    cluster = None
    if address:
        try:
            client = Client(address)
        except OSError as e:  # (a TimeoutError after distributed's connect timeout, or a refused connection)
            raise ValueError(f"--address {address}: cannot reach a Dask scheduler there ({e}); start one "
                             f"(`dask scheduler`) or leave out --address for a local cluster of --jobs workers") from None
    else:
        cluster = LocalCluster(n_workers=max(jobs, 1), threads_per_worker=1, processes=True,
                               dashboard_address=None)
        client = Client(cluster)
    try:
        futs = [client.submit(run_task, t, pure=False, key=f"sweep-{t['task_hash']}") for t in tasks]
        for f in as_completed(futs):
            yield f.result()
            f.release()
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


def _ray(tasks: list[dict], jobs: int, address: str | None = None, **_: Any) -> Iterator[list[dict]]:
    try:
        import ray
    except ImportError:
        raise MissingExtra("the Ray executor needs ray: pip install 'lora-twin[ray]' (or pip install ray)") from None
    started = False
    if not ray.is_initialized():
        if address:
            try:
                ray.init(address=address)
            except (OSError, RuntimeError) as e:  # (ConnectionError where no Ray cluster answers)
                raise ValueError(f"--address {address}: cannot reach a Ray cluster there ({e}); start one "
                                 f"(`ray start --head`) or leave out --address for a local one") from None
        else:
            ray.init(num_cpus=max(jobs, 1), include_dashboard=False)
        started = True
    try:
        remote = ray.remote(num_cpus=1)(run_task)
        pending = [remote.remote(t) for t in tasks]
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for r in done:
                yield ray.get(r)
    finally:
        if started:
            ray.shutdown()


_EXEC: dict[str, Callable[..., Iterator[list[dict]]]] = {"local": _local, "dask": _dask, "ray": _ray}


# --------------------------------------------------------------------------- the sweep
@dataclass
class SweepReport:
    out: Path
    tasks_total: int
    tasks_done_before: int
    tasks_run: int
    runs: int
    runs_simulated: int
    runs_early_stopped: int
    cpu_s: float
    wall_s: float
    #: runs that raised (their rows have status ``error`` and the exception in ``error``)
    runs_failed: int = 0
    first_error: str = ""
    #: runs that failed vLLM's start-up check (status ``start_failure``, not simulated)
    runs_start_failed: int = 0
    first_start_failure: str = ""
    #: shards found damaged (not readable as Parquet, or not their task's run rows) before the run: their tasks ran
    #: again if selected
    shards_damaged: list[str] | None = None
    #: the twin version that started the sweep in ``out`` when another one (its shards are reused)
    resumed_from_version: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["out"] = str(self.out)
        return d


def check_selection(limit: int | None = None, shard: str | None = None, every: int | None = None,
                    jobs: int | None = None) -> None:
    """``--limit``, ``--shard``, ``--every`` and ``--jobs`` values that select nothing or make no
    sense are refused before any work, with the form to give."""
    for flag, v in (("limit", limit), ("every", every), ("jobs", jobs)):  # (a fraction or a string: no count)
        if v is not None and not (isinstance(v, numbers.Integral) and not isinstance(v, bool)):
            raise ValueError(f"--{flag} {v!r}: must be a whole number >= 1 ({flag}=N in Python), got "
                             f"{type(v).__name__}")
    if limit is not None and limit < 1:
        raise ValueError(f"--limit {limit}: must be >= 1 (the number of tasks to run), or leave it out for all")
    if every is not None and every < 1:
        raise ValueError(f"--every {every}: must be >= 1 (one task in N), e.g. --every 10")
    if jobs is not None and jobs < 1:
        raise ValueError(f"--jobs {jobs}: must be >= 1 (worker processes), e.g. --jobs 2")
    if shard:
        parts = str(shard).split("/")
        ok = len(parts) == 2 and all(p.strip().isdigit() for p in parts)
        if not ok or not 0 <= int(parts[0]) < int(parts[1]):
            raise ValueError(f"--shard {shard}: give i/k with 0 <= i < k (the i-th of k interleaved parts), "
                             f"e.g. --shard 0/4 ... --shard 3/4")


def check_address(executor: str, address: str | None) -> None:
    """``--address`` names a running Dask / Ray cluster: refused with the local executor (it would
    be ignored, the sweep running on local processes instead)."""
    if address and executor == "local":
        raise ValueError(f"--address {address}: only the dask and ray executors connect to a cluster; add "
                         f"--executor dask (or ray), or leave out --address to run on local worker processes")


def check_executor(executor: str) -> None:
    """The Dask / Ray executor's package is installed (:class:`MissingExtra` naming the extra, else),
    checked before the output directory is made."""
    import importlib.util

    need = {"dask": ("dask.distributed", "the Dask executor needs dask.distributed: pip install 'lora-twin[sweep]' "
                                         "(or pip install 'dask[distributed]')"),
            "ray": ("ray", "the Ray executor needs ray: pip install 'lora-twin[ray]' (or pip install ray)")}.get(executor)
    if need is None:
        return
    try:
        found = importlib.util.find_spec(need[0]) is not None
    except (ImportError, ValueError):  # (the parent package missing)
        found = False
    if not found:
        raise MissingExtra(f"{need[1]}; or run on local worker processes with --executor local")


def read_meta(out: Path) -> dict[str, Any]:
    """``OUT/sweep.json`` of an earlier sweep, or a ``ValueError`` naming it and the fix when it is
    not a sweep's record (not JSON, cut short, another kind of JSON)."""
    meta_p = Path(out) / "sweep.json"
    fix = (f"use another --out, or --no-resume to start over in {out} (it deletes the shards there and writes a new "
           f"record)")
    try:
        old = json.loads(meta_p.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{meta_p}: not a sweep's record (not readable as JSON: {e}); {fix}") from None
    if not isinstance(old, dict) or not isinstance(old.get("grid", {}), dict) or \
            not isinstance(old.get("history", []), list):
        raise ValueError(f"{meta_p}: not a sweep's record (expected an object with grid, grid_digest, profile_hash "
                         f"and history); {fix}")
    return old


def check_runnable(grid_tasks: list[dict]) -> None:
    """The grid's runs can happen: its engine overrides give a configuration vLLM accepts, and at
    least one configuration passes the start-up check; else an error before any run."""
    if grid_tasks:  # an impossible engine override would make every run an error
        check_engine_overrides(grid_tasks[0])
        cost = grid_tasks[0]["scenario"].get("rank_tile_cost")
        if cost is not None:  # a profile whose LoRA form has no rank tiles would make every run an error
            try:
                get_profile(grid_tasks[0]["profile"]).with_rank_tile_cost(float(cost))
            except ValueError as e:
                raise ValueError(f"grid [scenarios] rank_tile_cost = {cost:g}: {e}") from None
    check_some_config_starts(grid_tasks)


def select_tasks(tasks: list[dict], limit: int | None = None, shard: str | None = None,
                 every: int | None = None, exclude: set[str] | None = None) -> list[dict]:
    """A subset of tasks: ``exclude`` (scenario keys left out, e.g. held-out test scenarios),
    ``shard='i/k'`` (the i-th of k interleaved parts), ``every=k`` (one task in k, evenly spread: a
    measured fraction of the grid), ``limit`` (the first N after those)."""
    check_selection(limit, shard, every)
    if exclude:
        tasks = [t for t in tasks if t["scenario"]["key"] not in exclude]
    if shard:
        i, k = (int(x) for x in shard.split("/"))
        tasks = tasks[i::k]
    if every and every > 1:
        tasks = tasks[::every]
    if limit is not None:
        tasks = tasks[:limit]
    return tasks


def run_sweep(grid: GridSpec, out: str | os.PathLike, executor: str = "local", jobs: int = 1,
              address: str | None = None, resume: bool = True, limit: int | None = None,
              shard: str | None = None, every: int | None = None, progress: bool = True,
              on_result: Callable[[list[dict]], None] | None = None, check_grid: bool = True,
              exclude: set[str] | None = None, order: str = "heavy",
              on_start: Callable[[], None] | None = None) -> SweepReport:
    """Run ``grid`` into ``out`` (see the module docstring). ``check_grid=False`` lets several grids
    share one directory (a cache: shards are named by the hash of their task's content). ``on_start``: called
    once every check has passed, before ``out`` is written (``twin sweep`` warns there of a window too short for
    the starvation line, after any error)."""
    if not isinstance(grid, GridSpec):
        how = ("twin.sweep.grid.load_grid(name_or_path)" if isinstance(grid, (str, os.PathLike)) else
               "twin.sweep.grid.grid_from_dict(table)" if isinstance(grid, dict) else
               "load_grid(name_or_path) or grid_from_dict(table) (twin.sweep.grid)")
        raise TypeError(f"grid: got {type(grid).__name__}; give a twin.sweep.grid.GridSpec, e.g. from {how}")
    if executor not in _EXEC:
        raise ValueError(f"unknown executor {executor!r}; choose from {', '.join(EXECUTORS)}")
    check_selection(limit, shard, every, jobs)
    check_address(executor, address)
    check_executor(executor)
    if order not in ("heavy", "shuffle", "grid"):  # (checked before anything is written)
        raise ValueError(f"unknown order {order!r}; choose heavy, shuffle or grid")
    grid_tasks = grid.tasks()
    check_runnable(grid_tasks)
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out}: is an existing file, not a directory; give a directory (new or existing)")
    # one sweep at a time writes into ``out`` (the lock is the driver's; workers, local or remote, write nothing
    # there): two at once ran every task twice and lost one's history entry in sweep.json. Taken before sweep.json
    # is read, so the record is read and rewritten by its holder only.
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"--out {out}: cannot be made ({e.strerror or e}); give a path you can write to") from None
    lock = lock_out(out, grid.name, shard)
    try:
        return _run_locked(grid, grid_tasks, out, executor, jobs, address, resume, limit, shard, every, progress,
                           on_result, check_grid, exclude, order, on_start)
    finally:
        unlock_out(lock)


def _run_locked(grid: GridSpec, grid_tasks: list[dict], out: Path, executor: str, jobs: int, address: str | None,
                resume: bool, limit: int | None, shard: str | None, every: int | None, progress: bool,
                on_result: Callable[[list[dict]], None] | None, check_grid: bool, exclude: set[str] | None,
                order: str, on_start: Callable[[], None] | None) -> SweepReport:
    """:func:`run_sweep` once its checks have passed and it holds the lock of ``out``."""
    meta_p = out / "sweep.json"
    meta = {"grid": grid.to_dict(), "grid_digest": grid.digest(), "profile_hash": profile_hash(grid.profile),
            "twin_version": twin_version()}
    old = None
    if meta_p.exists():
        try:
            old = read_meta(out)
        except ValueError:
            if resume:
                raise  # (--no-resume starts over: an unreadable record is replaced)
    older_version = None
    if old is not None:
        if old.get("grid_digest") != meta["grid_digest"] or old.get("profile_hash") != meta["profile_hash"]:
            if resume and check_grid:
                raise ValueError(f"{out} holds a sweep of another grid or profile (grid "
                                 f"{old.get('grid', {}).get('name')}, digest {old.get('grid_digest')}, profile hash "
                                 f"{old.get('profile_hash')}; this is grid {grid.name}, digest {meta['grid_digest']}, "
                                 f"profile hash {meta['profile_hash']}); use another --out, or --no-resume to start "
                                 f"over there (its shards are deleted)")
        if resume:  # every twin version that wrote shards here (the rows carry theirs in twin_version)
            versions = [str(v) for v in old.get("twin_versions") or [old.get("twin_version")] if v is not None]
            meta["twin_versions"] = list(dict.fromkeys(versions + [meta["twin_version"]]))
            older = [v for v in versions if v != meta["twin_version"]]
            older_version = ", ".join(dict.fromkeys(older)) or None
        meta["history"] = old.get("history", [])
    if resume and check_grid:  # (another grid's shards copied in, a stray file: the resume would count or mix them)
        check_foreign_shards(out, {t["task_hash"] for t in grid_tasks}, grid.name)
    if shard_dir(out).exists() and not shard_dir(out).is_dir():  # (was "cannot use OUT/shards: File exists")
        raise ValueError(f"{shard_dir(out)} is a file, where the sweep keeps its shards (a folder); move or remove it, "
                         f"or sweep into another --out")
    check_out_writable(out)  # (a read-only OUT/shards was found after the first task, its work lost)
    if on_start is not None:
        on_start()
    if check_grid:  # the shard names of the grid: the results reader refuses any other shard found here
        meta["task_hashes"] = sorted(t["task_hash"] for t in grid_tasks)
    else:
        meta["shared_by_grids"] = True
    if not resume and shard_dir(out).exists():
        for p in shard_dir(out).glob("*.parquet"):
            p.unlink()
    remove_stale_temporaries(out)
    meta.setdefault("history", []).append({"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                           "executor": executor, "jobs": jobs})
    write_meta(meta_p, meta)

    all_tasks = select_tasks(grid_tasks, limit, shard, every, exclude)
    damaged = [p.name for p in damaged_shards(out)]
    done = done_tasks(out)
    if older_version is not None:
        older_version = f"{older_version} ({len(done & {t['task_hash'] for t in all_tasks})} shards reused)"
    todo = [t for t in all_tasks if t["task_hash"] not in done]
    if order == "heavy":  # heaviest first (more offered load = longer runs) so the pool's tail is short
        todo.sort(key=lambda t: -sum(t["scenario"]["rates"]))
    elif order == "shuffle":  # a random order (fixed seed): any prefix of the sweep is a random sample
        import random

        random.Random(0).shuffle(todo)
    bar = None
    if progress and todo:
        from tqdm import tqdm

        bar = tqdm(total=len(todo), unit="task", desc=f"sweep {grid.name}", smoothing=0.05)
    t0 = time.perf_counter()
    runs = sim = early = failed = start_failed = 0
    first_error = first_start_failure = ""
    cpu = 0.0
    for rows in _EXEC[executor](todo, jobs, address=address):
        if rows:
            write_shard(out, rows[0]["task_hash"], rows)
        runs += len(rows)
        for r in rows:
            if r.get("status") == "error":
                failed += 1
                first_error = first_error or str(r.get("error") or "")
            elif r.get("status") == "start_failure":
                start_failed += 1
                first_start_failure = first_start_failure or str(r.get("startup_reason") or "")
        sim += sum(1 for r in rows if r.get("status") == "ok")
        early += sum(1 for r in rows if r.get("early_stop"))
        cpu += sum(float(r.get("cpu_s") or r.get("wall_s") or 0.0) for r in rows)
        if on_result:
            on_result(rows)
        if bar is not None:
            bar.update(1)
            bar.set_postfix(runs=runs, early=early, cpu_h=f"{cpu / 3600:.2f}")
    if bar is not None:
        bar.close()
    wall = time.perf_counter() - t0
    rep = SweepReport(out, len(all_tasks), len(all_tasks) - len(todo), len(todo), runs, sim, early, cpu, wall,
                      failed, first_error, start_failed, first_start_failure, damaged, older_version)
    meta["history"][-1].update(finished=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **{
        k: v for k, v in rep.to_dict().items() if k != "out"})
    write_meta(meta_p, meta)
    return rep


#: what ``--exclude`` takes besides scenario keys
_EXCLUDE_FORMS = ("give scenario keys, a real-run CSV (its ml_test scenarios are left out) or a CSV with a "
                  "`scenario` column (e.g. labels of `twin configure dataset`), comma-separated")


def exclusion_keys(spec: str | None) -> set[str]:
    """Scenario keys from ``KEY,KEY`` and CSVs with a ``scenario`` column, in any mix: the real-run
    table gives its ``ml_test`` scenarios (the held-out test set), any other table (e.g. labels of
    ``twin configure dataset``) all its scenarios. A part naming a path (an existing one, or one
    with a ``/`` or a ``.csv`` suffix) must be a readable CSV that gives at least one scenario;
    else an error naming it and what it must hold."""
    if spec is None:
        return set()
    if not spec.strip(" ,"):  # (`--exclude ''`, e.g. an unset shell variable: it excluded nothing, silently)
        raise ValueError(f"--exclude {spec!r}: empty; {_EXCLUDE_FORMS}, or leave the option out")
    out: set[str] = set()
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        p = Path(part)
        looks_like_path = "/" in part or os.sep in part or p.suffix.lower() == ".csv"
        if not p.exists():
            if looks_like_path:
                raise ValueError(f"--exclude {part}: file not found{unset_data_dir_hint(part)}; {_EXCLUDE_FORMS}")
            out.add(part)
            continue
        out |= _exclusion_file(p)
    return out


def _exclusion_file(p: Path) -> set[str]:
    """The scenario keys of one ``--exclude`` table (see :func:`exclusion_keys`)."""
    if p.is_dir():
        raise ValueError(f"--exclude {p}: a directory, not a CSV table; {_EXCLUDE_FORMS}")
    if p.suffix.lower() != ".csv":
        raise ValueError(f"--exclude {p}: not a .csv file; {_EXCLUDE_FORMS}")
    try:
        df = pd.read_csv(p)
    except pd.errors.EmptyDataError:
        raise ValueError(f"--exclude {p}: the file is empty; {_EXCLUDE_FORMS}") from None
    except (OSError, UnicodeDecodeError, pd.errors.ParserError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e).splitlines()[0]
        raise ValueError(f"--exclude {p}: cannot read it as a CSV table ({why}); {_EXCLUDE_FORMS}") from None
    if "scenario" not in df:
        cols = ", ".join(map(str, df.columns[:8])) + (", ..." if len(df.columns) > 8 else "")
        raise ValueError(f"--exclude {p}: no `scenario` column (columns: {cols}); the table must hold the scenario "
                         f"keys to leave out in a `scenario` column (a real-run table, its ml_test rows, or labels "
                         f"of `twin configure dataset`)")
    real = "source" in df
    if real:
        df = df[df["source"] == "ml_test"]
    keys = set(df["scenario"].dropna().astype(str))
    if not keys:
        what = "no ml_test rows (the held-out test scenarios it would leave out)" if real else "no scenario rows"
        raise ValueError(f"--exclude {p}: the table holds {what}, so it excludes nothing; {_EXCLUDE_FORMS}")
    return keys


def unmatched_exclusions(exclude: set[str], tasks: list[dict]) -> set[str]:
    """The ``--exclude`` keys that name no scenario of ``tasks`` (they exclude nothing)."""
    return set(exclude) - {t["scenario"]["key"] for t in tasks}


def summarize_results(df: pd.DataFrame) -> dict[str, Any]:
    """Cost and outcome figures of a sweep table. A sweep none of whose runs was simulated (every
    run failed the start-up check or ended in an error) also gets a ``note`` and the reasons."""
    missing = [c for c in ("status", "task_hash") if c not in df]
    if missing:
        raise ValueError(f"not a sweep's run table (missing columns {', '.join(missing)}); give the --out directory "
                         f"of a `twin sweep` or one of its shards")

    def col(frame: pd.DataFrame, name: str, default: Any) -> pd.Series:
        return frame[name] if name in frame else pd.Series(default, index=frame.index, dtype=object)

    def flag(frame: pd.DataFrame, name: str) -> pd.Series:
        return col(frame, name, False).fillna(False).astype(bool)

    ok = df["status"] == "ok"
    sim = df[ok]
    full = sim[~flag(sim, "early_stop")]
    wall = pd.to_numeric(col(df, "wall_s", 0.0), errors="coerce").fillna(0)
    n_start = int((df["status"] == "start_failure").sum())
    n_err = int((df["status"] == "error").sum())
    s = {"tasks": int(df["task_hash"].nunique()), "runs": int(len(df)), "simulated": int(ok.sum()),
         "start_failures": n_start,
         "errors": n_err,
         "early_stopped": int(flag(sim, "early_stop").sum()),
         "starving": int(flag(sim, "starving").sum()),
         "wall_s": float(wall.sum()),
         "cpu_s": float(df["cpu_s"].fillna(0).sum()) if "cpu_s" in df else None,
         "cpu_s_per_task": float(df.groupby("task_hash")["cpu_s"].sum().mean()) if "cpu_s" in df else None,
         "wall_s_per_simulated_run": float(sim["wall_s"].mean()) if len(sim) and "wall_s" in sim else None,
         "cpu_s_per_simulated_run": float(sim["cpu_s"].mean()) if len(sim) and "cpu_s" in sim else None,
         "cpu_s_per_full_run": float(full["cpu_s"].mean()) if len(full) and "cpu_s" in full else None}
    if len(df) and not len(sim):
        what = (f"all {len(df)} runs failed vLLM's start-up check" if n_start == len(df) else
                f"all {len(df)} runs ended in an error" if n_err == len(df) else
                f"{n_start} runs failed vLLM's start-up check, {n_err} ended in an error")
        s["note"] = f"no run was simulated: {what}"
        if n_start:
            reasons = col(df[df["status"] == "start_failure"], "startup_reason", "").astype(str).value_counts()
            s["start_failure_reasons"] = [f"{n} run{'s' if n != 1 else ''}: {r}" for r, n in reasons.head(3).items()]
            if len(reasons) > 3:
                s["start_failure_reasons"].append(f"... {len(reasons) - 3} more distinct reasons")
        if n_err:
            s["first_error"] = str(col(df[df["status"] == "error"], "error", "").iloc[0])
    return s
