"""The fitted arrival profile (``arrival=fitted``, ``splitwise-synth``): its period is the fit's span, so its mean
rate is the fitted one; it starts at the window's time 0 after any warm-up; a fit without arrivals is refused
before any work (``traces.arrivals.cumulative_intensity``, ``traces.synth``)."""

from __future__ import annotations

import numpy as np
import pytest

from traces import arrivals as arr
from traces import synth
from traces.lengths import FitSectionError, load_fitted
from traces.synth import ArrivalConfig, SynthConfig, generate_arrivals, validate_config

FITS = ("splitwise_conv_fit", "splitwise_code_fit")


def _fitted(fit: str, duration_s: float) -> ArrivalConfig:
    return ArrivalConfig(process="fitted", fit=fit, rps=None, duration_s=duration_s)


# ----------------------------------------------------------------------------- the period: the fit's span
@pytest.mark.parametrize("fit", FITS)
def test_the_fitted_profile_averages_the_fitted_rate(fit, monkeypatch):
    """The expected count over whole periods is the fitted rate x their length. The profile's last bin, partial
    (21.7 s of splitwise_conv_fit's 3,501.7 s span), lasted a full 60 s bin and the profile wrapped at 3,540 s: its
    mean over that period was 0.75 % low for the conv fit (a last bin at 0.308 x the mean) and 4.8 % high for the
    code fit (a last bin at 4.79 x the mean, 15.9 s long); three spans drew -0.19 % and +3.1 %. Read from the
    operational time the renewal process is drawn over (its expected count is rps x that)."""
    fa = load_fitted(fit)["arrivals"]
    seen: list[float] = []
    real = arr.gamma_renewal

    def spy(rps, cv, rng, duration_s=None, **kw):
        seen.append(duration_s)
        return real(rps, cv, rng, duration_s=duration_s, **kw)

    monkeypatch.setattr(arr, "gamma_renewal", spy)
    for periods in (1, 3, 20):
        seen.clear()
        generate_arrivals(_fitted(fit, periods * fa["duration_s"]), 1, np.random.default_rng(0))
        assert seen[0] / (periods * fa["duration_s"]) == pytest.approx(1.0, abs=2e-6)  # (the profile's 5 digits)


def test_splitwise_synth_counts_average_the_fitted_rate():
    """Drawn counts over two periods of the conv fit, 24 seeds: their mean rate is the fitted 5.53 req/s (the
    standard error is about 0.08 %)."""
    fa = load_fitted("splitwise_conv_fit")["arrivals"]
    a = _fitted("splitwise_conv_fit", 2 * fa["duration_s"])
    counts = [generate_arrivals(a, 1, np.random.default_rng(s))[0].size for s in range(24)]
    assert np.mean(counts) / a.duration_s == pytest.approx(fa["mean_rps"], rel=4e-3)


def test_fitted_draw_records_its_period():
    fa = load_fitted("splitwise_conv_fit")["arrivals"]
    t, _, info = generate_arrivals(_fitted("splitwise_conv_fit", 600.0), 1, np.random.default_rng(0))
    assert info["period_s"] == fa["duration_s"] and 0 <= t.min() and t.max() < 600.0 and (np.diff(t) >= 0).all()


def test_cumulative_intensity_with_a_partial_last_bin_and_a_start():
    prof = np.array([1.0, 2.0, 0.5])
    t, lam = arr.cumulative_intensity(prof, 10.0, 100.0, period_s=25.0)  # the last bin lasts 5 s
    period_integral = 10 * 1.0 + 10 * 2.0 + 5 * 0.5
    for k in (1, 2, 3):
        assert np.interp(25.0 * k, t, lam) == pytest.approx(k * period_integral)
    assert t[0] == 0 and t[-1] >= 100.0 and (np.diff(t) > 0).all() and (np.diff(lam) > 0).all()
    # start_s: the rate at real time x is the rate at profile time start_s + x
    t, lam = arr.cumulative_intensity(prof, 10.0, 200.0, period_s=25.0)  # (the reference reaches start + 100 s)
    x = np.linspace(0.0, 100.0, 401)
    for start in (5.0, 12.5, 24.0, 30.0, -3.0):
        ts, ls = arr.cumulative_intensity(prof, 10.0, 100.0, period_s=25.0, start_s=start)
        s0 = start % 25.0
        want = np.interp(s0 + x, t, lam) - np.interp(s0, t, lam)
        np.testing.assert_allclose(np.interp(x, ts, ls), want, atol=1e-9)
    # without a period: whole bins, as before
    t0, l0 = arr.cumulative_intensity(prof, 10.0, 100.0)
    assert np.interp(30.0, t0, l0) == pytest.approx(10 + 20 + 5)
    for bad in (20.0, 30.5, 0.0, float("nan")):
        with pytest.raises(arr.ArrivalError, match="period"):
            arr.cumulative_intensity(prof, 10.0, 100.0, period_s=bad)


# ----------------------------------------------------------------------------- the start: any warm-up
@pytest.mark.parametrize("lead", [30.0, 750.0, 3501.721937 + 12.0])
def test_the_fitted_profile_starts_at_the_window_after_any_warmup(lead, monkeypatch):
    """``lead_s`` (the conversations' warm-up) needs no longer be whole bins: the periodic profile starts ``lead_s``
    before its own time 0, so the window [lead_s, ...) sees the profile from its time 0 (the intensity from
    ``lead_s`` on is the one without a warm-up)."""
    seen: list[dict] = []
    real = arr.profiled_renewal

    def spy(*args, **kw):
        seen.append(dict(zip(("rps", "cv", "profile", "bin_s", "duration_s", "rng"), args), **kw))
        return real(*args, **kw)

    monkeypatch.setattr(arr, "profiled_renewal", spy)
    generate_arrivals(_fitted("splitwise_conv_fit", 4000.0), 1, np.random.default_rng(0))
    _, _, info = generate_arrivals(_fitted("splitwise_conv_fit", 4000.0 + lead), 1, np.random.default_rng(0),
                                   lead_s=lead)
    assert info["profile_starts_at_s"] == lead

    def intensity(c):
        return arr.cumulative_intensity(c["profile"], c["bin_s"], c["duration_s"], c.get("period_s"),
                                        c.get("start_s", 0.0))

    t0, l0 = intensity(seen[0])
    t1, l1 = intensity(seen[1])
    x = np.linspace(0.0, 4000.0, 2001)
    got = np.interp(lead + x, t1, l1) - np.interp(lead, t1, l1)
    np.testing.assert_allclose(got, np.interp(x, t0, l0), rtol=1e-9, atol=1e-6)


def test_align_warmup_keeps_every_warmup():
    fitted = ArrivalConfig(process="fitted", fit="splitwise_conv_fit", rps=None)
    assert synth.align_warmup(fitted, 750.0) == 750.0 and synth.align_warmup(fitted, 0.0) == 0.0
    assert synth.align_warmup(ArrivalConfig(), 750.0) == 750.0


# ----------------------------------------------------------------------------- a fit without arrivals
def test_a_fit_without_arrivals_is_refused_by_validate_config():
    cfg = SynthConfig(arrivals=ArrivalConfig(process="fitted", fit="sharegpt_lengths", rps=None))
    with pytest.raises(FitSectionError) as e:
        validate_config(cfg)
    msg = str(e.value)
    assert msg.startswith("fitted statistics 'sharegpt_lengths' (traces/data/sharegpt_lengths.json) hold no "
                          "'arrivals', read by arrival=fitted")
    assert msg.endswith("use a fit that has it: splitwise_code_fit, splitwise_conv_fit")
    validate_config(SynthConfig(arrivals=ArrivalConfig(process="fitted", fit="splitwise_conv_fit", rps=None)))


def test_a_fit_without_arrivals_is_refused_before_any_work(monkeypatch):
    """The error came from drawing the arrivals, after the length model was built."""
    from traces.registry import get_workload

    def no_work(*a, **k):
        raise AssertionError("the length model was built before the fit was checked")

    monkeypatch.setattr(synth, "build_length_model", no_work)
    with pytest.raises(FitSectionError, match="hold no 'arrivals'.*splitwise_code_fit, splitwise_conv_fit"):
        get_workload("synthetic", arrival="fitted", fit="sharegpt_lengths")
    with pytest.raises(FitSectionError, match="hold no 'arrivals'"):
        synth.synthesize(SynthConfig(arrivals=ArrivalConfig(process="fitted", fit="sharegpt_lengths", rps=None)))
