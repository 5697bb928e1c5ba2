"""Calibration: performance models, curve_fit fitting, profiles and the GPU microbenchmark harness.

Importing this package never imports torch or triton; only ``calibration.bench`` does, lazily.
"""
