"""``calibration.offline_replay``: end-to-end replay of the calibration's offline runs."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from calibration.offline_replay import (PROFILE_OF_MODEL, estimate_client_start, offline_runs, profile_for_model,
                                        replay_figure, replay_offline_runs, replay_run, summary, write_markdown)
from twin.perf.profile import load_profile


def _run(**kw) -> dict:
    r = {"model": "llama-3.1-8b-instruct", "experiment": "decode_sweep", "run_dir": "_x_", "max_num_seqs": 8.0,
         "adapter_slots": np.nan, "max_lora_rank": np.nan, "adapter_rank": np.nan, "adapters_used": 0,
         "num_prompts": 24, "input_tokens_per_req": 30.0, "output_tokens_per_req": 6.0, "kv_cache_tokens": 50_000.0,
         "max_num_batched_tokens": 2048.0, "engine_steps": 40.0, "duration_s": 1.0, "mean_ttft_ms": 100.0,
         "mean_itl_ms": 10.0, "total_tok_s": 1000.0, "ts_mean_running": 8.0, "status": "ok", "lora": False,
         "fitted": True}
    r.update(kw)
    return r


@pytest.fixture(scope="module")
def profile():
    return load_profile(None)


def test_offline_runs_keeps_successful_runs_and_marks_those_with_a_step_log():
    step = pd.DataFrame([_run(), _run(run_dir="_y_", engine_steps=np.nan), _run(run_dir="_z_", status="failed")])
    lora = pd.DataFrame([_run(experiment="lora_overhead", run_dir="_l_", adapter_slots=16.0, adapters_used=4,
                              adapter_rank=8.0, max_lora_rank=8.0)])
    runs = offline_runs(step.drop(columns=["lora", "fitted"]), lora.drop(columns=["lora", "fitted"]))
    assert list(runs["run_dir"]) == ["_x_", "_y_", "_l_"]
    assert list(runs["fitted"]) == [True, False, True]
    assert list(runs["lora"]) == [False, False, True]
    assert runs.loc[runs["run_dir"] == "_l_", "adapters_used"].item() == 4
    assert runs.attrs["skipped"] == [("_z_", "failed")]  # (named by replay-offline: it was dropped in silence)


def test_replay_run_finishes_every_request_with_the_runs_batch_limit(profile):
    t = replay_run(_run(max_num_seqs=np.nan), profile)
    assert t["finished"] == 24 and t["max_num_seqs"] == 256  # vLLM's default under 70 GiB
    assert t["duration_s"] > 0 and t["itl_ms_mean"] > 0
    one = replay_run(_run(output_tokens_per_req=1.0), profile)
    assert one["itl_ms_mean"] is None  # one output token: no gap to compare


def test_client_start_shifts_the_sends_and_counts_ttft_from_each_requests_start(profile):
    """All requests reach the server at n * tau; request i's clock starts at i * tau. The engine sees
    the same workload shifted in time, so its part is unchanged."""
    base = replay_run(_run(), profile)
    tau = 0.002
    shifted = replay_run(_run(), profile, client_start_s=tau)
    n = 24
    assert shifted["duration_s"] == pytest.approx(base["duration_s"] + n * tau, abs=1e-9)
    expected = base["ttft_ms_mean"] + (n * tau - tau * (n - 1) / 2) * 1e3
    assert shifted["ttft_ms_mean"] == pytest.approx(expected, rel=1e-9)
    assert shifted["itl_ms_mean"] == pytest.approx(base["itl_ms_mean"], rel=1e-12)


def test_lora_runs_draw_adapters_at_random_and_find_them_preloaded(profile):
    r = _run(experiment="lora_overhead", adapter_slots=16.0, adapters_used=12, adapter_rank=8.0, max_lora_rank=8.0,
             lora=True, num_prompts=60)
    t = replay_run(r, profile, seed=3)
    assert t["adapter_loads"] == 0  # pre-loaded (lora_pre_loading): no start-up load on the clock
    again = replay_run(r, profile, seed=3)
    assert again == t  # seeded


def test_estimate_client_start_recovers_a_known_excess(profile):
    run = _run(experiment="prefill_sweep", output_tokens_per_req=1.0, num_prompts=40)
    twin = replay_run(run, profile)["duration_s"]
    runs = offline_runs(pd.DataFrame([{**run, "duration_s": twin + 40 * 0.0013}]).drop(columns=["lora", "fitted"]),
                        None)
    assert estimate_client_start(runs, profile) == pytest.approx(0.0013, rel=1e-9)
    assert estimate_client_start(runs[runs["experiment"] == "none"], profile) is None


def test_summary_and_report_split_fitted_from_never_fitted_runs(profile, tmp_path):
    runs = offline_runs(pd.DataFrame([_run(), _run(run_dir="_n_", engine_steps=np.nan)]).drop(
        columns=["lora", "fitted"]), None)
    rows = replay_offline_runs(runs, profile)
    s = summary(rows)
    assert s["fitted"]["runs"] == 1 and s["not_fitted"]["runs"] == 1
    b = s["fitted"]["decode_sweep"]
    t, r = rows.loc[0, "twin_duration_s"], rows.loc[0, "real_duration_s"]
    assert b["smape_duration_s"] == pytest.approx(abs(t - r) / (t + r) * 100)
    assert s["not_fitted_ratios"][0]["run_dir"] == "_n_"
    json.dumps(s)
    md = tmp_path / "r.md"
    write_markdown(rows, {**s, "client_start_ms": 1.0}, md, "twin calibrate replay-offline", profile.name)
    text = md.read_text()
    assert "`_n_`" in text and "1.00 ms per request" in text


def test_replay_figure_draws_each_kind_of_run_on_three_panels(profile):
    runs = offline_runs(pd.DataFrame([_run(), _run(run_dir="_n_", engine_steps=np.nan)]).drop(
        columns=["lora", "fitted"]), None)
    fig = replay_figure(replay_offline_runs(runs, profile), "t")
    axes = fig.get_axes()
    assert len(axes) == 3
    # one point per kind of run on every panel (duration, TTFT in s, ITL)
    assert [len(ax.collections) for ax in axes] == [2, 2, 2]
    ttft = axes[1].collections[0].get_offsets()[0]
    assert ttft[0] == pytest.approx(0.1)  # the real mean TTFT, 100 ms, drawn in seconds


def test_profile_for_model_names_the_shipped_profiles():
    for model, prof in PROFILE_OF_MODEL.items():
        assert profile_for_model(model) in (prof, prof + "_adaptercheck")
        load_profile(profile_for_model(model))
    assert profile_for_model("llama-3.1-8b") == "llama-3.1-8b_h100_vllm085_adaptercheck"  # the default profile
    with pytest.raises(ValueError, match="give --profile"):
        profile_for_model("llama-2-7b")


# real data (skips without TWIN_DATA_DIR)

def test_replay_offline_reproduces_the_never_fitted_lora_runs(real_data):
    """The twin replays the Llama LoRA runs whose windows the fit never saw (224-300 adapters, and
    find_max_batch's saturated mixed steps) within a few percent."""
    from calibration.fitting.tables import Vllm085Tables

    t = Vllm085Tables.read(real_data / "calibration" / "vllm085_h100", "llama-3.1-8b")
    runs = offline_runs(t.step_runs, t.lora_runs)
    tau = estimate_client_start(runs, "llama-3.1-8b_h100_vllm085")
    assert 0.5e-3 < tau < 2e-3
    rows = replay_offline_runs(runs[~runs["fitted"]], "llama-3.1-8b_h100_vllm085", client_start_s=tau)
    s = summary(rows)["not_fitted"]
    assert s["lora_overhead"]["runs"] >= 10
    assert s["lora_overhead"]["smape_mean_itl_ms"] < 3 and s["lora_overhead"]["smape_duration_s"] < 3
    assert s["find_max_batch"]["smape_mean_itl_ms"] < 5


def test_cli_replay_offline(real_data, tmp_path, capsys):
    from twin.cli import main

    out = tmp_path / "o.csv"
    assert main(["calibrate", "replay-offline", "--model", "qwen-2.5-7b", "--out", str(out), "--json",
                 "--data-dir", str(real_data)]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["model"] == "qwen-2.5-7b" and s["runs"] == len(pd.read_csv(out)) > 0
    assert 0.5 < s["client_start_ms"] < 2.0


@pytest.mark.parametrize("argv, message", [
    (["--client-start-ms", "-1"], "--client-start-ms -1.0: give the start-up time"),
    (["--model", "nope"], "unknown model 'nope'"),
    (["--model", "llama-2-7b"], "no shipped profile for the calibration model"),
    (["--out", "x.txt"], "--out"),
    (["--figure", "x.pdf"], "--figure"),
    (["--data-dir", "/nonexistent-twin-data"], "set TWIN_DATA_DIR"),
])
def test_cli_replay_offline_refuses_bad_input_before_any_work(argv, message, capsys):
    from twin.cli import main

    assert main(["calibrate", "replay-offline", *argv]) == 2
    err = capsys.readouterr().err
    assert "twin calibrate replay-offline:" in err and message in err


@pytest.mark.parametrize("model, profile, own", [
    ("qwen-2.5-7b", "llama-3.1-8b_h100_vllm085", "qwen-2.5-7b_h100_vllm085"),
    ("llama-3.1-8b", "qwen-2.5-7b_h100_vllm085", "llama-3.1-8b_h100_vllm085"),
    ("llama-3.1-8b", "llama-2-7b_h100_vllm050", "llama-3.1-8b_h100_vllm085"),
    ("llama-3.1-8b", "FILE", "llama-3.1-8b_h100_vllm085"),  # a profile file: its recorded model
])
def test_cli_replay_offline_refuses_a_profile_of_another_model(model, profile, own, tmp_path, capsys):
    """`replay-offline --model qwen-2.5-7b --profile llama-3.1-8b_h100_vllm085` exited 0, replaying Qwen's runs
    through Llama's constants; refused before the data is read (the missing --data-dir is never reached)."""
    from twin.cli import main
    from twin.perf.profile import available_profiles

    if profile == "FILE":
        profile = str(tmp_path / "mine.json")
        (tmp_path / "mine.json").write_bytes(available_profiles()["qwen-2.5-7b_h100_vllm085"].read_bytes())
    its = load_profile(profile).model.name
    assert its != model
    assert main(["calibrate", "replay-offline", "--model", model, "--profile", profile,
                 "--data-dir", "/nonexistent-twin-data", "--out", str(tmp_path / "o.csv")]) == 2
    out, err = capsys.readouterr()
    assert not out and "Traceback" not in err and not (tmp_path / "o.csv").exists()
    assert err.startswith(f"twin calibrate replay-offline: error: --profile {profile}: a profile of {its}, but "
                          f"--model {model} replays the runs of {model}; leave --profile out (the model's shipped "
                          f"profile) or pass a profile of {model} (shipped: ")
    shipped = err.split("(shipped: ")[1].strip().rstrip(")").split(", ")
    assert own in shipped and all(n.startswith(f"{model}_") for n in shipped)


def test_cli_replay_offline_takes_a_profile_of_its_model(capsys):
    """The model check lets a profile of the replayed model through (the run stops at the missing data after it)."""
    from twin.cli import main

    assert main(["calibrate", "replay-offline", "--model", "llama-3.1-8b", "--profile", "llama-3.1-8b_h100_vllm085",
                 "--data-dir", "/nonexistent-twin-data"]) == 2
    assert "set TWIN_DATA_DIR" in capsys.readouterr().err
