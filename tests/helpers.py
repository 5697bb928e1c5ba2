"""Small builders shared by the tests."""

from __future__ import annotations

import copy

import numpy as np

from traces.workload import Workload
from twin.interfaces import Admit, Scheduler
from twin.perf.profile import DEFAULT_PROFILE, Profile


def kernel_grid_lora(profile: str, **params: float):
    """The LoRA component of the named profile's file with ``params`` set (e.g. ``n_tile_cost``)."""
    from twin.perf.profile import load_profile

    d = copy.deepcopy(load_profile(profile).raw)
    d["components"]["lora"]["params"].update(params)
    return Profile.from_dict(d, "t").components["lora"]


def lora_steps(seed: int, ranks: tuple[int, ...], n: int = 400):
    """``n`` random LoRA steps ``(A, r, T, G, R)``: adapters, padded rank (from ``ranks``), tokens, slots, requests."""
    rng = np.random.default_rng(seed)
    for _ in range(n):
        A, T, G = int(rng.integers(1, 130)), int(rng.integers(1, 2048)), int(rng.integers(1, 400))
        R = int(rng.integers(1, T + 1))
        r = int(rng.choice(list(ranks)))
        yield A, r, T, G, R


def assert_one_is_the_profile_and_scalar_is_predict(fb, f1, fx, lora_x, step) -> None:
    """A kernel-grid cost parameter at the profile's own value (1 unless the profile has it) leaves the committed
    profile's step bit for bit (``f1`` vs ``fb``),
    and at another value its scalar path ``fx`` equals ``lora_x.predict``, at ``step = (A, r, T, G, R)``."""
    import pytest

    A, r, T, G, R = step
    assert f1(0.0, A, r, T, G, R) == fb(0.0, A, r, T, G, R)
    assert fx(0.0, A, r, T, G, R) == pytest.approx(float(lora_x.predict(0.0, A, r, T, G, R)), rel=1e-12, abs=1e-15)


def constant_profile(c0=0.01, c_prefill=0.0, c_decode=0.0, c_ctx=0.0, lora_pct=100.0, k6=0.0, sched=0.0, k2=0.0,
                     disk_s=0.5, cpu_s=0.1, kv_tokens=None, ranks=(8, 16, 32, 64, 128)) -> Profile:
    """A profile whose durations are easy to compute by hand."""
    d = copy.deepcopy(DEFAULT_PROFILE)
    d["name"] = "test-constant"
    d["components"]["backbone"]["params"] = {"c0": c0, "c_prefill": c_prefill, "c_decode": c_decode, "c_ctx": c_ctx}
    d["components"]["lora"]["params"] = {"k6": k6, "k7": lora_pct}
    d["components"]["scheduler"]["params"] = {"k0": sched, "k1": 0.0, "k2": k2, "k3": 0.0}
    d["components"]["load"]["params"].update(
        {"table_s": {"disk": {str(r): disk_s for r in ranks}, "cpu": {str(r): cpu_s for r in ranks}}})
    if kv_tokens is not None:
        d["components"]["kv"] = {"form": "memory_budget", "params": {
            "free_bytes": kv_tokens * 131072, "slot_bytes_per_rank": 0.0, "kv_bytes_per_token": 131072}}
    return Profile.from_dict(d)


def random_workload(n=300, rps=5.0, adapters=12, seed=0, max_prompt=1500, max_out=300, ranks=(8, 16)) -> Workload:
    rng = np.random.default_rng(seed)
    arr = np.cumsum(rng.exponential(1 / rps, n))
    ad = rng.integers(0, adapters, n)
    rk = np.asarray(ranks)[ad % len(ranks)]
    return Workload.from_arrays(arr, rng.integers(1, max_prompt, n), rng.integers(1, max_out, n), ad, rk)


class FakeCtx:
    """A step context that admits every request except those it is told to refuse."""

    def __init__(self, refuse=None):
        self.admitted = []
        self.refuse = refuse or {}

    def try_admit(self, rid):
        r = self.refuse.get(rid, Admit.OK)
        if r == Admit.OK:
            self.admitted.append(rid)
        return r


def real_run_row(**kw) -> dict:
    """The smallest row of the real-run table that :func:`twin.validation.specs.spec_from_row` accepts
    (one adapter, one slot, rank 8, the ShareGPT pool means, a one-hour run)."""
    row = dict(run_id="x", model="llama-3.1-8b-instruct", ranks="8", rates="0.1", served_adapters=1,
               adapter_slots=1, max_lora_rank=8, max_cpu_loras=1, max_num_seqs=2048, pool_mean_input_tokens=222.0,
               pool_mean_output_tokens=196.0, requests_sent=float("nan"), benchmark_time_s=3600.0)
    row.update(kw)
    return row



def configure_parser():
    """An argument parser with the ``twin configure`` subcommands (the configurator CLI's tests)."""
    import argparse

    from twin.configurator.cli import register_cli

    p = argparse.ArgumentParser()
    register_cli(p.add_subparsers())
    return p


def ml_test_row(**kw) -> dict:
    """One served row of a real-run table (``twin validate`` / ``configure evaluate`` format): the
    columns a table must have, for an ml_test run of the published 0.4/0.05/0.00625, 8/16/32 scenario."""
    row = dict(model="llama-3.1-8b-instruct", source="ml_test", scenario="rate_0.4-0.05-0.00625_size_8-16-32",
               run_dir="_16_16_32_", ranks="8-16-32", rates="0.4-0.05-0.00625", served_adapters=16, adapter_slots=16,
               max_lora_rank=32, status="ok", offered_req_s=2.9, pool_mean_input_tokens=222.0,
               pool_mean_output_tokens=196.0, offered_tok_s_est=1200.0, total_tok_s=1190.0)
    row.update(kw)
    return row


def configure_error(argv: list[str], capsys) -> str:
    """Run ``twin ARGV`` (a ``twin configure`` subcommand); it must exit 2 with one ``twin configure SUBCMD: error:``
    line (after any warnings, e.g. search's short window, said before any run) and no traceback. Returns stderr."""
    from twin.cli import main

    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2, err
    before, sep, _ = err.partition(f"twin configure {argv[1]}: error: ")
    assert sep and "Traceback" not in err, err
    assert all(line.startswith(f"twin configure {argv[1]}: warning: ") for line in before.splitlines()), err
    return err


class ListQueueScheduler(Scheduler):
    """A plug-in scheduler for tests: a list of arrived requests (not rejected) offered in order until one is refused;
    ``on_preempt`` puts a preempted request back at the front. Tests override a hook to break it on purpose."""

    name = "t-list-queue"

    def bind(self, engine):
        super().bind(engine)
        self.queue = []

    def on_arrivals(self, lo, hi):
        self.queue += [r for r in range(lo, hi) if self.engine.reject_reason[r] == 0]

    def on_preempt(self, rid):
        self.queue.insert(0, rid)

    def schedule_waiting(self, ctx):
        while self.queue:
            r = ctx.try_admit(self.queue[0])
            if r != Admit.OK:
                return r
            self.queue.pop(0)
        return None
