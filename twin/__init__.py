"""LoRA Twin: a discrete-event digital twin of a multi-LoRA vLLM-like server.

Where things live (one concept per module):

* ``twin.config``      -- ``EngineConfig``: the vLLM-like knobs (token budget, slots, ...).
* ``twin.model_spec``  -- model dimensions and the adapter-size formula.
* ``twin.perf.profile``     -- the performance model the engine asks for every duration.
* ``twin.engine``      -- the SimPy engine: continuous batching, chunked prefill, KV blocks,
                          preemption, adapter slots. **A request's TTFT is decided in
                          ``Engine._complete_step`` (first token = end of the step that computes
                          the last prompt token).**
* ``twin.kv_cache``    -- block-level KV accounting.
* ``twin.adapters``    -- GPU slots, CPU tier, disk, and the host-to-GPU link.
* ``twin.metrics``     -- per-request / per-step records and the summary.
* ``twin.simulate``    -- ``simulate(workload, ...)``: one call from workload to results.
* ``twin.cli``         -- the ``twin`` command.
"""

__version__ = "0.1.0"
