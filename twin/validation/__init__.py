"""``twin validate``: re-create real vLLM runs from their configuration and score the twin.

Every row of a real-run table (``validation/vllm085_*.csv`` in the data directory, see its
README) is one one-hour vLLM 0.8.5 run. The twin re-creates it **from its configuration
alone** and its figures are scored against the real ones, next to the published twin's.
One concept per module, in import order:

* :mod:`~twin.validation.metrics` -- the scored figures (:data:`METRICS`, defined once);
* :mod:`~twin.validation.specs` -- the real and peer tables, run selection, :class:`RunSpec`;
* :mod:`~twin.validation.profiles` -- the runs' profile, loaded once per process;
* :mod:`~twin.validation.recreate` -- re-creating one run: workload (ShareGPT-like lengths,
  offered load), engine settings, start-up check, the registered scheduler ``fcfs+client-cap``
  (:mod:`policies.client_cap`), :func:`simulate_run`;
* :mod:`~twin.validation.diagnostics` -- gauges and the step model at the saturated runs' mix;
* :mod:`~twin.validation.scoring` -- SMAPE in the published twin's convention, subsets,
  start-up classification, the summary;
* :mod:`~twin.validation.runner` -- the process pool and :func:`run_validation`;
* :mod:`~twin.validation.report`, :mod:`~twin.validation.figures`,
  :mod:`~twin.validation.output` -- the console report, the figures, the files;
* :mod:`~twin.validation.cli` -- the ``twin validate`` command.
"""

from __future__ import annotations

from policies.client_cap import CLIENT_MAX_INFLIGHT
from twin.validation.diagnostics import SATURATED_KV_USAGE, diagnostics, step_at_real_mix
from twin.validation.figures import make_figures
from twin.validation.metrics import METRICS, Metric
from twin.validation.output import PER_RUN_COLUMNS, json_summary, per_run_frame, write_outputs
from twin.validation.profiles import cached_profile, check_profile_model, profile_for_model
from twin.validation.recreate import build_config, build_workload, predict_startup, simulate_run
from twin.validation.report import format_report, largest_errors
from twin.validation.runner import ValidationResult, run_all, run_validation
from twin.validation.scoring import (KEPT_UP_FRACTION, SUBSETS, score, smape, smape_terms, startup_classification,
                                     subset_mask, subset_table, summarize)
from twin.validation.specs import (RUN_KEYS, START_FAILURE_STATUSES, WINDOW_S, RunSpec, attach_peer, check_length_corr,
                                   default_peer_csv, default_real_csv, load_peer, load_real, select_runs,
                                   spec_from_row)

__all__ = [
    "CLIENT_MAX_INFLIGHT", "KEPT_UP_FRACTION", "METRICS", "PER_RUN_COLUMNS", "RUN_KEYS", "SATURATED_KV_USAGE",
    "START_FAILURE_STATUSES", "SUBSETS", "WINDOW_S", "Metric", "RunSpec", "ValidationResult", "attach_peer",
    "build_config", "build_workload", "cached_profile", "check_length_corr", "check_profile_model", "default_peer_csv",
    "default_real_csv", "diagnostics", "format_report", "json_summary", "largest_errors", "load_peer", "load_real",
    "make_figures", "per_run_frame", "predict_startup", "profile_for_model", "run_all", "run_validation", "score",
    "select_runs", "simulate_run", "smape", "smape_terms", "spec_from_row", "startup_classification",
    "step_at_real_mix", "subset_mask", "subset_table", "summarize", "write_outputs",
]
