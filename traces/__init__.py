"""Traces and workloads: one workload table for everything downstream (see ``traces.workload``).

Modules (one concept each):

* ``traces.workload``      -- the :class:`Workload` table, saved as Parquet with its parameters.
* ``traces.registry``      -- ``get_workload(name_or_path, ...)`` / ``list_traces()``: built-in names
                              (real traces in the data directory, synthetic presets) and paths.
* ``traces.synth``         -- ``SynthConfig`` and ``synthesize``: arrivals x adapters x lengths x
                              conversations; the flat option table shared with the CLI.
* ``traces.arrivals``      -- Poisson, gamma (CV), on/off, per-adapter rates, fitted profile,
                              trace rescaling and time windows.
* ``traces.adapters``      -- ranks (N/5 each over 8..128), popularity laws (uniform, power law,
                              Zipf, Skewed-x, Distinct, Chameleon U-U/U-P/P-P).
* ``traces.lengths``       -- fixed sizes, empirical, lognormal, copula (Splitwise-like),
                              ShareGPT-like with matched means, scaling and filters.
* ``traces.conversations`` -- multi-turn conversations with shared prefixes.
* ``traces.loaders``       -- Azure LLM (Splitwise 2023/2024), Azure Functions 2019/2021,
                              ShareGPT, LMSYS-Chat-1M, Chatbot Arena, WildChat, BurstGPT.
* ``traces.fetch``         -- ``twin traces fetch NAME``: checksummed downloads.
* ``traces.stats``         -- ``twin traces show`` statistics, table and figure.
* ``traces.fit``           -- ``python -m traces.fit``: the committed fits in ``traces/data``.
* ``traces.samples``       -- tiny files in every real schema (tests, demos).
* ``traces.cli``           -- ``register_cli(subparsers)``: the ``twin traces`` command.
"""
