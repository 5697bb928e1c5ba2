"""How FastLibra's swap-out ranking depends on the unit of t in the decay 1 - sigmoid(t).

At t = 120, 240, ..., 600 s of ``fastlibra`` on ``fastlibra-chatbot`` (50 LoRAs, 6 req/s, the default
profile), the HBM KV leaves (the swap-out candidates) are valued with each unit and Kendall's tau
between that order and their recency order is printed (1: the ranking is pure recency). Run:

    PYTHONPATH=. python benchmarks/fastlibra_decay_ranking.py
"""
from scipy.stats import kendalltau
import policies  # noqa
from traces.registry import get_workload
from twin.config import EngineConfig
from twin.engine import Engine
from twin.perf.profile import load_profile
from twin.registry import make_cache, make_scheduler
w = get_workload("fastlibra-chatbot", rps=6.0, seed=0)
prof = load_profile("llama-3.1-8b_h100_vllm085")
eng = Engine(w, prof, EngineConfig(), make_scheduler("fcfs"), make_cache("fastlibra"))
units = (1.0, 10.0, 60.0, 600.0)
rows = {u: [] for u in units}
def probe(t):
    c = eng.cache
    cands = c.swap_out_candidates()
    kv = [x for x in cands if x[0] == "kv"]
    if len(kv) < 3:
        return
    rec = [x.last_access for _, x in kv]
    for u in units:
        c.decay_unit_s = u
        v = c.values(t, kv)
        rows[u].append(kendalltau(v, rec).statistic)
    c.decay_unit_s = 60.0
for t in range(120, 601, 120):
    eng.push_event(float(t), probe)
eng.run()
for u in units:
    print(f"decay_unit_s={u:5.0f}: Kendall tau(Eval, recency) over HBM KV leaves at 120..600 s = "
          + " ".join(f"{x:.2f}" for x in rows[u]))
