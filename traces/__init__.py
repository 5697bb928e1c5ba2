"""Traces and workloads: one workload table for everything downstream (see ``traces.workload``)."""
