"""The console report of a validation (``twin validate`` without ``--json``)."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from twin.validation.metrics import METRICS
from twin.validation.runner import ValidationResult
from twin.validation.scoring import FIT_TEST_METRICS, SUBSETS


def fmt(x: Any, nd: int = 1) -> str:
    """``x`` with ``nd`` decimals, ``-`` when missing or not finite."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return f"{x:.{nd}f}"


def largest_errors(runs: pd.DataFrame, top: int = 8) -> pd.DataFrame:
    """The ``top`` scored runs by throughput + ITL + TTFT-incl-unfinished error."""
    sc = runs[runs["scored"]].copy()
    if not len(sc):
        return sc
    score = sc[["err_throughput", "err_itl"]].fillna(0).sum(axis=1) + sc["err_ttft_incl_unfinished"].fillna(0)
    return sc.assign(_score=score).sort_values("_score", ascending=False).head(top)


def _subset_lines(s: dict[str, Any]) -> list[str]:
    """One SMAPE table per subset with scored runs."""
    lines: list[str] = []
    for name in SUBSETS:
        sub = s["subsets"][name]
        if not sub["scored"]:
            continue
        lines.append("")
        lines.append(f"[{name}] {sub['description']}: {sub['scored']} runs scored, {sub['with_peer']} with a peer "
                     f"prediction")
        hdr = f"  {'metric':<24}{'n':>5}{'ours':>8}{'std':>8}{'| n':>6}{'ours':>8}{'peer':>8}{'peer std':>10}"
        lines.append(hdr)
        lines.append("  " + "-" * (len(hdr) - 2))
        for m in METRICS:
            r = sub["metrics"][m.name]
            peer = (f"{r.get('n_peer', 0):>6}{fmt(r.get('smape_on_peer_runs')):>8}{fmt(r.get('peer_smape')):>8}"
                    f"{fmt(r.get('peer_smape_standard')):>10}") if m.peer else f"{'':>6}{'':>8}{'-':>8}{'-':>10}"
            lines.append(f"  {m.label:<24}{r['n']:>5}{fmt(r['smape']):>8}{fmt(r['smape_standard']):>8}{peer}")
    return lines


def _fit_test_lines(s: dict[str, Any]) -> list[str]:
    """The fit (dt_modelling) and test (ml_test) splits side by side, SMAPE in percent."""
    ft = s.get("fit_test") or {}
    if not any(ft.get(k, {}).get("runs") for k in ("fit", "test")):
        return []
    labels = {m.name: m.label for m in METRICS}
    hdr = f"  {'split':<6}{'runs':>6}" + "".join(f"{labels[k][:22]:>24}" for k in FIT_TEST_METRICS)
    lines = ["", "fit / test split (SMAPE %, published convention; fit = dt_modelling, test = ml_test, never fitted):",
             hdr, "  " + "-" * (len(hdr) - 2)]
    for name in ("fit", "test"):
        d = ft.get(name, {})
        lines.append(f"  {name:<6}{d.get('runs', 0):>6}" + "".join(f"{fmt(d.get(k)):>24}" for k in FIT_TEST_METRICS))
    cr = {name: (ft.get(name) or {}).get("crossings_90") or {} for name in ("fit", "test")}
    if any(c.get("crossings") for c in cr.values()):
        lines.append("  real 90 % crossings with the twin's throughput / offered within +-2 points: " + "; ".join(
            f"{name} {c['within_2_points']} of {c['crossings']} (largest miss {fmt(c['largest_abs_points'])} points)"
            for name, c in cr.items() if c.get("crossings")) + "  [python -m twin.validation.crossings PER_RUN_CSV]")
    return lines


def _startup_lines(su: dict[str, Any]) -> list[str]:
    lines = ["", f"start-up failures (memory): {su['predicted']} / {su['real_failures']} predicted "
                 f"({fmt(100 * su['fraction'] if su['fraction'] is not None else None)} %), "
                 f"false alarms on ok runs: {su['false_alarms']} / {su['ok_runs']}"]
    for st, d in su["by_status"].items():
        lines.append(f"  {st:<34}{d['predicted']:>5} / {d['runs']}")
    if su["not_scored"]:
        lines.append("  not scored (not configuration-related): " +
                     ", ".join(f"{k} {v}" for k, v in su["not_scored"].items()))
    return lines


def _diagnostic_lines(dg: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    if "kv_tokens_per_running_request" in dg:
        kv = dg["kv_tokens_per_running_request"]
        lines.append(f"gauges (medians over {kv['runs']} busy runs): KV tokens per running request real "
                     f"{kv['real_median']:.0f}, twin {kv['twin_median']:.0f}; mean running twin/real "
                     f"{dg['mean_running_twin_over_real_median']:.2f}")
    mix = dg.get("saturated_runs_real_itl_over_model_step_at_real_mix")
    if mix:
        lines.append(f"KV-saturated runs ({mix['runs']}): real ITL / model step at the run's own mix, median "
                     f"{mix['median']:.2f} ({mix['median_gap_ms']:.1f} ms); "
                     + ", ".join(f"{k} {v['median']:.2f}" for k, v in mix["by_slots"].items()))
        if mix.get("by_blocked_waiting"):
            lines.append("  by blocked waiting requests (W x max(1 - slots/served, 0)): "
                         + ", ".join(f"{k.removeprefix('blocked ')} {v['median']:.2f} ({v['median_gap_ms']:+.1f} ms, "
                                     f"{v['runs']} runs)" for k, v in mix["by_blocked_waiting"].items()))
    return lines


def _largest_error_lines(runs: pd.DataFrame, top: int) -> list[str]:
    worst = largest_errors(runs, top)
    if not len(worst):
        return []
    lines = ["", f"largest errors (|twin-real|/(|twin|+|real|), %), top {top} by throughput + ITL + TTFT-incl:"]
    for _, r in worst.iterrows():
        real_ttft = r["real_ttft_incl_unfinished"]
        lines.append(f"  {r['run_id'][:70]:<70} tok/s {fmt(r['real_throughput'], 0)}->{fmt(r['twin_throughput'], 0)}"
                     f" ITL {fmt(r['real_itl'])}->{fmt(r['twin_itl'])}"
                     f" TTFTinc {fmt(real_ttft / 1000 if real_ttft == real_ttft else None)}s"
                     f"->{fmt(r['twin_ttft_incl_unfinished'] / 1000)}s  [{r['client']}]")
    return lines


def format_report(res: ValidationResult, top: int = 8) -> str:
    """The text report: SMAPE per subset beside the published twin's, start-up failures,
    diagnostics and the ``top`` largest errors."""
    s = res.summary
    lines = [f"twin validate: {s['runs']} successful runs scored of {s['runs_ok']} ok "
             f"({s['runs_in_table']} runs selected), profile {s['profile']}",
             f"SMAPE in the published twin's convention {s['smape_convention'].split(' (')[0]}; "
             f"'std' = standard SMAPE (x2). 'peer' = the published twin on the same runs."]
    lines += _fit_test_lines(s)
    lines += _subset_lines(s)
    lines += _startup_lines(s["start_failures"])
    lines += _diagnostic_lines(s.get("diagnostics") or {})
    lines += _largest_error_lines(res.runs, top)
    if s.get("twin_errors"):
        lines.append(f"\n{s['twin_errors']} runs raised errors in the twin (see the CSV column 'error')")
    lines.append(f"\nwall time {res.wall_s:.1f} s")
    return "\n".join(lines)
