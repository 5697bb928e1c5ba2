"""``twin sweep``: run grids of scenarios x configurations through the twin.

* :mod:`twin.sweep.grid` -- grid specifications (named grids, TOML / YAML files);
* :mod:`twin.sweep.scenario` -- one run of the published scenario, run-level early stopping;
* :mod:`twin.sweep.walk` -- one task: a scenario's walk over its configurations;
* :mod:`twin.sweep.runner` -- executors (local, Dask, Ray), Parquet shards, resume, progress;
* :mod:`twin.sweep.cli` -- the command (``register_cli``).
"""

from twin.sweep.grid import GridSpec, NAMED_GRIDS, load_grid  # noqa: F401
