"""Fitting LoRA Twin profiles from calibration measurements.

* :mod:`.core` -- ``curve_fit`` wrapper (bounds, initial guesses, standard errors), R^2 /
  MAPE, deterministic grouped k-fold held-out scoring, form selection;
* :mod:`.tables` -- reading the vLLM 0.8.5 tables and turning ~2 s windows into observations;
* :mod:`.components` -- the five component fits with their candidate forms;
* :mod:`.vllm085`, :mod:`.vllm050`, :mod:`.vidur` -- one profile builder per data source;
* :mod:`.peer` -- the published twin's models, scored on the same observations;
* :mod:`.synthetic` -- measurement tables generated from known constants (recovery tests);
* :mod:`.profile_io` -- provenance, validation and writing of the JSON files.

:func:`calibration.fitting.fit.fit_profile` is the entry point of ``twin calibrate fit``.
"""
