"""Tiny files in the published schema of every real trace format (for tests and demos).

:func:`write_sample` writes one format; :func:`write_sample_data_dir` lays out a fake data
directory with every built-in real trace at the path the registry expects, so
``get_workload("sharegpt", data_dir=...)`` and ``twin traces show`` can be exercised without
the real (large, partly gated) datasets. The contents are random but seeded.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from traces.registry import BUILTINS

_WORDS = ("the model serves many adapters and each request asks for one of them while the scheduler "
          "batches tokens under a budget 你好 世界").split()


def _text(rng: np.random.Generator, lo: int = 3, hi: int = 60) -> str:
    return " ".join(rng.choice(_WORDS, size=int(rng.integers(lo, hi))))


def _chat(rng: np.random.Generator, turns: int, role_key: str = "role", text_key: str = "content",
          user: str = "user", assistant: str = "assistant", ts0: float | None = None) -> list[dict]:
    out = []
    t = ts0
    for _ in range(turns):
        u = {role_key: user, text_key: _text(rng)}
        a = {role_key: assistant, text_key: _text(rng, 5, 120)}
        if ts0 is not None:
            u["timestamp"] = pd.Timestamp(t, unit="s", tz="UTC").isoformat()
            t += float(rng.exponential(40.0))
            a["timestamp"] = pd.Timestamp(t, unit="s", tz="UTC").isoformat()
            t += float(rng.exponential(5.0))
        out += [u, a]
    return out


def write_sample(fmt: str, path: str | Path, n: int = 200, seed: int = 0) -> Path:
    """Write ``n`` rows (requests, invocations or conversations) of format ``fmt`` to ``path``."""
    rng = np.random.default_rng(seed)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "azure-llm":
        t = pd.Timestamp("2023-11-16 18:15:46") + pd.to_timedelta(np.cumsum(rng.exponential(0.2, n)), unit="s")
        df = pd.DataFrame({"TIMESTAMP": t.strftime("%Y-%m-%d %H:%M:%S.%f") + "0",
                           "ContextTokens": rng.integers(2, 4000, n), "GeneratedTokens": rng.integers(1, 600, n)})
        df.to_csv(path, index=False)
    elif fmt == "azure-functions-2019":
        fns = max(n // 20, 3)
        rows = {"HashOwner": [f"o{i % 3}" for i in range(fns)], "HashApp": [f"a{i % 5}" for i in range(fns)],
                "HashFunction": [f"f{i}" for i in range(fns)], "Trigger": ["http"] * fns}
        lam = 0.5 * (np.arange(fns) + 1.0) ** -1.0
        counts = rng.poisson(lam[:, None] * np.ones((1, 1440)))
        df = pd.DataFrame(rows)
        df = pd.concat([df, pd.DataFrame(counts, columns=[str(m) for m in range(1, 1441)])], axis=1)
        df.to_csv(path, index=False)
    elif fmt == "azure-functions-2021":
        app = rng.choice([f"app{i}" for i in range(4)], n)
        func = rng.choice([f"fn{i}" for i in range(6)], n, p=[0.4, 0.2, 0.15, 0.1, 0.1, 0.05])
        start = np.sort(rng.uniform(0, 600, n))
        dur = rng.exponential(0.5, n)
        pd.DataFrame({"app": app, "func": func, "end_timestamp": start + dur, "duration": dur}).to_csv(path, index=False)
    elif fmt == "burstgpt":
        t = np.sort(rng.integers(0, 3600, n))
        req = rng.integers(1, 2000, n)
        resp = rng.integers(0, 500, n)
        pd.DataFrame({"Timestamp": t, "Model": rng.choice(["ChatGPT", "GPT-4"], n, p=[0.8, 0.2]),
                      "Request tokens": req, "Response tokens": resp, "Total tokens": req + resp,
                      "Log Type": rng.choice(["Conversation log", "API log"], n)}).to_csv(path, index=False)
    elif fmt == "sharegpt":
        data = [{"id": f"c{i}", "conversations": _chat(rng, int(rng.integers(1, 4)), "from", "value", "human", "gpt")}
                for i in range(n)]
        path.write_text(json.dumps(data, ensure_ascii=False))
    elif fmt in ("lmsys", "arena", "wildchat"):
        import pyarrow as pa
        import pyarrow.parquet as pq

        models = ["vicuna-13b", "koala-13b", "gpt-4", "llama-2-13b-chat"]
        if fmt == "lmsys":
            conv = [_chat(rng, int(rng.integers(1, 4))) for _ in range(n)]
            tab = {"conversation_id": [f"id{i}" for i in range(n)], "model": list(rng.choice(models, n)),
                   "conversation": conv, "turn": [len(c) // 2 for c in conv], "language": ["English"] * n}
        elif fmt == "arena":
            ts = np.sort(rng.uniform(1.68e9, 1.68e9 + 3600, n))
            ca = [_chat(rng, int(rng.integers(1, 3))) for _ in range(n)]
            tab = {"question_id": [f"q{i}" for i in range(n)], "model_a": list(rng.choice(models, n)),
                   "model_b": list(rng.choice(models, n)), "winner": ["model_a"] * n, "judge": ["arena_user"] * n,
                   "conversation_a": ca, "conversation_b": [_chat(rng, len(c) // 2) for c in ca],
                   "turn": [len(c) // 2 for c in ca], "anony": [True] * n, "language": ["English"] * n,
                   "tstamp": ts.tolist()}
        else:
            ts = np.sort(rng.uniform(1.68e9, 1.68e9 + 3600, n))
            conv = [_chat(rng, int(rng.integers(1, 4)), ts0=float(t)) for t in ts]
            tab = {"conversation_hash": [f"h{i}" for i in range(n)], "model": list(rng.choice(models, n)),
                   "timestamp": pd.to_datetime(ts, unit="s", utc=True), "conversation": conv,
                   "turn": [len(c) // 2 for c in conv], "language": ["English"] * n}
        pq.write_table(pa.Table.from_pydict(tab), path)
    else:
        raise KeyError(f"no sample writer for format {fmt!r}")
    return path


def write_sample_data_dir(root: str | Path, n: int = 200, seed: int = 0) -> Path:
    """A data directory with a sample file at every built-in real trace's path."""
    root = Path(root)
    (root / "README.md").parent.mkdir(parents=True, exist_ok=True)
    (root / "README.md").write_text("sample data directory written by traces.samples\n")
    for i, spec in enumerate(s for s in BUILTINS.values() if s.kind == "real"):
        dest = root / spec.file
        if spec.fmt == "azure-functions-2019":
            dest.mkdir(parents=True, exist_ok=True)
            write_sample(spec.fmt, dest / "invocations_per_function_md.anon.d01.csv", n, seed + i)
        elif spec.fmt in ("lmsys", "arena", "wildchat") and not dest.suffix:
            dest.mkdir(parents=True, exist_ok=True)
            write_sample(spec.fmt, dest / "train-00000-of-00001.parquet", n, seed + i)
        else:
            write_sample(spec.fmt, dest, n, seed + i)
    return root
