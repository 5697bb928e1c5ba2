"""The mixed-step bench part (calibration/bench/step.py) and its report (calibration/bench/step_report.py)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from calibration.bench.cli import build_parser
from calibration.bench.config import resolve_config
from calibration.bench.schema import STEP_BENCH_COLUMNS, STEP_BENCH_EXTRA
from calibration.bench.step_report import context_slopes, read_step_table, step_report

ROOT = Path(__file__).resolve().parents[2]


def _cfg(tmp_path, *extra: str):
    args = build_parser().parse_args(["--device", "cpu", "--out", str(tmp_path / "b"), "--quiet", *extra])
    return resolve_config(args, cuda_available=False)


# ---------------------------------------------------------------- the sweep's shapes (torch-free)
def test_step_shapes_follow_the_budget_fill_and_chunks(tmp_path):
    pytest.importorskip("torch", reason="torch is the optional calibration extra")
    from calibration.bench.step import step_shapes

    cfg = _cfg(tmp_path, "--step-decodes", "0,4,16", "--step-context", "64,512", "--step-prefill", "0,32,fill",
               "--step-prefill-ctx", "0,32", "--step-chunk", "16", "--step-budget", "64")
    shapes = step_shapes(cfg)
    assert all(s.batch_tokens <= 64 and s.batch_tokens > 0 for s in shapes)
    assert len(set(shapes)) == len(shapes)
    # decode-only shapes: context per decode = total // decodes
    dec_only = {(s.decodes, s.decode_ctx_per_seq) for s in shapes if s.prefill_tokens == 0}
    assert dec_only == {(4, 16), (4, 128), (16, 4), (16, 32)}
    # "fill" with 4 decodes: 60 tokens in ceil(60/16) = 4 chunks of 15
    fill4 = [s for s in shapes if s.decodes == 4 and s.prefill_seqs == 4]
    assert fill4 and all(s.chunk == 15 and s.prefill_tokens == 60 for s in fill4)
    # no decodes: prefill only, never with a decode context; 32 tokens = 2 chunks of 16
    assert {(s.prefill_seqs, s.chunk, s.prefill_ctx_before) for s in shapes if s.decodes == 0} == {
        (2, 16, 0), (2, 16, 32), (4, 16, 0), (4, 16, 32)}
    s = next(s for s in shapes if s.decodes == 16 and s.prefill_ctx_before == 32 and s.decode_ctx_per_seq == 32)
    assert s.context_tokens == 16 * 32 + s.prefill_seqs * 32
    assert s.cache_tokens == s.prefill_seqs * (32 + s.chunk) + 16 * 33


@pytest.mark.parametrize("flag,value,msg", [
    ("--step-prefill", "0,x", "not a whole number"),
    ("--step-decodes", "-4", "negative"),
    ("--step-chunk", "0", "must be >= 1"),
    ("--step-repeats", "0", "must be >= 1"),
    ("--step-time-limit", "0", "seconds > 0"),
    ("--lora-time-limit", "-5", "seconds > 0"),
    ("--lora-time-limit", "inf", "seconds > 0"),
])
def test_bad_step_options_are_refused_before_any_work(tmp_path, flag, value, msg):
    with pytest.raises(ValueError, match=msg):
        _cfg(tmp_path, flag, value)


def test_all_empty_steps_are_refused(tmp_path):
    with pytest.raises(ValueError, match="every step would be empty"):
        _cfg(tmp_path, "--step-decodes", "0", "--step-prefill", "0")


def test_gpu_defaults_reach_the_saturated_steps():
    from calibration.bench.config import GPU_DEFAULTS

    assert max(GPU_DEFAULTS["step_context"]) >= 300_000 and max(GPU_DEFAULTS["step_decodes"]) >= 800
    assert GPU_DEFAULTS["step_budget"] == 2048 and -1 in GPU_DEFAULTS["step_prefill"]


# ---------------------------------------------------------------- the model (torch)
def _naive_attention(model, shape, inp, q):
    """Every new token's attention, one sequence at a time, from the cache slots (float64)."""
    import torch

    H, Hk, hd = model.heads, model.kv_heads, model.head_dim
    G = H // Hk
    K = model.k_cache.double()
    V = model.v_cache.double()
    out = torch.zeros(shape.batch_tokens, H * hd, dtype=torch.float64)
    seqs = []  # (rows of q, cache slots of the sequence, prior tokens before the rows)
    start = 0
    for i in range(shape.prefill_seqs):
        n = shape.prefill_ctx_before + shape.chunk
        seqs.append((range(i * shape.chunk, (i + 1) * shape.chunk), range(start, start + n), shape.prefill_ctx_before))
        start += n
    L = shape.decode_ctx_per_seq + 1
    for j in range(shape.decodes):
        seqs.append((range(shape.prefill_tokens + j, shape.prefill_tokens + j + 1), range(start, start + L),
                     shape.decode_ctx_per_seq))
        start += L
    qd = q.double()
    for rows, slots, prior in seqs:
        for r_i, r in enumerate(rows):
            visible = list(slots)[: prior + r_i + 1]  # causal: the prior context and the tokens up to r
            for h in range(H):
                k = K[visible, h // G]
                v = V[visible, h // G]
                w = torch.softmax(k @ qd[r, h] / math.sqrt(hd), dim=0)
                out[r, h * hd:(h + 1) * hd] = w @ v
    return out


@pytest.mark.parametrize("impl", ["sdpa", "matmul"])
def test_attention_reads_each_sequence_from_its_own_cache_slots(tmp_path, impl):
    torch = pytest.importorskip("torch", reason="torch is the optional calibration extra")
    from calibration.bench.step import RandomLlama, StepShape, attention_impl

    if impl == "sdpa" and attention_impl(torch.device("cpu"), torch.float32)[0] != "sdpa":
        pytest.skip("torch's SDPA cannot run grouped heads here")
    cfg = _cfg(tmp_path)
    shape = StepShape(prefill_seqs=2, chunk=5, prefill_ctx_before=3, decodes=3, decode_ctx_per_seq=6)
    model = RandomLlama(cfg, torch.device("cpu"), torch.float32, shape.cache_tokens)
    inp = model.inputs(shape, seed=3)
    q = torch.randn(shape.batch_tokens, model.heads, model.head_dim, generator=torch.Generator().manual_seed(1))
    got = model._attention(q, shape, inp, impl).double()
    want = _naive_attention(model, shape, inp, q)
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-4)


def test_forward_writes_the_new_tokens_into_their_slots_and_both_attentions_agree(tmp_path):
    torch = pytest.importorskip("torch", reason="torch is the optional calibration extra")
    from calibration.bench.step import RandomLlama, StepShape, attention_impl

    cfg = _cfg(tmp_path)
    shape = StepShape(prefill_seqs=2, chunk=4, prefill_ctx_before=2, decodes=4, decode_ctx_per_seq=5)
    model = RandomLlama(cfg, torch.device("cpu"), torch.float32, shape.cache_tokens)
    inp = model.inputs(shape, seed=0)
    slots = inp["slots"].tolist()
    assert len(slots) == shape.batch_tokens == len(set(slots))
    # chunk i's new tokens follow its 2 prior tokens; decode j's token ends its region of 5 + 1
    assert slots[:4] == [2, 3, 4, 5] and slots[4:8] == [8, 9, 10, 11]
    assert slots[8:] == [12 + 5, 12 + 6 + 5, 12 + 12 + 5, 12 + 18 + 5]
    assert inp["sample"].tolist() == [3, 7, 8, 9, 10, 11]  # each chunk's last token, every decode
    untouched = [i for i in range(shape.cache_tokens) if i not in slots]
    before = model.k_cache[untouched].clone()
    a = model.logits(shape, inp, "matmul")
    assert torch.equal(model.k_cache[untouched], before)  # only the new tokens' slots are written
    assert a.shape == (6, model.vocab) and torch.isfinite(a).all()
    if attention_impl(torch.device("cpu"), torch.float32)[0] == "sdpa":
        b = model.logits(shape, inp, "sdpa")
        assert torch.allclose(a, b, atol=2e-3, rtol=2e-3)
    assert model.forward(shape, inp, "matmul").shape == (6,)


def test_run_steps_writes_the_table_and_honours_the_time_limit(tmp_path):
    torch = pytest.importorskip("torch", reason="torch is the optional calibration extra")
    from calibration.bench.step import run_steps, step_shapes

    cfg = _cfg(tmp_path, "--step-decodes", "0,4", "--step-context", "16,32,64", "--step-prefill", "0,fill",
               "--step-prefill-ctx", "0", "--step-repeats", "2", "--step-warmup", "0")
    rows, note = run_steps(cfg, torch.device("cpu"), torch.float32, log=lambda m: None)
    assert len(rows) == len(step_shapes(cfg)) and "stopped" not in note
    df = pd.DataFrame(rows, columns=STEP_BENCH_COLUMNS + STEP_BENCH_EXTRA)
    assert (df.time_ms_mean > 0).all() and (df.repeats == 2).all() and (df.device == "cpu").all()
    assert (df.layers == cfg.spec.layers).all() and (df.batch_tokens == df.prefill_tokens + df.decodes).all()
    assert df.notna().all().all()
    cfg.step_time_limit_s = 1e-9
    rows, note = run_steps(cfg, torch.device("cpu"), torch.float32, log=lambda m: None)
    assert len(rows) == 1 and "stopped after 1 of" in note and "--step-time-limit" in note


def test_harness_writes_step_bench_csv_and_notes_it(tmp_path):
    pytest.importorskip("torch", reason="torch is the optional calibration extra")
    from calibration.bench.cli import main

    out = tmp_path / "b"
    rc = main(["--device", "cpu", "--parts", "step", "--step-decodes", "0,4", "--step-context", "16,32,64",
               "--step-repeats", "1", "--step-warmup", "0", "--out", str(out), "--quiet"])
    assert rc == 0
    df = read_step_table(out)
    assert list(df.columns) == STEP_BENCH_COLUMNS + STEP_BENCH_EXTRA and len(df) > 0
    meta = json.loads((out / "bench_meta.json").read_text())
    assert meta["tables"]["step_bench.csv"] == len(df) and any(n.startswith("step:") for n in meta["notes"])


# ---------------------------------------------------------------- the report (torch-free)
def _synthetic(quad: float = 0.0) -> pd.DataFrame:
    """Times of a known graph_roofline step (ms), plus ``quad`` ms per (100k context)^2 beyond 100k."""
    rows = []
    for d in (0, 32, 128, 256, 512, 768):
        for c in ([0] if d == 0 else [25_000, 50_000, 100_000, 200_000, 300_000]):
            for p in (0, 512, 2048 - d):
                if p + d == 0 or p + d > 2048:
                    continue
                t = 12.0 + max(2.5, 0.0205 * (p + d)) + 0.0013 * d + 9.1e-5 * c
                t += quad * max(c - 100_000, 0) ** 2 / 1e10
                rows.append({"batch_tokens": p + d, "prefill_tokens": p, "prefill_seqs": -(-p // 256),
                             "prefill_ctx_before": 0, "decodes": d, "decode_ctx_per_seq": c // d if d else 0,
                             "context_tokens": c, "time_ms_mean": t, "time_ms_std": 0.0, "repeats": 5,
                             "device": "cuda", "model": "synthetic", "layers": 32, "time_ms_median": t})
    return pd.DataFrame(rows)


def test_report_recovers_a_linear_step_and_extrapolates_it():
    rep = step_report(_synthetic())
    assert rep.params["c_ctx"] == pytest.approx(9.1e-8, rel=1e-3)
    assert rep.params["c_seq"] == pytest.approx(1.3e-6, rel=1e-2)
    assert np.allclose(rep.table["ratio"], 1.0, atol=1e-3)
    assert set(rep.regions["region"].str.split(":").str[0]) == {"fit", "saturated", "beyond the calibration"}
    assert np.allclose(rep.slopes["last_over_first"], 1.0, atol=1e-3)


def test_report_flags_a_cost_the_linear_form_misses_beyond_the_calibration():
    rep = step_report(_synthetic(quad=10.0))  # +40 ms at 300k context
    reg = rep.regions.set_index(rep.regions["region"].str.split(":").str[0])
    assert reg.loc["fit", "median_ratio"] == pytest.approx(1.0, abs=1e-3)  # the fit region cannot see it
    assert reg.loc["saturated", "median_ratio"] > 1.2
    assert (rep.slopes["last_over_first"] > 2).all()
    assert context_slopes(rep.table).equals(rep.slopes)


def test_report_bad_inputs(tmp_path):
    with pytest.raises(FileNotFoundError, match="step_bench.csv"):
        read_step_table(tmp_path)
    (tmp_path / "step_bench.csv").write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="not a step bench table"):
        read_step_table(tmp_path)
    (tmp_path / "step_bench.csv").write_text(",".join(STEP_BENCH_COLUMNS) + "\n")
    with pytest.raises(ValueError, match="no rows"):
        read_step_table(tmp_path)
    from calibration.fitting.core import FitError

    with pytest.raises(FitError, match="calibration-like rows"):
        step_report(_synthetic(), fit_max_decodes=0, fit_max_context=0)
    # the time the report fits: present, a number > 0 in every row (a bare KeyError, a float() error, a
    # curve_fit failure or a nonsense report before); the shape counts whole numbers >= 0
    _synthetic().drop(columns=["time_ms_median"]).to_csv(tmp_path / "step_bench.csv", index=False)
    with pytest.raises(ValueError, match="missing column 'time_ms_median', the time the report fits"):
        read_step_table(tmp_path)
    for column, value, message in (("time_ms_median", "abc", "'abc' is not a time in ms > 0"),
                                   ("time_ms_median", np.nan, "an empty cell is not a time in ms > 0"),
                                   ("time_ms_median", -5.0, "-5.0 is not a time in ms > 0"),
                                   ("time_ms_mean", -5.0, "-5.0 is not a time in ms > 0"),  # (ignored before)
                                   ("time_ms_mean", np.nan, "an empty cell is not a time in ms > 0"),
                                   ("decodes", -5, "-5 is not a whole number >= 0")):
        df = _synthetic().astype({column: object})
        df.loc[3, column] = value
        df.to_csv(tmp_path / "step_bench.csv", index=False)
        with pytest.raises(ValueError, match=rf"row 4 \(line 5\), column {column}: {re.escape(message)}"):
            read_step_table(tmp_path)


def test_bench_report_cli(tmp_path, capsys):
    from twin.cli import main as twin_main

    d = tmp_path / "bench"
    d.mkdir()
    _synthetic(quad=10.0).to_csv(d / "step_bench.csv", index=False)
    md, csv = tmp_path / "r.md", tmp_path / "r.csv"
    assert twin_main(["calibrate", "bench-report", str(d), "--markdown", str(md), "--out", str(csv)]) == 0
    out = capsys.readouterr().out
    assert "saturated" in out and "measured/predicted" in out
    assert "| saturated" in md.read_text() and "ratio" in pd.read_csv(csv).columns
    assert twin_main(["calibrate", "bench-report", str(d), "--json"]) == 0
    js = json.loads(capsys.readouterr().out)
    assert {"params", "regions", "slopes"} <= set(js["step"]) and js["slot_grid"] is None
    assert twin_main(["calibrate", "bench-report", str(tmp_path / "none")]) == 2
    assert "no such bench directory" in capsys.readouterr().err
    # the unpacked device session: one folder per bench process, named in the error
    assert twin_main(["calibrate", "bench-report", str(tmp_path)]) == 2
    assert f"its folder(s) bench hold them; give one, e.g. {d}" in capsys.readouterr().err
    # an unknown --profile is refused without a slot-grid table too; --out / --markdown in new directories
    assert twin_main(["calibrate", "bench-report", str(d), "--profile", "nosuch"]) == 2
    assert "unknown profile 'nosuch'" in capsys.readouterr().err
    md, csv = tmp_path / "new" / "r.md", tmp_path / "new2" / "sub" / "r.csv"
    assert twin_main(["calibrate", "bench-report", str(d), "--markdown", str(md), "--out", str(csv)]) == 0
    assert md.is_file() and csv.is_file()
    # a figure in a format the report cannot draw, named before the fit (matplotlib refused it after the Markdown
    # was written); --profile, which prices the slot grid only, beside a bench without one
    md2 = tmp_path / "r2.md"
    assert twin_main(["calibrate", "bench-report", str(d), "--markdown", str(md2), "--plot", str(tmp_path / "p.txt")]) == 2
    assert "--plot " in (err := capsys.readouterr().err) and "give a .png, .pdf or .svg file" in err and not md2.exists()
    assert twin_main(["calibrate", "bench-report", str(d), "--profile", "qwen-2.5-7b_h100_vllm085"]) == 2
    assert "it prices the slot-grid kernels" in capsys.readouterr().err


def test_device_session_script_asks_for_a_valid_gpu_run(tmp_path, monkeypatch):
    """The prepared GPU script's bench commands parse and resolve (no argument error spends device time),
    measure together what the brief asks, each within its hard timeout, and write at most the 8 files a
    device run brings back: one tarball, packed after every process (a kill of the whole command keeps what
    finished), from work folders outside $OUT; TRITON_INTERPRET unset before any of them."""
    import re
    import shlex

    monkeypatch.chdir(ROOT)  # (the script runs from the repository root: --skip-measured is relative to it)
    text = (ROOT / "calibration" / "bench" / "device_session.sh").read_text()
    common = ["--device", "cuda", "--model-dims", "llama-3.1-8b", "--dtype", "bfloat16"]
    assert re.search(r'python3 -m calibration\.bench --device "\$DEVICE" "\$\{SIZE\[@\]\}" --dtype bfloat16 \\\n'
                     r'\s+--out', text)
    calls = re.findall(r"^\s*bench (\w+) (\d+) (.*?)(?<!\\)\n", text.replace("\\\n", " "), re.M)
    assert [c[0] for c in calls] == ["step", "step_qwen", "lora", "rest"]
    # their values on a GPU
    arrays = {"GRAPHS": "--step-graphs", "QWEN": "--model-dims qwen-2.5-7b", "NOREF": "--no-ref"}
    for name, value in arrays.items():
        assert re.search(rf"^{name}=\({re.escape(value)}\)$", text, re.M)
    cfgs = {}
    for name, limit, args in calls:
        for array, value in arrays.items():
            args = args.replace(f'"${{{array}[@]}}"', value)
        argv = common + ["--out", str(tmp_path / name)] + shlex.split(args)
        cfgs[name] = (resolve_config(build_parser().parse_args(argv), cuda_available=True), int(limit))
    for name, (cfg, _) in cfgs.items():
        assert cfg.device == "cuda" and not cfg.small and cfg.dtype == "bfloat16"
        assert cfg.spec.name == ("qwen-2.5-7b" if name == "step_qwen" else "llama-3.1-8b")
    assert cfgs["step"][0].step_graphs and cfgs["step_qwen"][0].step_graphs
    parts = {p for cfg, _ in cfgs.values() for p in cfg.parts}
    assert parts == {"check", "linear", "lora", "h2d", "load", "step"}
    lora, lora_limit = cfgs["lora"]
    assert min(lora.ranks) == 8 and max(lora.ranks) == 128 and min(lora.adapters) == 8 and max(lora.adapters) == 512
    assert min(lora.slots) == 8 and max(lora.slots) == 512 and lora.lora_time_limit_s < lora_limit - 30
    assert not lora.lora_refs
    assert lora.skip_measured.resolve() == (ROOT / "results/calibration/bench_h200/lora/lora_kernels.csv").resolve()
    step, step_limit = cfgs["step"]
    assert max(step.step_context) >= 300_000 and step.step_time_limit_s < step_limit - 30
    assert sum(limit for _, limit in cfgs.values()) <= 540  # the hard limits fit one 10-minute call
    # the files back: log.txt, env.txt and one tarball (the device tool returns at most 8), packed aside and renamed
    # after every bench process and once more at the end; the work folders outside $OUT
    assert re.search(r'tar -czf "\$OUT/bench\.tgz\.part" -C "\$W" .*'
                     r'&& mv -f "\$OUT/bench\.tgz\.part" "\$OUT/bench\.tgz"', text)
    assert re.search(r'rc=\$\?\n.*\n\s*pack\n\}', text) and re.search(r'^pack$', text, re.M)
    assert re.search(r'^W="\$\(mktemp -d "\$\{TMPDIR:-/tmp\}/', text, re.M) and '"$OUT/log.txt"' in text \
        and '"$OUT/env.txt"' in text
    assert re.search(r"^unset TRITON_INTERPRET$", text, re.M).start() < text.index('python3 -c "import torch')


def test_step_graphs_need_a_gpu_and_the_step_part(tmp_path):
    with pytest.raises(ValueError, match="--step-graphs captures CUDA graphs and needs --device cuda"):
        _cfg(tmp_path, "--step-graphs")
    argv = ["--device", "cuda", "--out", str(tmp_path), "--parts", "step", "--step-graphs"]
    assert resolve_config(build_parser().parse_args(argv), cuda_available=True).step_graphs
    argv = ["--device", "cuda", "--out", str(tmp_path), "--parts", "lora", "--step-graphs"]
    with pytest.raises(ValueError, match="--step-graphs sets the step part"):
        resolve_config(build_parser().parse_args(argv), cuda_available=True)


def test_step_graphs_capture_once_after_the_warmups_and_time_the_replays(tmp_path, monkeypatch):
    """``--step-graphs`` without a GPU: torch.cuda's graph machinery replaced by a recorder. The warm-ups run on the
    side stream before the capture, the step runs once inside it, the replays (not the eager step) are timed, and
    the graph's memory is released after each shape."""
    torch = pytest.importorskip("torch", reason="torch is the optional calibration extra")
    from calibration.bench import step as S

    log = []

    class Graph:
        def replay(self):
            log.append("replay")

        def __del__(self):
            log.append("graph freed")

    class Ctx:
        def __init__(self, name):
            self.name = name

        def __enter__(self):
            log.append(f"enter {self.name}")

        def __exit__(self, *exc):
            log.append(f"exit {self.name}")

    class Stream:
        def wait_stream(self, other):
            log.append("wait")

    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: Stream())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: Stream())
    monkeypatch.setattr(torch.cuda, "stream", lambda s: Ctx("side stream"))
    monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
    monkeypatch.setattr(torch.cuda, "graph", lambda g: Ctx("capture"))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: log.append("empty_cache"))

    def time_op(fn, device, warmup, repeats, flush=True):
        for _ in range(warmup + repeats):
            fn()
        return np.ones(repeats)

    monkeypatch.setattr(S, "time_op", time_op)

    class Model:
        def forward(self, shape, inp, impl):
            log.append("step")

    cfg = _cfg(tmp_path, "--step-warmup", "2", "--step-repeats", "3")
    cfg.step_graphs = True  # (a CPU config refuses the flag; the recorder stands in for the GPU)
    ms = S._time_step(Model(), None, {}, "sdpa", torch.device("cpu"), cfg)
    assert len(ms) == 3
    assert log == ["wait", "enter side stream", "step", "step", "exit side stream", "wait",
                   "enter capture", "step", "exit capture", "replay", "replay", "replay", "replay",
                   "graph freed", "empty_cache"]
    log.clear()
    cfg.step_graphs = False  # eager: the step itself, warm-ups included, no graph
    S._time_step(Model(), None, {}, "sdpa", torch.device("cpu"), cfg)
    assert log == ["step"] * 5


def test_report_fits_the_form_everywhere_and_reads_the_kv_bandwidth(tmp_path):
    """Beside the calibration-like fit: the form fitted on every shape (its adequacy), each line's
    least-squares context slope, and for a known model the cache bandwidth that slope implies."""
    rep = step_report(_synthetic())
    a = rep.meta["all_fit"]
    assert a["mape_pct"] < 0.1 and a["saturated_median_ratio"] == pytest.approx(1.0, abs=1e-3)
    assert np.allclose(rep.slopes["slope_lsq_ms_per_100k"], 9.1, rtol=1e-3)  # 9.1e-5 ms per token
    assert rep.meta["kv_bytes_per_context_token"] is None  # 'synthetic' is no model twin.model_spec knows
    quad = step_report(_synthetic(quad=10.0))
    assert quad.meta["all_fit"]["mape_pct"] > 1.0  # a curvature the linear term cannot follow, even fitted there
    df = _synthetic().assign(model="llama-3.1-8b", dtype="float16")
    rep = step_report(df)
    kv = 2 * 32 * 8 * 128 * 2  # layers, KV heads, head dim, bytes
    assert rep.meta["kv_bytes_per_context_token"] == kv
    from calibration.bench.step_report import report_markdown, summary_lines

    tbps = kv * 1e5 / 9.1e-3 / 1e12
    assert any(f"~{tbps:.2f} TB/s" in line for line in summary_lines(rep))
    md = report_markdown(rep, "x")
    assert f"~{tbps:.2f} TB/s" in md and "fitted on every shape" in md and "eager" in md
    rep.meta["cuda_graphs"] = True
    assert "CUDA graph" in report_markdown(rep, "x")


def test_report_fits_the_linear_form_too(tmp_path, capsys):
    """``graph_linear`` (the Qwen profile's form) recovers a linear step; on a roofline step its calibration-like
    fit reads a per-decode cost the full steps do not pay; an unknown form is refused."""
    df = _synthetic()
    lin = df.assign(time_ms_median=12.0 + 0.0205 * df["prefill_tokens"] + 0.03 * df["decodes"]
                    + 9.1e-5 * df["context_tokens"])
    rep = step_report(lin, form="graph_linear")
    assert rep.meta["form"] == "graph_linear" and rep.meta["constants"] == ["c0", "c_prefill", "c_decode", "c_ctx"]
    assert rep.params["c_decode"] == pytest.approx(3e-5, rel=1e-3) and np.allclose(rep.table["ratio"], 1, atol=1e-3)
    from calibration.bench.step_report import report_markdown

    assert "`graph_linear` fitted" in report_markdown(rep, "x") and "| `c_decode` |" in report_markdown(rep, "x")
    with pytest.raises(ValueError, match="form 'linear' is not one the report fits"):
        step_report(df, form="linear")
    from twin.cli import main as twin_main

    d = tmp_path / "b"
    d.mkdir()
    lin.to_csv(d / "step_bench.csv", index=False)
    assert twin_main(["calibrate", "bench-report", str(d), "--form", "graph_linear"]) == 0
    assert "graph_linear fitted on" in capsys.readouterr().out


# ---------------------------------------------------------------- the slot-grid report (torch-free)
def _grid_rows(l_cta=0.9e-6, l_active=22e-6, c=0.004, split64=1.0):
    """Triton slot-grid rows whose times follow known per-block costs (ms); ``split64`` prices a working
    shrink block below 128 tokens relative to one from 128."""
    rows = []
    for kernel, per_tile, bm in (("slot_shrink", 64, 32), ("slot_expand", 2, 64)):
        for S in (8, 32, 128, 512):
            for n in (4, 8, 32):
                for T in (16, 64, 256, 1024):
                    if n > S or n > T:
                        continue
                    launched = (S + 1) * -(-T // bm) * per_tile
                    working = n * -(-(T // n) // bm) * per_tile
                    rows.append({"kernel": kernel, "impl": "triton", "batch_tokens": T, "n_adapters": n, "slots": S,
                                 "blocks_launched": launched, "blocks_working": working, "device": "cuda",
                                 "time_ms_median": c + l_cta * launched + l_active * working
                                 * (split64 if kernel == "slot_shrink" and T < 128 else 1.0)})
    rows.append({**rows[0], "impl": "torch", "time_ms_median": 99.0})  # a reference row: left out
    return pd.DataFrame(rows)


def test_grid_report_recovers_the_per_block_costs_and_sets_the_profile_beside_them(tmp_path):
    from calibration.bench.grid_report import grid_report, read_grid_rows
    from twin.perf.profile import load_profile

    (tmp_path / "lora_kernels.csv").write_text(_grid_rows().to_csv(index=False))
    rows = read_grid_rows(tmp_path)
    assert (rows.impl == "triton").all()
    rep = grid_report(rows, load_profile("llama-3.1-8b_h100_vllm085"))
    fits = rep.fits.set_index("kernel")
    assert np.allclose(fits["l_cta_ns"], 0.9, rtol=1e-3) and np.allclose(fits["l_active_ns"], 22.0, rtol=1e-3)
    assert (fits["r2"] > 0.999).all() and rep.profile["l_cta_ns"] > 0
    assert rep.splits["working_ratio"] == pytest.approx(1.0, rel=1e-3)
    assert rep.profile["split64_cost"] == pytest.approx(0.58, abs=0.01)


@pytest.mark.parametrize("option,table,other,refusal", [
    ("--plot", "step_bench.csv", "lora_kernels.csv", "--plot draws the mixed steps"),
    ("--grid-plot", "lora_kernels.csv", "step_bench.csv", "--grid-plot draws the slot-grid kernels"),
])
def test_bench_report_figures(tmp_path, capsys, option, table, other, refusal):
    """Each figure is drawn from its own table, and refused, naming the table, in a directory without it."""
    from twin.cli import main as twin_main

    tables = {"step_bench.csv": _synthetic, "lora_kernels.csv": _grid_rows}
    d = tmp_path / "bench"
    d.mkdir()
    tables[table]().to_csv(d / table, index=False)
    png = tmp_path / "fig" / "figure.png"
    assert twin_main(["calibrate", "bench-report", str(d), option, str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (d / table).unlink()
    tables[other]().to_csv(d / other, index=False)
    assert twin_main(["calibrate", "bench-report", str(d), option, str(png)]) == 2
    assert refusal in capsys.readouterr().err


def test_grid_report_reads_the_shrink_split_regimes_apart(capsys):
    """A 64-split working block priced at half an 8-split one is read back as a ratio of 0.5; a table
    without rows of one regime gives no ratio rather than a fit on nothing."""
    from calibration.bench.grid_report import grid_lines, grid_markdown, grid_report, split_regimes

    rows = _grid_rows(split64=0.5).iloc[:-1]  # the Triton rows (read_grid_rows drops the torch reference)
    rep = grid_report(rows)
    assert rep.splits["working_ratio"] == pytest.approx(0.5, rel=1e-3)
    assert rep.splits["split64"]["rows"] + rep.splits["split8"]["rows"] == (rows.kernel == "slot_shrink").sum()
    assert any("ratio 0.50" in line for line in grid_lines(rep)) and "ratio 0.50" in grid_markdown(rep)
    assert split_regimes(rows[rows.batch_tokens >= 128]) is None


def test_grid_report_refuses_a_cpu_table(tmp_path):
    from calibration.bench.grid_report import read_grid_rows

    df = _grid_rows()
    df["impl"] = "torch"
    df.to_csv(tmp_path / "lora_kernels.csv", index=False)
    with pytest.raises(ValueError, match="only a GPU run"):
        read_grid_rows(tmp_path)
    df.drop(columns=["blocks_launched"]).to_csv(tmp_path / "lora_kernels.csv", index=False)
    with pytest.raises(ValueError, match="rerun the bench"):
        read_grid_rows(tmp_path)


def test_bench_report_cli_reads_both_tables(tmp_path, capsys):
    from twin.cli import main as twin_main

    d = tmp_path / "bench"
    d.mkdir()
    _synthetic().to_csv(d / "step_bench.csv", index=False)
    df = _grid_rows()
    df["impl"] = "torch"  # a CPU run: the step report stands, the grid report says why it is skipped
    df.to_csv(d / "lora_kernels.csv", index=False)
    assert twin_main(["calibrate", "bench-report", str(d)]) == 0
    out = capsys.readouterr().out
    assert "step report" in out and "slot-grid report skipped" in out
    _grid_rows().to_csv(d / "lora_kernels.csv", index=False)
    md = tmp_path / "r.md"
    assert twin_main(["calibrate", "bench-report", str(d), "--markdown", str(md)]) == 0
    assert "l_cta" in capsys.readouterr().out and "Slot-grid LoRA kernels" in md.read_text()
    (d / "step_bench.csv").unlink()
    assert twin_main(["calibrate", "bench-report", str(d), "--json"]) == 0
    js = json.loads(capsys.readouterr().out)
    assert js["step"] is None and len(js["slot_grid"]["fits"]) == 2
    (d / "lora_kernels.csv").unlink()
    assert twin_main(["calibrate", "bench-report", str(d)]) == 2
    assert "none of step_bench.csv, lora_kernels.csv, h2d_copy.csv here" in capsys.readouterr().err


def test_bench_report_reads_the_host_to_device_copies(tmp_path, capsys):
    """bench-report reads h2d_copy.csv too (it read the step and slot-grid tables only, so a device run's copies
    were summarised by nothing): the committed H200 table, written before the with_compute mode, in the text, the
    Markdown and the JSON."""
    import shutil

    from twin.cli import main as twin_main

    d = tmp_path / "h2d"
    d.mkdir()
    shutil.copy(ROOT / "results" / "calibration" / "bench_h200" / "linear_h2d_load" / "h2d_copy.csv", d)
    md = tmp_path / "r.md"
    assert twin_main(["calibrate", "bench-report", str(d), "--markdown", str(md)]) == 0
    out = capsys.readouterr().out
    assert "host-to-device copies (h2d_copy.csv, cuda)" in out
    assert re.search(r"pinned +x2 +5 ranks +51\.6-54\.5 GB/s +makespan / one copy's 1\.95-1\.99", out)
    assert "## Host-to-device copies" in md.read_text()
    assert twin_main(["calibrate", "bench-report", str(d), "--json"]) == 0
    js = json.loads(capsys.readouterr().out)
    assert js["step"] is None and js["slot_grid"] is None and len(js["h2d"]) == 6


def test_lora_sweep_honours_its_time_limit(tmp_path):
    """--lora-time-limit: the (module, rank) sweeps run in a seeded order and stop once the limit has passed,
    keeping the rows so far (the first sweep always runs), with a note."""
    torch = pytest.importorskip("torch", reason="torch is the optional calibration extra")
    pytest.importorskip("triton", reason="triton is the optional calibration extra")
    from calibration.bench.lora import module_shapes, run_lora_kernels

    cfg = _cfg(tmp_path, "--ranks", "8,16", "--lora-tokens", "1,8", "--adapters", "1", "--slots", "4",
               "--repeats", "1", "--warmup", "0", "--lora-time-limit", "1e-9")
    rows, note = run_lora_kernels(cfg, torch.device("cpu"), torch.float32, log=lambda m: None)
    pairs = len(module_shapes(cfg)) * 2
    assert f"stopped after 1 of {pairs}" in note and "--lora-time-limit" in note
    assert len({(r["module"], r["rank"]) for r in rows}) == 1 and rows
    cfg.lora_time_limit_s = None
    rows_all, note_all = run_lora_kernels(cfg, torch.device("cpu"), torch.float32, log=lambda m: None)
    assert "stopped" not in note_all and len({(r["module"], r["rank"]) for r in rows_all}) == pairs


# ---------------------------------------------------------------- the committed H200 run (results/calibration/bench_h200)
H200 = ROOT / "results" / "calibration" / "bench_h200"


def test_the_committed_h200_tables_give_the_figures_its_readme_states():
    """results/calibration/bench_h200/README.md quotes the reports of the committed tables: a change to the
    report code that moves them must move the README too."""
    from calibration.bench.grid_report import grid_report, read_grid_rows
    from twin.perf.profile import load_profile

    text = (H200 / "README.md").read_text()
    llama = step_report(read_step_table(H200 / "step_graphs_llama"))
    qwen = step_report(read_step_table(H200 / "step_graphs_qwen"))
    for rep, row in ((llama, "| Llama-3.1-8B | calibration-like shapes |"),
                     (qwen, "| Qwen-2.5-7B | calibration-like shapes |")):
        reg = rep.regions.set_index(rep.regions["region"].str.split(":").str[0])
        line = next(ln for ln in text.splitlines() if ln.startswith(row))
        assert f"**{reg.loc['saturated', 'median_ratio']:.3f}**" in line
        assert f"{rep.meta['all_fit']['mape_pct']:.1f} % (saturated {rep.meta['all_fit']['saturated_median_ratio']:.3f})" \
            in line.replace("median ", "")
    assert f"{llama.slopes['slope_lsq_ms_per_100k'].median():.2f} ms per 100k tokens for Llama" in text
    linear = step_report(read_step_table(H200 / "step_graphs_qwen"), form="graph_linear")
    assert f"({linear.regions.set_index('region').filter(like='saturated', axis=0)['median_ratio'].iloc[0]:.3f} median" \
        in text.replace("\n  ", " ")
    grid = grid_report(read_grid_rows(H200 / "lora"), load_profile("llama-3.1-8b_h100_vllm085"))
    fits = grid.fits.set_index("kernel")
    assert f"| slot_shrink | {fits.loc['slot_shrink', 'l_cta_ns']:.3f} | {fits.loc['slot_shrink', 'l_active_ns']:.2f} |" in text
    assert f"| slot_expand | {fits.loc['slot_expand', 'l_cta_ns']:.3f} |" in text
    assert f"The ratio is {grid.splits['working_ratio']:.2f} ± {grid.splits['working_ratio_se']:.2f}" in text
