"""Profile checks at load time (twin/perf/profile.py) of what the engine reads: every constant's sign as its form
declares it (:attr:`twin.perf.forms.PerfModel.nonneg_params`), the step terms over the whole range the twin runs,
the measured tensor-parallel tables, the load table by max rank, the calibrated degree; and the adapter-load
prices under tensor parallelism (:meth:`twin.perf.forms.LinkLoad.predict`)."""

from __future__ import annotations

import copy
import io
import json
from contextlib import redirect_stderr, redirect_stdout

import pytest

from twin.perf.forms import FORMS
from twin.perf.profile import Profile, available_profiles, load_profile

ADAPTERCHECK = "llama-3.1-8b_h100_vllm085_adaptercheck"
A100 = "llama-2-7b_a100-80gb_vidur"


def _raw(name: str) -> dict:
    return copy.deepcopy(load_profile(name).raw)


def _write(tmp_path, d: dict, name: str = "edited") -> str:
    p = tmp_path / f"{name}.json"  # (profile files are cached by path: one name per content)
    p.write_text(json.dumps(d))
    return str(p)


def _refused(tmp_path, d: dict) -> str:
    path = _write(tmp_path, d)
    with pytest.raises(ValueError) as e:
        load_profile(path)
    msg = str(e.value)
    assert msg.startswith(f"profile file {path} is not a valid profile: "), msg
    return msg


def _twin(argv: list[str]) -> tuple[int, str, str]:
    from twin.cli import main

    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = main(argv)
    return rc, out.getvalue(), err.getvalue()


# ------------------------------------------------------------------------------------------ signs (defect 3)
@pytest.mark.parametrize("kind,key,value,fragment", [
    # each loaded before: negative component times at large batches, the five sampled batches outweighing them
    ("lora", "l_active", -1e-9, "components.lora.params.l_active is -1e-09 (s/working thread block); the kernel_grid "
                                "form's l_active is a cost"),
    ("lora", "l_cta", -1e-11, "components.lora.params.l_cta is -1e-11"),
    ("scheduler", "k_blocked", -1e-6, "components.scheduler.params.k_blocked is -1e-06"),
    ("scheduler", "k1_sq", -1e-8, "components.scheduler.params.k1_sq is -1e-08"),
    ("adapter_check", "c_pair", -2e-7, "components.adapter_check.params.c_pair is -2e-07"),
])
def test_a_negative_constant_is_refused_whatever_the_sampled_batches_say(tmp_path, kind, key, value, fragment):
    d = _raw(ADAPTERCHECK)
    d["components"][kind]["params"][key] = value
    msg = _refused(tmp_path, d)
    assert fragment in msg and "must be >= 0" in msg and "twin calibrate fit" in msg, msg


def test_backbone_signs_come_from_the_form_not_the_files_units(tmp_path):
    """Without its ``units`` the file's negative c_ctx loaded: step_s(0, 1, 300000, ...) was -0.0017 s."""
    d = _raw(ADAPTERCHECK)
    d["components"]["backbone"].pop("units")
    d["components"]["backbone"]["params"]["c_ctx"] = -5e-8
    msg = _refused(tmp_path, d)
    assert "components.backbone.params.c_ctx is -5e-08 s/context token; a base-model time must be >= 0" in msg


def test_every_form_declares_the_signs_of_its_costs():
    """Each registered form names its non-negative constants; every constant of a time, a cost or a byte count
    is among them (the signed ones: linear_queue's k3, a KV budget's free_bytes)."""
    import twin.perf.slora_forms  # noqa: F401  (registers the paged form)

    signed = {("scheduler", "linear_queue"): {"k3"}, ("kv", "memory_budget"): {"free_bytes"},
              ("kv", "memory_budget_affine"): {"free_bytes"}}
    dims = {"layers", "hidden", "intermediate", "q_dim", "kv_dim", "vocab", "graph_max_tokens"}
    for (kind, form), cls in FORMS.items():
        declared = set(cls.nonneg_params) | set(cls.positive_params)
        unsigned = set(cls.param_names) - declared - dims - signed.get((kind, form), set())
        assert not unsigned, (kind, form, unsigned)


def test_the_range_check_refuses_a_signed_constant_negative_beyond_the_sampled_batches(tmp_path):
    """linear_queue's k3 may be negative (the published K3 ~ -K2), but not so that the scheduler time is: at 512
    slots for one served adapter, k2 + k3 * 512 < 0."""
    d = _raw(ADAPTERCHECK)
    d["components"]["scheduler"] = {"form": "linear_queue", "params": {"k0": 1e-4, "k1": 1e-6, "k2": 1e-6,
                                                                         "k3": -1e-6}}
    msg = _refused(tmp_path, d)
    assert "the scheduler time of " in msg and "not a duration >= 0" in msg and "components.scheduler.params" in msg
    d["components"]["scheduler"]["params"]["k3"] = -0.5e-6 / 512  # (never below 0 in the range)
    load_profile(_write(tmp_path, d, "within"))


def test_a_negative_step_is_impossible_in_the_range_for_every_shipped_profile():
    """The range check itself: every term of every shipped profile, TP tables included, is >= 0 on the corners."""
    for name in available_profiles():
        p = load_profile(name)
        p._check_range(name)
        for tp in (p.raw["components"]["backbone"].get("tensor_parallel") or {}):
            from twin.tensor_parallel import tp_profile

            assert tp_profile(p, int(tp)).step_s(0, 1024, 300_000, 1024, 512, 128, 512, 1024, 10_000, 512) > 0


# ------------------------------------------------------------------------------------------ TP tables (defect 2a, c)
@pytest.mark.parametrize("edit,fragment", [
    # a TP-2 run at "simulated s -0.1" and ITL p99 -44 ms
    (lambda t: t["2"]["params"].__setitem__("c0", -0.05), "components.backbone.tensor_parallel.2.params.c0 is -0.05 s; "
                                                          "a base-model time must be >= 0"),
    # "could not convert string to float: 'x'"
    (lambda t: t["2"]["params"].__setitem__("c_tok", "x"), "components.backbone.tensor_parallel.2.params.c_tok is the "
                                                           "text 'x', not a number"),
    # silently the TP-1 value
    (lambda t: t["2"]["params"].pop("c_seq"), "components.backbone.tensor_parallel.2.params lacks ['c_seq']; a TP "
                                              "table replaces the TP-1 constants"),
    (lambda t: t["2"]["params"].__setitem__("c_sek", 1e-6), "tensor_parallel.2.params: unknown parameter(s) ['c_sek']"),
    (lambda t: t.__setitem__("two", t.pop("2")), "components.backbone.tensor_parallel: key 'two' is not a "
                                                 "tensor-parallel degree"),
    (lambda t: t.__setitem__("2", [1]), "components.backbone.tensor_parallel.2 is a JSON list"),
    (lambda t: t["4"]["params"].__setitem__("c_ctx", -1e-6), "tensor_parallel.4.params.c_ctx is -1e-06 s/context token"),
])
def test_a_broken_tp_table_is_refused_naming_its_key(tmp_path, edit, fragment):
    d = _raw(A100)
    edit(d["components"]["backbone"]["tensor_parallel"])
    msg = _refused(tmp_path, d)
    assert fragment in msg, msg


def test_a_negative_tp_table_no_longer_runs_backwards(tmp_path):
    d = _raw(A100)
    d["components"]["backbone"]["tensor_parallel"]["2"]["params"]["c0"] = -0.05
    rc, out, err = _twin(["run", "--no-progress", "--profile", _write(tmp_path, d), "--tp", "2", "--duration", "20"])
    assert rc == 2 and out == "" and "tensor_parallel.2.params.c0 is -0.05" in err and "Traceback" not in err, err


@pytest.mark.parametrize("value,fragment", [
    ("two", "tensor_parallel is the text 'two'; give the tensor-parallel degree"),  # "invalid literal for int()"
    (2.5, "tensor_parallel is 2.5; give the tensor-parallel degree"),               # (ran as 2)
    (True, "tensor_parallel is true (a JSON boolean)"),
    (0, "tensor_parallel is 0; give"),
    (3, "tensor_parallel is 3, a degree llama-2-7b cannot be split by"),
])
def test_the_calibrated_degree_is_a_degree_of_the_model(tmp_path, value, fragment):
    d = _raw(A100)
    d["tensor_parallel"] = value
    assert fragment in _refused(tmp_path, d)


def test_a_calibrated_degree_loads():
    d = _raw(A100)
    d["tensor_parallel"] = 2
    assert Profile.from_dict(d, "tp2").raw["tensor_parallel"] == 2


# ------------------------------------------------------------------------------------------ load tables (defect 2b)
@pytest.mark.parametrize("value,fragment", [
    (-1.0, "components.load.table_by_max_rank_s.cpu.32.8 is -1.0; a load time must be >= 0 s"),  # "Negative delay"
    ("fast", "components.load.table_by_max_rank_s.cpu.32.8 is the text 'fast', not a number"),   # float() error
])
def test_the_load_table_by_max_rank_is_checked_where_the_fit_writes_it(tmp_path, value, fragment):
    d = _raw(ADAPTERCHECK)
    assert "8" in d["components"]["load"]["table_by_max_rank_s"]["cpu"]["32"]
    d["components"]["load"]["table_by_max_rank_s"]["cpu"]["32"]["8"] = value
    msg = _refused(tmp_path, d)
    assert fragment in msg, msg
    rc, out, err = _twin(["run", "--no-progress", "--profile", _write(tmp_path, d, "run"), "--duration", "5"])
    assert rc == 2 and fragment in err and "Traceback" not in err, err


def test_a_load_table_by_max_rank_keyed_by_no_rank_is_refused(tmp_path):
    d = _raw(ADAPTERCHECK)
    d["components"]["load"]["table_by_max_rank_s"]["cpu"]["max"] = {"8": 0.01}
    assert "components.load.table_by_max_rank_s.cpu: key 'max' is not a LoRA rank" in _refused(tmp_path, d)


# ------------------------------------------------------------------------------------------ loads under TP (defect 6)
def test_every_tp_worker_reads_the_whole_checkpoint_from_disk():
    """vLLM's WorkerLoRAManager._load_adapter reads the whole checkpoint on every worker: the disk read is not
    divided by tp (before: Llama-2-7B A100-80GB rank 64, 190.9 / 120.4 / 85.2 / 67.6 ms at TP 1 / 2 / 4 / 8)."""
    p = load_profile(A100)
    t1 = p.load_s(64, "disk", 1)
    assert t1 * 1e3 == pytest.approx(190.9, abs=0.05)
    assert [p.load_s(64, "disk", tp) for tp in (2, 4, 8)] == [t1] * 3


def test_a_measured_load_table_stays_in_use_under_tp():
    """Default profile, CPU -> GPU rank 32 into rank-32 slots: 6.37 ms at TP 1 (measured) and 7.29 ms at TP 2 (the link
    model, the table dropped); now the table's transfer part divided by 2, its fixed part kept."""
    p = load_profile("default")
    lp = p.components["load"].params
    nb = p.adapter_bytes(32)
    t1 = p.load_s(32, "cpu", 1, 32)
    assert t1 * 1e3 == pytest.approx(6.37, abs=0.01)
    assert p.load_s(32, "cpu", 2, 32) == pytest.approx(t1 - nb / (lp["cpu_gbps"] * 1e9) / 2)
    assert p.load_s(32, "cpu", 2, 32) < t1


@pytest.mark.parametrize("name", sorted(n for n in available_profiles()))
def test_a_load_never_gets_slower_with_more_gpus(name):
    from twin.tensor_parallel import tp_profile, valid_degrees

    p = load_profile(name)
    degrees = [tp for tp in (1, 2, 4, 8) if tp in valid_degrees(p.model)]
    for source in ("disk", "cpu"):
        for rank in (8, 16, 32, 64, 128):
            for max_rank in (None, 8, 16, 32, 64, 128):
                if max_rank is not None and max_rank < rank:
                    continue
                t = [tp_profile(p, tp).load_s(rank, source, tp, max_rank) for tp in degrees]
                assert all(b <= a for a, b in zip(t, t[1:])) and t[-1] >= 0, (source, rank, max_rank, t)
                assert source == "cpu" or len(set(t)) == 1, t
