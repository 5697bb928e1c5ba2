"""Grid specifications: named grids, TOML / YAML files, enumeration."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from twin.sweep.grid import NAMED_GRIDS, grid_from_dict, load_grid, rank_multisets, rate_triples, scenario_key


def test_published_axes():
    assert len(rate_triples()) == 120
    ms = rank_multisets()
    assert len(ms) == 7
    assert [8, 16, 32] in ms and [32, 32, 8] not in ms and all(m.count(32) <= 1 for m in ms)
    g = load_grid("adapter-twin-llama")
    assert len(g.scenarios()) == 840
    assert len(g.configs()) == 55  # slots <= served over the 10 x 10 published grid
    assert g.n_runs_max() == 840 * 55
    assert load_grid("adapter-twin-qwen").profile.startswith("qwen")


def test_the_validated_llama_grid_is_the_published_one_on_the_validated_engine():
    """``adapter-twin-llama-validated``: the published Llama grid with the engine constants ``twin validate``
    uses (twin.validation.specs), carried by every scenario (so its task hashes are its own)."""
    from twin.sweep.grid import VALIDATED_ENGINE
    from twin.validation.specs import RANK_TILE_COST, SERVING_S_PER_RUNNING

    pub, val = load_grid("adapter-twin-llama"), load_grid("adapter-twin-llama-validated")
    assert VALIDATED_ENGINE == {"serving_us": pytest.approx(SERVING_S_PER_RUNNING * 1e6, rel=1e-9),
                                "rank_tile_cost": RANK_TILE_COST}
    assert (val.serving_us, val.rank_tile_cost) == (VALIDATED_ENGINE["serving_us"], RANK_TILE_COST)
    assert [s["key"] for s in val.scenarios()] == [s["key"] for s in pub.scenarios()]
    assert all(s["serving_us"] == val.serving_us and s["rank_tile_cost"] == RANK_TILE_COST for s in val.scenarios())
    assert (val.profile, val.served, val.slots) == (pub.profile, pub.served, pub.slots)
    assert val.digest() != pub.digest()


def test_the_adaptercheck_llama_grid_is_the_validated_one_on_the_adaptercheck_profile():
    """``adapter-twin-llama-adaptercheck``: the validated grid's scenarios and engine constants, run with the
    profile variant that prices vLLM's per-step adapter check; its tasks hash apart from the validated grid's."""
    from twin.perf.profile import load_profile

    val, chk = load_grid("adapter-twin-llama-validated"), load_grid("adapter-twin-llama-adaptercheck")
    assert chk.profile == "llama-3.1-8b_h100_vllm085_adaptercheck"
    assert "adapter_check" in load_profile(chk.profile).components
    assert [s["key"] for s in chk.scenarios()] == [s["key"] for s in val.scenarios()]
    assert (chk.serving_us, chk.rank_tile_cost, chk.served, chk.slots) == (
        val.serving_us, val.rank_tile_cost, val.served, val.slots)
    assert chk.digest() != val.digest()


def test_scenario_key_matches_real_folders():
    assert scenario_key([0.4, 0.05, 0.00625], [8, 16, 32]) == "rate_0.4-0.05-0.00625_size_8-16-32"
    assert scenario_key([3.2, 1.6, 0.025], [16, 16, 16]) == "rate_3.2-1.6-0.025_size_16-16-16"
    assert scenario_key([3.2, 1.6, 0.1], [8, 8, 32], [300, 100], "vllm") == \
        "rate_3.2-1.6-0.1_size_8-8-32_len_300-100_policy_vllm"


TOML = """
name = "tiny"
profile = "llama-3.1-8b_h100_vllm085"
window_s = 60
seeds = [0, 1]
[scenarios]
rates = [[0.4, 0.05, 0.00625]]
rank_values = [8, 16]
[configs]
served = [8, 16]
slots = [8, 16]
engine = { max_num_seqs = 512 }
[early_stop]
run = false
[slo]
ttft_s = 2.0
"""


def test_toml_grid(tmp_path):
    p = tmp_path / "g.toml"
    p.write_text(TOML)
    g = load_grid(p)
    assert g.name == "tiny" and g.window_s == 60 and g.seeds == [0, 1]
    assert g.ranks == [[8, 8, 8], [8, 8, 16]]  # 3-multisets of {8, 16} with at most one 16
    assert len(g.tasks()) == 1 * 2 * 2
    assert g.configs() == [(8, 8), (8, 16), (16, 16)]
    assert g.engine == {"max_num_seqs": 512} and g.early_stop_run is False and g.ttft_slo_s == 2.0
    t = g.tasks()[0]
    assert t["max_rank"] == max(t["scenario"]["ranks"])


def test_yaml_grid_same_as_toml(tmp_path):
    yaml = pytest.importorskip("yaml")
    import tomllib

    d = tomllib.loads(TOML)
    p = tmp_path / "g.yaml"
    p.write_text(yaml.safe_dump(d))
    q = tmp_path / "g.toml"
    q.write_text(TOML)
    assert load_grid(p).digest() == load_grid(q).digest()


def test_grid_errors(tmp_path):
    p = tmp_path / "bad.toml"
    p.write_text('[configs]\nservd = [8]\n')
    with pytest.raises(ValueError, match="servd"):
        load_grid(p)
    p.write_text('[configs]\nengine = { not_a_field = 1 }\n')
    with pytest.raises(ValueError, match="not_a_field"):
        load_grid(p)
    with pytest.raises(ValueError, match="unknown grid"):
        load_grid("no-such-grid")


@pytest.mark.parametrize("text, message", [
    ('window_s = "abc"', r"window_s: 'abc' is not a number > 0; e.g. window_s = 3600"),
    ("window_s = -5", r"window_s: -5 is not a number > 0"),
    ('seeds = ["a"]', r"seeds: 'a' is not an integer >= 0"),
    ('[scenarios]\nrates = "x"', r"\[scenarios\] rates: 'x' is not a list of non-empty lists; e.g. rates = "),
    ("[scenarios]\nrates = [[0.1, -1, 0.2]]", r"\[scenarios\] rates: -1 is not a number > 0"),
    ("[scenarios]\nranks = [[8, 16.5]]", r"\[scenarios\] ranks: 16.5 is not an integer > 0"),
    ("[scenarios]\nrate_values = [0.1]\nrate_arity = 0", r"rate_arity: 0 is not an integer > 0"),
    ("[scenarios]\nrate_values = [0.1]", r"rate_arity = 3: more than the 1 distinct rate_values"),
    ("[configs]\nserved = [0]", r"\[configs\] served: 0 is not an integer > 0"),
    ("[configs]\nserved = [16]\nslots = [32]", r"no configuration has slots <= served"),
    ('[configs]\nmax_lora_rank = "big"', r"max_lora_rank: 'big' is not an integer > 0"),
    ("[configs]\nengine = 3", r"engine: expected a table of EngineConfig fields"),
    ("[early_stop]\nratio = 2", r"ratio: 2 is above 1"),
    ("[early_stop]\nwalk = 1", r"walk: 1 is not true or false"),
    ("[slo]\nttft = 3", r"\[slo\]: unknown key 'ttft'"),
    ("[slo]\nttft_s = 0", r"\[slo\] ttft_s: 0 is not a number > 0"),
    ("scenarios = 3", r"\[scenarios\]: expected a table of keys, got int"),
    ('[configs]\nengine = { max_num_seqs = "abc" }', r"\[configs.engine\] max_num_seqs: 'abc' is not an int"),
    ("[configs]\nengine = { prefix_caching = 1 }", r"\[configs.engine\] prefix_caching: 1 is not a bool"),
    ("[configs]\nengine = { max_model_len = 1.5 }", r"max_model_len: 1.5 is not an int \(or absent\)"),
    # scalar keys of the wrong type (profile = 5 used to be a TypeError from inside the profile loader)
    ("profile = 5", r"grid profile: 5 is not a profile name or a JSON path \(a string\); e.g. profile = "),
    ("profile = [\"a\"]", r"grid profile: \['a'\] is not a profile name"),
    ("model = 3", r"grid model: 3 is not a model name \(a string\)"),
    # the grid's name is the default output directory sweeps/<name>: one directory name
    ('name = "../../escape"', r"grid name '../../escape' holds a path separator; .* sweeps/<name>"),
    ('name = ""', r"grid name '' is empty; .*give one directory name"),
    ('name = ".."', r"grid name '..' is not a directory name"),
    ("name = [1, 2]", r"grid name: \[1, 2\] is not a string; give one directory name"),
    # empty axes ran nothing and reported success
    ("[scenarios]\npolicy = []", r"\[scenarios\] policy: an empty list \(the grid would run nothing\); give at least"),
    ("[scenarios]\narrival = []", r"\[scenarios\] arrival: an empty list \(the grid would run nothing\)"),
    ("[scenarios]\npolicy = [[1]]", r"\[scenarios\] policy: \[1\] is not a name \(a string\)"),
    ("[scenarios]\narrival = [3]", r"\[scenarios\] arrival: 3 is not a name"),
    # a repeated value ran the same tasks twice
    ("seeds = [0, 0]", r"grid seeds: 0 is listed twice \(its runs would be done twice\); give each value once"),
    ("[configs]\nserved = [8, 8.0]", r"\[configs\] served: 8 is listed twice"),
    ("[configs]\nslots = [16, 8, 16]", r"\[configs\] slots: 16 is listed twice"),
    ("[configs]\nmax_lora_rank = [32, 32]", r"\[configs\] max_lora_rank: 32 is listed twice"),
    ("[scenarios]\nrates = [[0.4, 0.2], [0.4, 0.2]]", r"\[scenarios\] rates: \[0.4, 0.2\] is listed twice"),
    ("[scenarios]\nranks = [[8, 16], [8, 16]]", r"\[scenarios\] ranks: \[8, 16\] is listed twice"),
    ("[scenarios]\nrank_values = [8, 16, 8]", r"\[scenarios\] rank_values: 8 is listed twice"),
    ("[scenarios]\nlengths = [[222, 197], [222.0, 197]]", r"\[scenarios\] lengths: \[222.0, 197.0\] is listed twice"),
    ('[scenarios]\npolicy = ["vllm", "vllm"]', r"\[scenarios\] policy: 'vllm' is listed twice"),
    ('[scenarios]\narrival = ["poisson", "poisson"]', r"\[scenarios\] arrival: 'poisson' is listed twice"),
    # an engine override of an axis ran another configuration than the rows record
    ("[configs]\nengine = { max_loras = 3 }", r"\[configs.engine\] max_loras: set by the grid's slots axis for every "
                                              r"run .*give it as \[configs\] slots = \[...\] instead"),
    ("[configs]\nengine = { served_adapters = 3 }", r"\[configs.engine\] served_adapters: set by the grid's served axis"),
    ("[configs]\nengine = { max_lora_rank = 64 }", r"\[configs.engine\] max_lora_rank: set by the grid's max_lora_rank"),
    # engine constants beyond what twin run takes (a units or typing error)
    ("[scenarios]\nserving_us = 1e300", r"grid \[scenarios\] serving_us 1e\+300: more than 1e\+06 .*serving_us = 18"),
    ("[scenarios]\nrank_tile_cost = 1000", r"grid \[scenarios\] rank_tile_cost 1000: more than 100 "),
    # both forms of an axis: the generators were ignored silently
    ("[scenarios]\nrates = [[0.4, 0.2]]\nrate_values = [0.1, 0.2, 0.3]", r"grid \[scenarios\] rates and rate_values: "
                                                                      r"rates lists the tuples themselves, rate_values / "
                                                                      r"rate_arity generate them, so rate_values would be "
                                                                      r"ignored; give one of the two forms"),
    ("[scenarios]\nranks = [[8]]\nmax_largest = 2", r"grid \[scenarios\] ranks and max_largest: .*so max_largest "
                                                   r"would be ignored"),
    # the model its rows are recorded under: unknown, or not the profile's (ran llama's profile as qwen's runs)
    ('model = "nosuch"', r"grid model: unknown model 'nosuch'; known models: "),
    ('model = "qwen-2.5-7b"', r"grid model 'qwen-2.5-7b': the grid's profile 'llama-3.1-8b_h100_vllm085_adaptercheck' describes "
                              r"llama-3.1-8b, so its runs would be recorded as qwen-2.5-7b's; give model = "
                              r"\"llama-3.1-8b\""),
    # settings that ended every run in an error, rejected every request, or were ignored (exit 0)
    ("[configs]\nengine = { tensor_parallel = 3 }", r"\[configs.engine\] tensor_parallel: tensor-parallel degree 3 "
                                                    r"does not divide"),
    ("[configs]\nengine = { enable_lora = false }", r"\[configs.engine\] enable_lora = false: a sweep walks adapter "
                                                    r"slots"),
    ('[configs]\nengine = { lora_targets = "xyz" }', r"\[configs.engine\] lora_targets: unknown module 'xyz'"),
    ("[configs]\nengine = { max_num_seqs = 99999 }", r"\[configs.engine\]: max_num_batched_tokens \(2048\) must be >= "
                                                     r"max_num_seqs \(99999\)"),
    ("[configs]\nmax_lora_rank = [33]", r"\[configs\] max_lora_rank 33: vLLM accepts only 8, 16, 32"),
    # a request count of 303 digits
    ("window_s = 20\n[scenarios]\nrates = [[1e300]]\nranks = [[8]]\n[configs]\nserved = [8]\nslots = [8]",
     r"grid: its busiest run expects ~1.6e\+302 requests \(8 adapters"),
    # a window that holds no request: every run was recorded empty, as keeping up
    ("window_s = 1e-300\n[scenarios]\nrates = [[0.4, 0.2]]\nranks = [[8]]\n[configs]\nserved = [8]\nslots = [8]",
     r"grid: its busiest run expects ~2.4e-300 requests .*so every run would hold no request; lengthen window_s"),
])
def test_a_bad_grid_value_is_refused_naming_the_key_before_any_run(tmp_path, text, message):
    p = tmp_path / "bad.toml"
    p.write_text(text + "\n")
    with pytest.raises(ValueError, match=message):
        load_grid(p)


@pytest.mark.parametrize("engine", ["", "[configs]\nengine = { tensor_parallel = 4 }\n"])
def test_a_profile_calibrated_at_tp2_is_refused_at_another_degree(tmp_path, engine):
    """A profile calibrated at TP 2 prices a TP-2 server only (twin.tensor_parallel.tp_profile): a grid at TP 1 or 4
    ended every run in an error; it is refused before any run, naming the degree."""
    import json

    from twin.perf.profile import load_profile

    raw = dict(load_profile("llama-2-7b_a100-80gb_vidur").raw, tensor_parallel=2, name="tp2cal")
    prof = tmp_path / "tp2cal.json"
    prof.write_text(json.dumps(raw))
    p = tmp_path / "tp.toml"
    p.write_text(f'profile = "{prof}"\n' + engine)
    with pytest.raises(ValueError, match=r"\[configs.engine\] tensor_parallel: profile 'tp2cal' prices a server at "
                                         r"tensor-parallel degree 2"):
        load_grid(p)


def test_a_huge_seeds_list_is_refused_at_once(tmp_path):
    """200,001 seeds: refused by the task cap (the duplicate check before it was quadratic: minutes)."""
    p = tmp_path / "seeds.toml"
    p.write_text("seeds = [" + ", ".join(map(str, range(200_001))) + "]\n[scenarios]\nrates = [[0.4]]\n"
                 "ranks = [[8]]\n[configs]\nserved = [8]\nslots = [8]\n")
    with pytest.raises(ValueError, match=r"200,001 tasks \(scenarios x seeds\), more than 100,000; reduce the scenario "
                                         r"axes or seeds"):
        load_grid(p)


@pytest.mark.parametrize("name, text, message", [
    ("g.toml", "[scenarios\n", r"grid file .*g.toml: not valid TOML"),
    ("g.json", "not json", r"grid file .*g.json: not valid JSON"),
    ("g.yaml", "rates: [\n", r"grid file .*g.yaml: not valid YAML"),
    ("g.toml", "", r"grid file .*g.toml: the file is empty; give a grid \(`twin sweep --list`"),
    ("g.json", "[1, 2]", r"grid file .*g.json: expected a table of options, got list"),
    ("g.ini", "x = 1", r"grid file .*g.ini: unknown grid format '.ini'; give a .toml, .yaml/.yml or .json file$"),
    # a repeated key: PyYAML and json kept the last value silently (TOML refuses it itself)
    ("g.yaml", "scenarios:\n  rates: [[0.4]]\n  ranks: [[8]]\n  rates: [[0.1]]\n",
     r"grid file .*g.yaml: key 'rates' is given twice \(line 4\); give each option once"),
    ("g.json", '{"window_s": 20, "window_s": 60}', r"grid file .*g.json: key 'window_s' is given twice"),
])
def test_a_malformed_grid_file_is_refused_naming_the_file(tmp_path, name, text, message):
    if name.endswith(".yaml"):
        pytest.importorskip("yaml")
    p = tmp_path / name
    p.write_text(text)
    with pytest.raises(ValueError, match=message):
        load_grid(p)


def test_named_grids_build():
    for name in NAMED_GRIDS:
        assert load_grid(name).tasks()


def test_policy_names_are_checked_before_any_run(tmp_path):
    """A policy axis naming no `twin policies` preset, or a preset of the S-LoRA engine, is refused up
    front (the walk would record every run of the scenario as an error); the published policy and the
    vLLM-engine presets are accepted."""
    from twin.sweep.grid import check_policies

    check_policies(["fcfs+client-cap", "vllm", "ema-prefetch", "vllm-partition"])
    p = tmp_path / "g.toml"
    p.write_text('[scenarios]\nrates = [[0.4, 0.1, 0.05]]\nranks = [[8, 16, 32]]\npolicy = ["fcfs+client-cap", "fcfs-lru"]\n')
    with pytest.raises(ValueError, match="unknown policy 'fcfs-lru'.*twin policies"):
        load_grid(p).tasks()
    # a preset of the S-LoRA engine would run its scheduler and cache on the vLLM engine the sweep runs
    p.write_text('[scenarios]\nrates = [[0.4, 0.1, 0.05]]\nranks = [[8, 16, 32]]\npolicy = ["vllm", "chameleon"]\n')
    with pytest.raises(ValueError, match="policy 'chameleon' runs on the S-LoRA engine, but a sweep runs .*vllm-partition"):
        load_grid(p).tasks()


def test_policy_demo_grid():
    """The demonstration grid of the policy as a feature: 8 scenarios x 3 policies, one task each,
    the non-published policies in the scenario key."""
    g = load_grid("policy-demo")
    tasks = g.tasks()
    assert len(tasks) == 24 and g.window_s == 120.0
    assert sorted({t["scenario"]["policy"] for t in tasks}) == ["ema-prefetch", "fcfs+client-cap", "vllm-partition"]
    keys = {t["scenario"]["key"] for t in tasks}
    assert "rate_0.8-0.4-0.1_size_8-16-32" in keys and "rate_0.8-0.4-0.1_size_8-16-32_policy_vllm-partition" in keys


def test_unreachable_lengths_are_refused_before_any_run(tmp_path):
    """A lengths pair the ShareGPT-like model cannot reach under the real runs' filters is an error
    naming the reachable range at grid time (otherwise every run would fail building its workload)."""
    p = tmp_path / "g.toml"
    p.write_text('[scenarios]\nrates = [[0.4, 0.1, 0.05]]\nranks = [[8, 16, 32]]\nlengths = [[222, 197], [600, 300]]\n')
    with pytest.raises(ValueError, match=r"grid lengths \[600.0, 300.0\].*reachable range"):
        load_grid(p).tasks()
    p.write_text('[scenarios]\nrates = [[0.4, 0.1, 0.05]]\nranks = [[8, 16, 32]]\nlengths = [[222, 197], [400, 300]]\n')
    assert len(load_grid(p).tasks()) == 2


def test_the_shipped_policy_lengths_example_is_a_valid_grid():
    from pathlib import Path

    g = load_grid(Path(__file__).resolve().parents[2] / "results/configurator/policy_demo/policy_lengths.toml")
    tasks = g.tasks()
    assert len(tasks) == 8
    assert {tuple(t["scenario"]["lengths"]) for t in tasks} == {(222.0, 197.0), (400.0, 300.0)}


def test_the_committed_sweeps_keep_their_digest():
    """The digests of the committed sweep summaries are those of today's named grids: adding a grid
    key (``length_corr``, absent at its default) must not orphan the sweeps behind the shipped labels,
    whose directories resume only under the same digest."""
    import json
    from pathlib import Path

    res = Path(__file__).resolve().parents[2] / "results/configurator"
    for model in ("llama", "qwen"):
        summary = json.loads((res / f"sweep_{model}_summary.json").read_text())
        assert load_grid(summary["grid"]).digest() == summary["digest"], model


def test_length_corr_couples_every_scenario_and_changes_the_digest_only_when_set():
    base = {"name": "c", "window_s": 60, "scenarios": {"rates": [[0.4, 0.1, 0.05]], "ranks": [[8, 16, 32]]},
            "configs": {"served": [8], "slots": [8]}}
    plain = grid_from_dict(base)
    zero = grid_from_dict({**base, "scenarios": {**base["scenarios"], "length_corr": 0}})
    coupled = grid_from_dict({**base, "scenarios": {**base["scenarios"], "length_corr": -0.37}})
    assert plain.digest() == zero.digest() and plain.tasks()[0]["task_hash"] == zero.tasks()[0]["task_hash"]
    assert "length_corr" not in plain.tasks()[0]["scenario"]
    t = coupled.tasks()[0]
    assert t["scenario"]["length_corr"] == -0.37
    assert t["scenario"]["key"] == plain.tasks()[0]["scenario"]["key"]  # the real runs' folder name still
    assert coupled.digest() != plain.digest() and t["task_hash"] != plain.tasks()[0]["task_hash"]


def test_serving_us_reaches_every_run_and_changes_the_digest_only_when_set():
    """``[scenarios] serving_us`` (the serving path's host time): absent at 0, so every committed sweep keeps its
    digest and shard names; set, it is in each scenario, its rows, and the run's steps are longer."""
    from twin.sweep.scenario import run_config
    from twin.sweep.walk import scenario_columns

    base = {"name": "s", "window_s": 60, "scenarios": {"rates": [[3.2, 1.6, 0.8]], "ranks": [[8, 8, 16]]},
            "configs": {"served": [16], "slots": [16]}}
    plain = grid_from_dict(base)
    zero = grid_from_dict({**base, "scenarios": {**base["scenarios"], "serving_us": 0}})
    served = grid_from_dict({**base, "scenarios": {**base["scenarios"], "serving_us": 18}})
    assert plain.digest() == zero.digest() and plain.tasks()[0]["task_hash"] == zero.tasks()[0]["task_hash"]
    sc0, sc1 = plain.tasks()[0]["scenario"], served.tasks()[0]["scenario"]
    assert "serving_us" not in sc0 and sc1["serving_us"] == 18.0 and sc1["key"] == sc0["key"]
    assert served.digest() != plain.digest()
    assert scenario_columns(sc1)["serving_us"] == 18.0 and "serving_us" not in scenario_columns(sc0)
    a = run_config(sc0, 16, 16, 16, seed=0, window_s=60.0, profile=None, early_stop=False)
    b = run_config(sc1, 16, 16, 16, seed=0, window_s=60.0, profile=None, early_stop=False)
    assert b["itl_ms_mean"] > a["itl_ms_mean"] and b["requests"] == a["requests"]
    with pytest.raises(ValueError, match=r"serving_us"):
        grid_from_dict({**base, "scenarios": {**base["scenarios"], "serving_us": -1}})


def test_rank_tile_cost_reaches_every_run_and_changes_the_digest_only_when_set():
    """``[scenarios] rank_tile_cost`` (the LoRA shrink's rank tiles beyond the first): absent, the shipped sweeps'
    digests and shard names hold; set, it is in each scenario and its rows, and rank-32 steps are shorter."""
    from twin.sweep.runner import check_runnable
    from twin.sweep.scenario import run_config
    from twin.sweep.walk import scenario_columns

    base = {"name": "s", "window_s": 60, "scenarios": {"rates": [[3.2, 1.6, 0.8]], "ranks": [[8, 16, 32]]},
            "configs": {"served": [16], "slots": [16]}}
    plain = grid_from_dict(base)
    tiled = grid_from_dict({**base, "scenarios": {**base["scenarios"], "rank_tile_cost": 0.25}})
    sc0, sc1 = plain.tasks()[0]["scenario"], tiled.tasks()[0]["scenario"]
    assert "rank_tile_cost" not in sc0 and "rank_tile_cost" not in plain.to_dict()
    assert sc1["rank_tile_cost"] == 0.25 and sc1["key"] == sc0["key"] and tiled.digest() != plain.digest()
    assert tiled.tasks()[0]["task_hash"] != plain.tasks()[0]["task_hash"]
    assert scenario_columns(sc1)["rank_tile_cost"] == 0.25 and "rank_tile_cost" not in scenario_columns(sc0)
    a = run_config(sc0, 16, 16, 32, seed=0, window_s=60.0, profile=None, early_stop=False)
    b = run_config(sc1, 16, 16, 32, seed=0, window_s=60.0, profile=None, early_stop=False)
    assert b["itl_ms_mean"] < a["itl_ms_mean"] and b["requests"] == a["requests"]
    with pytest.raises(ValueError, match=r"rank_tile_cost"):
        grid_from_dict({**base, "scenarios": {**base["scenarios"], "rank_tile_cost": -1}})
    other = grid_from_dict({**base, "profile": "llama-2-7b_h100_vllm050",
                            "scenarios": {**base["scenarios"], "rank_tile_cost": 0.25}})
    with pytest.raises(ValueError, match=r"rank_tile_cost = 0.25: .*has no rank tiles"):
        check_runnable(other.tasks())


@pytest.mark.parametrize("bad", [1.0, -1, 1.5, "strong", True, float("nan"), [0.1]])
def test_an_impossible_length_corr_is_refused(bad):
    with pytest.raises(ValueError, match=r"grid \[scenarios\] length_corr: .* strictly between -1 and 1"):
        grid_from_dict({"scenarios": {"length_corr": bad}})


_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-5, 400), st.floats(allow_nan=True, allow_infinity=True),
                     st.text(max_size=4))
_VALUES = st.recursive(_SCALARS, lambda c: st.one_of(st.lists(c, max_size=4),
                                                      st.dictionaries(st.text(max_size=4), c, max_size=3)),
                       max_leaves=8)


def _section(keys: list[str]):
    return st.one_of(_VALUES, st.fixed_dictionaries({}, optional={k: _VALUES for k in keys}))


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.fixed_dictionaries({}, optional={
    **{k: _VALUES for k in ("name", "window_s", "seeds", "model")},
    "scenarios": _section(["rates", "rate_values", "rate_arity", "ranks", "rank_values", "rank_arity", "max_largest",
                           "lengths", "length_corr", "serving_us", "arrival", "policy"]),
    "configs": _section(["served", "slots", "max_lora_rank", "engine"]),
    "early_stop": _section(["walk", "run", "ratio"]),
    "slo": _section(["ttft_s", "tbt_s"])}))
def test_any_grid_table_gives_a_grid_or_a_clear_error(d):
    """Whatever a grid file holds, reading it and enumerating its tasks either works or raises the
    ValueError the CLI reports (never a TypeError or KeyError from inside)."""
    try:
        grid_from_dict(d).tasks()
    except ValueError:
        pass


def test_a_coupled_grid_draws_coupled_lengths_with_the_same_means():
    """``length_corr`` reaches the runs' request pools (:func:`twin.sweep.scenario.make_spec`): the
    prompt and output lengths of a coupled scenario are negatively rank-correlated, those of the
    default one are not, and both keep the scenario's mean lengths (the copula keeps the marginals)."""
    from scipy.stats import spearmanr

    from twin.sweep.scenario import build_workload, make_spec

    base = {"name": "c", "window_s": 600, "scenarios": {"rates": [[3.2, 1.6, 0.8]], "ranks": [[8, 16, 32]]},
            "configs": {"served": [8], "slots": [8]}}
    frames = {}
    for rho in (0.0, -0.37):
        g = grid_from_dict({**base, "scenarios": {**base["scenarios"], "length_corr": rho}})
        t = g.tasks()[0]
        spec = make_spec(t["scenario"], 8, 8, t["max_rank"], t["seed"], t["window_s"])
        assert spec.length_corr == rho
        frames[rho] = build_workload(spec)[0].df
    plain, coupled = frames[0.0], frames[-0.37]
    assert len(plain) == len(coupled) > 5000  # same seed: the same arrivals
    assert abs(spearmanr(plain.prompt_tokens, plain.output_tokens)[0]) < 0.05
    assert spearmanr(coupled.prompt_tokens, coupled.output_tokens)[0] < -0.25
    for col in ("prompt_tokens", "output_tokens"):
        assert coupled[col].mean() == pytest.approx(plain[col].mean(), rel=0.05)


def test_a_grid_file_named_by_its_file_needs_a_usable_name(tmp_path):
    """A grid without ``name`` is named after its file; a file name that is no directory name is
    refused naming where the name came from (the default output directory is sweeps/<name>)."""
    p = tmp_path / "..toml"
    p.write_text("[configs]\nserved = [8]\nslots = [8]\n")
    with pytest.raises(ValueError, match=r"grid name \(the file's name, as the grid sets no `name`\) '.' is not a "):
        load_grid(p)
    q = tmp_path / "fine.toml"
    q.write_text("[configs]\nserved = [8]\nslots = [8]\n")
    assert load_grid(q).name == "fine"


def test_rate_and_rank_tuples_of_different_lengths_are_a_valid_grid():
    """Rates and ranks are assigned to the served adapters round-robin each on its own
    (:func:`twin.validation.recreate.build_workload`; ``rate_arity`` and ``rank_arity`` are separate
    keys), so a pair of rates with a triple of ranks is a scenario, not a mismatch."""
    g = grid_from_dict({"name": "a", "window_s": 60, "scenarios": {"rates": [[0.4, 0.2]], "ranks": [[8, 16, 32]]},
                        "configs": {"served": [8], "slots": [8]}})
    (t,) = g.tasks()
    assert t["scenario"]["rates"] == [0.4, 0.2] and t["scenario"]["ranks"] == [8, 16, 32]


def test_a_policy_named_twice_under_another_spelling_is_a_duplicate():
    """A null or empty policy is the published one (as :func:`check_policies` takes it): listing it
    beside ``fcfs+client-cap`` would run the same scenarios (same keys) twice."""
    with pytest.raises(ValueError, match=r"\[scenarios\] policy: 'fcfs\+client-cap' is listed twice"):
        grid_from_dict({"scenarios": {"policy": ["fcfs+client-cap", ""]}})


def test_the_axes_a_grid_file_leaves_to_the_published_grid_are_named(tmp_path):
    """A grid file with only a name (or only a comment) is the whole published grid at the default
    profile, as the defaults intend; ``defaults_note`` says so (the CLI prints it on a dry run and before
    a sweep), and says nothing for a grid that sets its axes, nor for the named grids."""
    from twin.sweep.grid import defaults_note

    p = tmp_path / "only.toml"
    p.write_text("# nothing but a comment\n")
    g = load_grid(p)
    note = defaults_note(g, len(g.tasks()))
    assert "leaves rates, ranks, served, slots at the published grid's values" in note
    assert "profile at the default (" in note and "840 tasks x 55 configurations" in note
    q = tmp_path / "tiny.toml"
    q.write_text(TOML)
    g = load_grid(q)
    assert defaults_note(g, len(g.tasks())) == ""
    g = load_grid("smoke")
    assert defaults_note(g, len(g.tasks())) == ""
    r = tmp_path / "part.toml"
    r.write_text('profile = "llama-3.1-8b_h100_vllm085"\n[scenarios]\nrates = [[0.4, 0.2, 0.1]]\n'
                 'ranks = [[8, 16, 32]]\n[configs]\nserved = [8, 16]\n')
    g = load_grid(r)
    note = defaults_note(g, len(g.tasks()))
    assert note.startswith("grid 'part' leaves slots at the published grid's values:") and "profile" not in \
        note.split(":")[0]


def test_the_checks_keep_every_valid_grid_digest_and_task_hash(tmp_path):
    """The new checks (types, names, duplicates, empty axes) only refuse: a valid grid file reads to
    the same digest and task hashes as the GridSpec written by hand."""
    from twin.sweep.grid import GridSpec

    p = tmp_path / "tiny.toml"
    p.write_text(TOML)
    g = load_grid(p)
    ref = GridSpec(name="tiny", profile="llama-3.1-8b_h100_vllm085", window_s=60.0, seeds=[0, 1],
                   rates=[[0.4, 0.05, 0.00625]], ranks=[[8, 8, 8], [8, 8, 16]], served=[8, 16], slots=[8, 16],
                   engine={"max_num_seqs": 512}, early_stop_run=False, ttft_slo_s=2.0)
    assert g.digest() == ref.digest()
    assert [t["task_hash"] for t in g.tasks()] == [t["task_hash"] for t in ref.tasks()]


@pytest.mark.parametrize("table", [None, "tiny", [1, 2]])
def test_grid_from_dict_takes_a_dict(table):
    """None was a bare 'NoneType is not iterable'; a string was read as its letters ('unknown keys [i, n, t, y]')."""
    with pytest.raises(TypeError, match=f"grid: got {type(table).__name__}; give a dict"):
        grid_from_dict(table)


def test_a_relative_profile_path_is_read_relative_to_the_grid_file(tmp_path, monkeypatch):
    """``profile = "p.json"`` beside the grid file names that file from any directory (it was read
    from the current directory); a shipped profile's name stays a name."""
    import json

    from twin.perf.profile import load_profile

    (tmp_path / "grids").mkdir()
    (tmp_path / "grids" / "p.json").write_text(json.dumps(load_profile(None).to_dict()))
    (tmp_path / "grids" / "g.toml").write_text(TOML.replace('"llama-3.1-8b_h100_vllm085"', '"p.json"', 1))
    (tmp_path / "grids" / "named.toml").write_text(TOML)
    monkeypatch.chdir(tmp_path)
    assert load_grid("grids/g.toml").profile == str(tmp_path / "grids" / "p.json")
    assert load_grid("grids/named.toml").profile == "llama-3.1-8b_h100_vllm085"
    monkeypatch.chdir(tmp_path / "grids")  # from its own directory the grid is as written (and keeps its digest)
    assert load_grid("g.toml").profile == "p.json"


def test_every_policy_of_a_scenario_sees_the_same_workload():
    """Common random numbers across policies: the policy-demo's three policies drew different requests
    (410 / 379 / 369 at one scenario's 16 served adapters) because the policy was part of the seed."""
    from twin.sweep.scenario import make_spec, workload_key

    g = load_grid("policy-demo")
    by_policy = {}
    for t in g.tasks():
        if workload_key(t["scenario"]["key"]) == "rate_0.8-0.4-0.1_size_8-16-32":
            by_policy[t["scenario"]["policy"]] = make_spec(t["scenario"], 16, 8, t["max_rank"], 0, t["window_s"]).seed
    assert len(by_policy) == 3 and len(set(by_policy.values())) == 1
    other = [t for t in g.tasks() if workload_key(t["scenario"]["key"]) != "rate_0.8-0.4-0.1_size_8-16-32"][0]
    assert make_spec(other["scenario"], 16, 8, other["max_rank"], 0, other["window_s"]).seed not in by_policy.values()


def test_rate_and_rank_tuples_of_different_lengths_are_two_axes():
    """``rates = [[0.4, 0.1]]`` with ``ranks = [[8, 16, 32]]`` is a scenario, not a mismatch (unlike `configure
    search`, which takes one rate and one rank per adapter class): the ranks go round-robin over the served
    adapters and the rates round-robin, shuffled apart from the ranks (grid.py's docstring says so)."""
    import numpy as np

    import twin.sweep.grid as grid_module
    from traces.arrivals import assign_rates_round_robin

    g = grid_from_dict({"name": "two-rates", "window_s": 60, "scenarios": {"rates": [[0.4, 0.1]],
                                                                          "ranks": [[8, 16, 32]]},
                        "configs": {"served": [6], "slots": [6]}})
    (t,) = g.tasks()
    assert (t["scenario"]["rates"], t["scenario"]["ranks"]) == ([0.4, 0.1], [8, 16, 32])
    ranks = np.asarray([8, 16, 32])[np.arange(6) % 3]
    rates = assign_rates_round_robin([0.4, 0.1], 6, np.random.default_rng(0))
    assert sorted(rates) == [0.1] * 3 + [0.4] * 3 and len(ranks) == 6
    assert "need not be as long as each other" in " ".join(grid_module.__doc__.split())


def test_the_window_cut_is_a_request_time_over_the_window():
    """The share of the offered tokens still in flight at a window's end is about a request's time over the window
    (:func:`twin.sweep.grid.window_cut`); past a tenth of the line's margin :func:`~twin.sweep.grid.window_note`
    warns, and past the whole margin it says even an unloaded run reads as starving."""
    from twin.sweep.grid import WINDOW_MARGIN_SHARE, window_cut, window_note

    g = grid_from_dict({"window_s": 60, "scenarios": {"rates": [[0.4, 0.2]], "ranks": [[8]]},
                        "configs": {"served": [8, 16], "slots": [8]}})
    c = window_cut(g)
    assert 2.0 < c["request_s"] < 10.0  # 197 output tokens at ~14 ms a step, token-weighted
    assert c["cut"] == pytest.approx(c["request_s"] / 60) and c["margin"] == pytest.approx(0.1)
    assert c["min_window_s"] == pytest.approx(c["request_s"] / (WINDOW_MARGIN_SHARE * 0.1))
    assert "to spare is expected to read as starving" in window_note(g, "grid 'x'", "window_s")
    g.window_s = 20.0
    assert "even a run offered next to nothing is expected to read as starving" in window_note(g, "x", "window_s")
    g.window_s = c["min_window_s"] * 1.01
    assert window_note(g, "x", "window_s") == ""
    longer = grid_from_dict({"window_s": 60, "scenarios": {"rates": [[0.4, 0.2]], "ranks": [[8]],
                                                           "lengths": [[222, 197], [222, 600]]},
                             "configs": {"served": [8, 16], "slots": [8]}})
    assert window_cut(longer)["request_s"] > 2 * c["request_s"]  # the grid's longest request mix decides
