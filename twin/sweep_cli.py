"""Shim: ``twin/cli.py`` already looks for ``twin.sweep_cli``; this registers ``twin sweep`` and
``twin configure`` from their packages (:mod:`twin.sweep.cli`, :mod:`twin.configurator.cli`).
At the merge of the architecture work the two ``register_cli`` functions can be wired into the
CLI directly and this file removed."""

from __future__ import annotations


def register_cli(subparsers) -> None:
    from twin.configurator.cli import register_cli as configure_cli
    from twin.sweep.cli import register_cli as sweep_cli

    sweep_cli(subparsers)
    configure_cli(subparsers)
