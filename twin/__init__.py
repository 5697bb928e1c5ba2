"""LoRA Twin: a discrete-event digital twin of a multi-LoRA vLLM-like server.

Where things live (one concept per module):

* ``twin.config``      -- ``EngineConfig``: the vLLM-like knobs (token budget, slots, ...).
* ``twin.model_spec``  -- model dimensions and the adapter-size formula.
* ``twin.perf``        -- the performance model the engine asks for every duration
                          (``twin.perf.profile.Profile.step_s`` / ``decode_run``).
* ``twin.requests``    -- the request table: columns, states, rejection rules, start-up check.
* ``twin.interfaces``  -- ``Scheduler`` / ``AdapterCachePolicy`` and ``EngineView``, the engine
                          as policies see it.
* ``twin.engine_state`` -- what a step works on (set-up, running batch, KV pool) and the
                          ``EngineView`` policies read.
* ``twin.engine``      -- the SimPy engine: continuous batching, chunked prefill, KV blocks,
                          preemption, adapter slots. **A request's TTFT is decided in
                          ``Engine._emit_after_prefill`` (first token = end of the step that
                          computes the last prompt token).**
* ``twin.preemption``  -- the engine's walk over the running requests when KV runs out.
* ``twin.adapters``    -- GPU slots, CPU tier, disk, and the host-to-GPU link.
* ``twin.extensions``  -- hook points for adapter memory layouts (``twin.adapter_placement``),
                          prefetch (``twin.prefetch``) and prefix-KV reuse (``twin.prefix_kv``).
* ``twin.recorder``    -- per-step records; ``twin.metrics`` -- per-request table and summary.
* ``twin.registry``    -- policies by name (built-in ones arrive through an entry point).
* ``twin.simulate``    -- ``simulate(workload, ...)``: one call from workload to results.
* ``twin.cli``         -- the ``twin`` command.
"""

__version__ = "0.1.0"
