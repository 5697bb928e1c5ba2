"""The performance model the engine asks for every duration.

* :mod:`twin.perf.forms`   -- the equation forms (one small class each), registered by
  ``(kind, form)``; a profile file names a form and its fitted constants;
* :mod:`twin.perf.profile` -- :class:`~twin.perf.profile.Profile`: five components loaded
  from a profile JSON file, and the engine's one step-time entry point
  (:meth:`~twin.perf.profile.Profile.step_s` for one step,
  :meth:`~twin.perf.profile.Profile.decode_run` for a run of decode steps).

Fitting the constants (``scipy.optimize.curve_fit``) lives above, in ``calibration/``.
"""
