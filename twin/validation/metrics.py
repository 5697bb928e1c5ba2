"""The figures the validation scores, defined once (:data:`METRICS`).

Request throughput, total token throughput (``throughput`` -- the published twin's throughput),
mean ITL, mean TPOT, mean / median / P99 TTFT of finished requests and the published twin's TTFT
(``ttft_ms_incl_unfinished``: unfinished requests count as the window length). Each names the
real table's column, the twin's summary key and the published twin's column.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Metric:
    """One scored figure: its name, the real table's column, the twin's summary key, the peer's column."""

    name: str
    label: str
    real: str
    twin: str
    peer: str | None
    unit: str


#: Every metric the validation reports (the single definition used by the table, CSV and JSON).
METRICS: tuple[Metric, ...] = (
    Metric("throughput", "total token throughput", "total_tok_s", "total_tok_s", "total_tok_s", "tok/s"),
    Metric("request_throughput", "request throughput", "request_throughput", "throughput_rps", "peer_rps", "req/s"),
    Metric("itl", "mean ITL", "mean_itl_ms", "itl_ms_mean", "itl_ms", "ms"),
    Metric("tpot", "mean TPOT", "mean_tpot_ms", "tpot_ms_mean", None, "ms"),
    Metric("ttft_mean", "mean TTFT (finished)", "mean_ttft_ms", "ttft_ms_mean", None, "ms"),
    Metric("ttft_median", "median TTFT (finished)", "median_ttft_ms", "ttft_ms_p50", None, "ms"),
    Metric("ttft_p99", "P99 TTFT (finished)", "p99_ttft_ms", "ttft_ms_p99", None, "ms"),
    Metric("ttft_incl_unfinished", "TTFT incl. unfinished", "ttft_ms_incl_unfinished", "ttft_ms_incl_unfinished",
           "ttft_ms_incl_unfinished", "ms"),
)
