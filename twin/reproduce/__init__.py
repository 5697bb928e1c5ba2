"""``twin reproduce NAME``: the seed papers' experiments set up end to end, our numbers beside theirs.

Modules: :mod:`twin.reproduce.base` (rows, outcomes, the simulation runner, the knee search),
one module per paper (:mod:`twin.reproduce.chameleon`, :mod:`twin.reproduce.fastlibra`,
:mod:`twin.reproduce.adaptive_caching`), :mod:`twin.reproduce.registry` (the names),
:mod:`twin.reproduce.report` (table, JSON, files, README) and :mod:`twin.reproduce.cli`.
"""
