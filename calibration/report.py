"""``twin calibrate report PROFILE``: constants, fit quality and one figure per model.

The text part needs only the profile file; the figures re-read the measurements the profile
was fitted from (``--measurements DIR``, or the provenance directory inside
``$TWIN_DATA_DIR``) and plot the measured points against the fitted model.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

from calibration.fitting import components as C
from calibration.fitting import vllm050, vllm085
from calibration.fitting.tables import Vllm085Tables
from calibration.fitting.vidur import GPUS, linear_ops
from calibration.fitting.vllm050 import kv_probes
from traces.datadir import data_dir
from twin.model_spec import get_model
from twin.perf.forms import make_component
from twin.perf.profile import DEFAULT_FITTED, KINDS, OPTIONAL_KINDS, Profile, available_profiles

ROOT = Path(__file__).resolve().parent.parent


def load_profile_dict(name_or_path: str) -> tuple[dict[str, Any], Path]:
    p = Path(name_or_path)
    if p.suffix == ".json" or p.exists():
        if not p.exists():
            raise FileNotFoundError(f"profile file {p} does not exist; `twin calibrate list` shows the shipped ones")
        return _read_json(p), p
    avail = available_profiles()
    if name_or_path in ("default", "") and avail.get(DEFAULT_FITTED):  # (the name every other command takes)
        name_or_path = DEFAULT_FITTED
    path = avail.get(name_or_path)
    if path is None and name_or_path == "embedded":  # (listed by `twin calibrate list`, with no file)
        raise ValueError(f"profile {name_or_path!r} holds hand-set constants, not a fit: there is no fit quality to "
                         f"report; give a fitted profile, e.g. {DEFAULT_FITTED} (`twin calibrate list`)")
    if path is None:
        raise KeyError(f"unknown profile {name_or_path!r}; fitted profiles: "
                       f"{', '.join(k for k, v in avail.items() if v is not None)} (or give a JSON file)")
    return _read_json(path), path


def _read_json(p: Path) -> dict[str, Any]:
    """A profile file's JSON object; ``ValueError`` naming the file otherwise."""
    try:
        d = json.loads(p.read_bytes().decode("utf-8"))
    except UnicodeDecodeError:
        raise ValueError(f"profile file {p} is not a text file (not UTF-8 JSON)") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"profile file {p} is not valid JSON ({e})") from None
    except IsADirectoryError:
        raise ValueError(f"profile file {p} is a directory") from None
    if not isinstance(d, dict) or "components" not in d or "name" not in d:
        raise ValueError(f"profile file {p} is not a LoRA Twin profile (no name/components); `twin calibrate list` "
                         f"shows the shipped ones")
    return d


def committed_figures_dir(name: str) -> Path:
    """Where the committed figures of a profile live (``results/calibration/<name>``)."""
    return ROOT / "results" / "calibration" / name


def default_figures_dir(name: str, path: Path) -> Path:
    """Where ``report`` draws a profile's figures without ``--out-dir``: the committed folder
    (:func:`committed_figures_dir`) for a shipped profile, and for any other file (a user's profile, or a copy of a
    shipped one, whatever its ``name``) ``<file>-figures`` beside it, so it never replaces committed figures."""
    shipped = available_profiles().get(name)
    if shipped is not None and Path(shipped).resolve() == Path(path).resolve():
        return committed_figures_dir(name)
    return Path(path).with_name(Path(path).stem + "-figures")


def _is_committed(out_dir: Path, name: str) -> bool:
    committed = (ROOT / "results" / "calibration").resolve()
    try:
        out_dir.resolve().relative_to(committed)
        return True
    except ValueError:
        return False


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if not math.isfinite(v):
            return "-"
        return f"{v:.4g}"
    return str(v)


def _q(q: dict[str, Any] | None) -> str:
    if not q:
        return "-"
    if "note" in q and "r2" not in q:
        return f"MAPE={_fmt(q['mape_pct'])}% ({q['note']})" if "mape_pct" in q else q["note"]
    return f"R2={_fmt(q.get('r2'))} MAPE={_fmt(q.get('mape_pct'))}% (n={q.get('n', '-')})"


def variant_of(d: dict[str, Any]) -> dict[str, Any] | None:
    """The ``provenance.variant`` record of a variant profile (``of``, ``command``, ``changed``), else None."""
    v = d.get("provenance", {}).get("variant")
    return v if isinstance(v, dict) and v.get("of") else None


def variant_changed_kinds(d: dict[str, Any]) -> set[str]:
    """The components a variant profile refitted or added (``lora`` of ``lora.l_cta``, ``adapter_check`` of
    ``adapter_check (new)``): their held-out figures in the component's ``fit`` are the base profile's, unless the
    variant wrote its own."""
    v = variant_of(d)
    return {str(c).split(".")[0].split(" ")[0] for c in v.get("changed", [])} if v else set()


def _fit_figures(fit: dict[str, Any]) -> str:
    """A variant's own fit record, written out: ``name X %`` for each ``*_pct`` figure, per source for a dict
    of them (e.g. the adapter check's ``mixed_heldout_pct``)."""
    parts = []
    for k, v in fit.items():
        if not k.endswith("_pct"):
            continue
        label = k[: -len("_pct")].replace("_", " ")
        if isinstance(v, dict):
            parts.append(f"{label}: " + ", ".join(f"{s} {_fmt(x)} %" for s, x in v.items()))
        else:
            parts.append(f"{label} {_fmt(v)} %")
    return "; ".join(parts)


def _variant_lines(d: dict[str, Any]) -> list[str]:
    """What a variant profile is: its command, its base and what it changed; the figures a reader must not take
    for the variant's."""
    v = variant_of(d)
    if v is None:
        return []
    data = f" (data: {v['data']})" if v.get("data") else ""
    return [f"a variant of {v['of']}, written by `{v.get('command', '')}`{data}; it changes "
            f"{', '.join(v.get('changed', []))}. The held-out figures of the components it changed and the comparison "
            f"with the published twin are the base profile's, unless marked as the variant's."]


def summary_lines(d: dict[str, Any]) -> list[str]:
    """Human-readable summary of a profile dict: constants with units and standard errors, fit quality."""
    out = [f"profile {d['name']} (v{d.get('version')}): {d['model']} on {d.get('gpu')} with {d.get('software')}",
           f"  {d.get('description', '')}"]
    prov = d.get("provenance", {})
    if prov.get("command"):
        out.append(f"  fitted by: {prov['command']}")
    out += [f"  {line}" for line in _variant_lines(d)]
    changed = variant_changed_kinds(d)
    for kind in [k for k in KINDS + OPTIONAL_KINDS if k in d["components"]]:
        c = d["components"][kind]
        out.append("")
        out.append(f"[{kind}] form {c['form']}: {c.get('equation', '')}"
                   + (" (changed by the variant; held-out figures below: the base profile's)"
                      if kind in changed and c.get("fit", {}).get("heldout") else ""))
        units = c.get("units", {})
        se = c.get("stderr", {}) or {}
        for name, v in c["params"].items():
            if isinstance(v, dict):
                for src, tab in v.items():
                    sete = (se.get(name) or {}).get(src, {}) if isinstance(se.get(name), dict) else {}
                    cells = ", ".join(f"r{r}: {t * 1e3:.2f}" + (f"+-{sete[r] * 1e3:.2f}" if r in sete else "")
                                      for r, t in tab.items())
                    out.append(f"    {name}[{src}] (ms by rank) {cells}")
                continue
            s = se.get(name)
            fixed = " (fixed)" if name in c.get("fixed", []) else ""
            bound = " (at bound)" if name in c.get("at_bound", []) else ""
            out.append(f"    {name:<18} = {_fmt(v):>12}{'' if s is None else ' +- ' + _fmt(s)} "
                       f"{units.get(name, '')}{fixed}{bound}")
        fit = c.get("fit", {})
        if kind in changed and fit and "heldout" not in fit and _fit_figures(fit):
            out.append(f"  the variant's fit (held-out MAPE): {_fit_figures(fit)}")
        if "train" in fit:
            out.append(f"  fit (training):  {_q(fit['train'])}")
        held = fit.get("heldout", {})
        for key, q in held.items():
            if isinstance(q, dict) and ("r2" in q or "note" in q):
                out.append(f"  held-out {key:<10} {_q(q)}")
            elif isinstance(q, dict):
                for sub, qq in q.items():
                    if isinstance(qq, dict) and "r2" in qq:
                        out.append(f"  held-out {key}/{sub}: {_q(qq)}")
        if "classification" in c:
            cl = c["classification"]
            out.append(f"  probe starts classified right: {cl['correct']}/{cl['total']} "
                       f"(ok {cl['ok_predicted_ok']}/{cl['ok_total']}, failed "
                       f"{cl['failed_predicted_failed']}/{cl['failed_total']})")
        sel = c.get("selection", {})
        if sel.get("ranking"):
            out.append("  candidates (held-out MAPE %): " + ", ".join(f"{n} {_fmt(m)}" for n, m in sel["ranking"]))
    comp = d.get("comparison_with_published_twin")
    if comp:
        out.append("")
        out.append("comparison with the published twin (same observations; ours held-out):")
        for key, block in comp.items():
            if not isinstance(block, dict):
                continue
            if "ours_heldout" in block or "ours" in block:
                ours = block.get("ours_heldout", block.get("ours"))
                out.append(f"  {key:<28} ours {_q(ours)} | published {_q(block.get('published'))}")
            for sub, v in block.items():
                if isinstance(v, dict) and ("ours_heldout" in v or "ours" in v):
                    out.append(f"  {key + '/' + sub:<28} ours {_q(v.get('ours_heldout', v.get('ours')))} | "
                               f"published {_q(v.get('published'))}")
                elif sub.startswith("published_form_refit"):
                    out.append(f"  {key + '/' + 'published form re-fitted':<28} {_q(v)}")
    for n in d.get("notes", []):
        out.append(f"note: {n}")
    return out


def quality_table(d: dict[str, Any]) -> dict[str, Any]:
    """Compact JSON summary: per component the chosen form, held-out quality and the published twin's."""
    res: dict[str, Any] = {"profile": d["name"], "components": {}}
    if variant_of(d):  # (the components it changed carry the base profile's held-out figures)
        res["variant"] = variant_of(d)
    for kind in [k for k in KINDS + OPTIONAL_KINDS if k in d["components"]]:
        c = d["components"][kind]
        res["components"][kind] = {"form": c["form"], "heldout": c.get("fit", {}).get("heldout", {}),
                                   "train": c.get("fit", {}).get("train")}
    if d.get("comparison_with_published_twin"):
        res["comparison_with_published_twin"] = d["comparison_with_published_twin"]
    return res


def _cell(q: dict[str, Any] | None) -> str:
    if isinstance(q, dict) and "r2" not in q and "mape_pct" in q:
        return f"MAPE {_fmt(q['mape_pct'])} % ({q.get('note', '')})"
    if not q or "r2" not in q:
        return (q or {}).get("note", "-") if isinstance(q, dict) else "-"
    return f"{_fmt(q.get('r2'))} / {_fmt(q.get('mape_pct'))} % (n={q.get('n', '-')})"


def markdown(d: dict[str, Any]) -> str:
    """Markdown tables: every component's held-out fit quality, and ours next to the published twin's."""
    lines = [f"### {d['name']}", "", f"{d.get('description', '')}", "",
             f"Command: `{d.get('provenance', {}).get('command', '')}`", ""]
    lines += [f"Variant: {line}" for line in _variant_lines(d)] + ([""] if variant_of(d) else [])
    lines += ["| component | chosen form | held-out R2 / MAPE | candidates (held-out MAPE %) |", "|---|---|---|---|"]
    changed = variant_changed_kinds(d)
    for kind in [k for k in KINDS + OPTIONAL_KINDS if k in d["components"]]:
        c = d["components"][kind]
        held = c.get("fit", {}).get("heldout", {})
        if kind in changed and not held and _fit_figures(c.get("fit", {})):  # the variant's own fit record
            lines.append(f"| {kind} | {c['form']} | the variant's held-out MAPE: {_fit_figures(c['fit'])} | - |")
            continue
        main = held.get("all") if isinstance(held.get("all"), dict) else None
        extra = []
        for key, q in held.items():
            if key != "all" and isinstance(q, dict) and "r2" in q:
                extra.append(f"{key}: {_cell(q)}")
            elif isinstance(q, dict) and key in ("disk", "cpu"):
                extra.append(f"{key} table: {_cell(q.get('table'))}")
        if "classification" in c:
            cl = c["classification"]
            extra.append(f"probe starts classified right {cl['correct']}/{cl['total']}")
        rank = ", ".join(f"{n} {_fmt(m)}" for n, m in c.get("selection", {}).get("ranking") or [])
        base = "base profile's: " if kind in changed and held else ""
        lines.append(f"| {kind} | {c['form']} | {base}{_cell(main)}{'<br>' + '<br>'.join(extra) if extra else ''} | "
                     f"{rank or '-'} |")
    comp = d.get("comparison_with_published_twin")
    if comp:
        of = f" (the base profile {variant_of(d)['of']}'s)" if variant_of(d) else ""
        lines += ["", f"| observations | ours (held-out) R2 / MAPE{of} | published twin R2 / MAPE |", "|---|---|---|"]
        for key, block in comp.items():
            if not isinstance(block, dict):
                continue
            if "ours_heldout" in block or "ours" in block:
                lines.append(f"| {key} | {_cell(block.get('ours_heldout', block.get('ours')))} | "
                             f"{_cell(block.get('published'))} |")
            for sub, v in block.items():
                if isinstance(v, dict) and ("ours_heldout" in v or "ours" in v):
                    lines.append(f"| {key} / {sub} | {_cell(v.get('ours_heldout', v.get('ours')))} | "
                                 f"{_cell(v.get('published'))} |")
                elif sub.startswith("published_form_refit") and isinstance(v, dict):
                    lines.append(f"| {key} / published form re-fitted to its runs (held-out) | - | {_cell(v)} |")
                elif sub == "ours_per_max_rank_heldout" and isinstance(v, dict):
                    lines.append(f"| {key} / ours per (max rank, rank), used by the engine | {_cell(v)} | - |")
    if d.get("notes"):
        lines += [""] + [f"* {n}" for n in d["notes"]]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------
# figures
# ------------------------------------------------------------------------------------------

def _measurements_dir(d: dict[str, Any], override: str | None) -> Path | None:
    if override:
        return Path(override)

    rel = d.get("provenance", {}).get("measurements", {}).get("directory")
    if not rel:
        return None
    cand = data_dir() / rel
    return cand if cand.is_dir() else None


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _format(d: dict[str, Any]) -> str | None:
    """The table format the profile was fitted from (``vllm085``, ``vllm050``, ``vidur``)."""
    fmt = d.get("provenance", {}).get("format")
    if fmt is None and d.get("software") == "vllm-0.8.5":
        fmt = "vllm085"
    return fmt


def write_figures(d: dict[str, Any], meas: Path | None, out_dir: Path,
                  tables: Vllm085Tables | None = None) -> list[Path]:
    """Write one PNG per component into ``out_dir``; returns the paths (``tables``: the vLLM 0.8.5
    tables of ``meas`` when already read)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    fmt = _format(d)
    if meas is not None and fmt == "vllm085":
        return _figures_vllm085(d, meas, out_dir, tables)
    if meas is not None and fmt == "vllm050":
        return _figures_vllm050(d, meas, out_dir)
    if meas is not None and fmt == "vidur":
        return _figures_vidur(d, meas, out_dir)
    return _figures_curves(d, out_dir)


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    _plt().close(fig)
    return path


def _model(d: dict[str, Any], kind: str):

    return make_component(kind, d["components"][kind])


def _figures_vllm085(d: dict[str, Any], meas: Path, out: Path, tables: Vllm085Tables | None = None) -> list[Path]:

    plt = _plt()
    t = tables if tables is not None else Vllm085Tables.read(meas, d["model"])
    bm, lm, sm, ldm, kvm = (_model(d, k) for k in KINDS)
    paths = []
    # backbone
    bb = vllm085.backbone_obs(t)
    pred = C.window_backbone_ms(bm, bb)
    fig, ax = plt.subplots(1, 2, figsize=(10, 4))
    for kind, col in (("decode", "C0"), ("prefill", "C1"), ("mixed", "C2")):
        m = bb["kind"] == kind
        ax[0].scatter(bb.loc[m, "comp_ms"], pred[m.to_numpy()], s=6, c=col, label=f"{kind} windows", alpha=.6)
    lim = [0, float(max(bb["comp_ms"].max(), pred.max())) * 1.05]
    ax[0].plot(lim, lim, "k--", lw=1)
    ax[0].set(xlabel="measured mean step - scheduler (ms)", ylabel="fitted backbone (ms)",
              title=f"backbone ({bm.form}): all windows")
    ax[0].legend(fontsize=7)
    dec = bb[bb["kind"] == "decode"]
    ctx_per_seq = float(np.median(dec["C"] / np.maximum(dec["D"], 1)))
    ax[1].scatter(dec["D"], dec["comp_ms"], s=6, alpha=.5, label="measured decode windows")
    x = np.linspace(1, dec["D"].max() * 1.05, 300)
    for cps in (ctx_per_seq / 2, ctx_per_seq, ctx_per_seq * 2):
        ax[1].plot(x, np.asarray(bm.predict(np.zeros_like(x), x, x * cps)) * 1e3, lw=1.2,
                   label=f"fit, {cps:.0f} ctx tokens/seq")
    ax[1].set(xlabel="decode sequences per step", ylabel="ms", title="decode step vs running batch")
    ax[1].legend(fontsize=7)
    paths.append(_save(fig, out / "backbone.png"))
    # lora
    lo, mr = vllm085.lora_obs(t)
    # a profile with vLLM's adapter check prices c * A * N beside the grid (fitted with it: its LoRA figures show both)
    check = _model(d, "adapter_check") if "adapter_check" in d["components"] else None

    def check_ms(obs) -> np.ndarray:
        return np.asarray(check.predict(obs["A"], obs["N"]), float) * 1e3 if check is not None else 0.0

    fit_label = f"fit ({lm.form}{' + adapter check' if check is not None else ''})"
    lp = C.window_lora_ms(bm, lm, lo, mr) + check_ms(lo)
    base = C.window_backbone_ms(bm, lo)
    runs, runs_info = vllm085.serving_run_lora_obs(t, bm)
    fig, ax = plt.subplots(1, 3, figsize=(15, 4))
    m = (lo["kind"] == "decode").to_numpy()
    ax[0].scatter(lo.loc[m, "A"], lo.loc[m, "comp_ms"] - base[m], s=8, alpha=.6, label="measured (step - base)")
    ax[0].scatter(lo.loc[m, "A"], lp[m] - base[m], s=4, c="C3", label=fit_label)
    ax[0].set(xlabel="distinct adapters per step A", ylabel="LoRA extra per step (ms)",
              title="LoRA overhead, decode windows (300 slots)")
    ax[0].legend(fontsize=7)
    if len(runs):
        rp = C.window_lora_ms(bm, lm, runs, np.full(len(runs), 8.0)) + check_ms(runs)
        rb = C.window_backbone_ms(bm, runs)
        sc = ax[1].scatter(runs["comp_ms"] - rb, rp - rb, s=10, c=np.log2(runs["G"]), cmap="viridis")
        lim = [0, float(max((runs["comp_ms"] - rb).max(), (rp - rb).max())) * 1.05]
        ax[1].plot(lim, lim, "k--", lw=1)
        fig.colorbar(sc, ax=ax[1], label="log2 adapter slots")
        ax[1].set(xlabel="measured ITL - base - scheduler - loads (ms)",
                  ylabel="fitted LoRA extra (ms)" + (" + adapter check" if check is not None else ""),
                  title=f"published serving runs, 8-448 slots ({len(runs)})")
    else:
        ax[1].text(0.5, 0.5, f"serving runs not used:\n{runs_info.get('reason', '')}", ha="center", va="center",
                   fontsize=8, wrap=True, transform=ax[1].transAxes)
        ax[1].set_axis_off()
    ax[2].scatter(lo["comp_ms"], lp, s=6, alpha=.6)
    lim = [0, float(max(lo["comp_ms"].max(), lp.max())) * 1.05]
    ax[2].plot(lim, lim, "k--", lw=1)
    ax[2].set(xlabel="measured step - scheduler (ms)",
              ylabel="fitted base + LoRA (ms)" + (" + adapter check" if check is not None else ""), title="all LoRA windows")
    paths.append(_save(fig, out / "lora.png"))
    # scheduler
    so = vllm085.scheduler_obs(t, bb, lo)
    sp = C.scheduler_predict_ms(sm, so)
    fig, ax = plt.subplots(1, 2, figsize=(10, 4))
    for i, s in enumerate(so["source"].unique()):
        mm = (so["source"] == s).to_numpy()
        ax[0].scatter(so.loc[mm, "R"], so.loc[mm, "sched_ms"], s=5, alpha=.5, c=f"C{i}", label=s)
        ax[1].scatter(so.loc[mm, "sched_ms"], sp[mm], s=5, alpha=.5, c=f"C{i}")
    x = np.linspace(0, so["R"].max(), 200)
    ax[0].plot(x, np.asarray(sm.predict(x, 0 * x, 0, 0)) * 1e3, "k-", lw=1.2, label="fit, no waiting")
    ax[0].set(xlabel="running requests", ylabel="scheduler ms/step", title=f"scheduler ({sm.form})")
    ax[0].legend(fontsize=6)
    lim = [0, float(max(so["sched_ms"].max(), sp.max())) * 1.05]
    ax[1].plot(lim, lim, "k--", lw=1)
    ax[1].set(xlabel="measured (ms)", ylabel="fitted (ms)", title="measured vs fitted")
    paths.append(_save(fig, out / "scheduler.png"))
    paths.append(_figure_loads(d, vllm085.load_obs(t), out))
    ko, probes, _ = vllm085.kv_obs(t)
    paths.append(_figure_kv(d, ko, probes, out))
    return paths


def _figure_loads(d: dict[str, Any], ld, out: Path) -> Path:

    plt = _plt()
    ldm = _model(d, "load")
    spec = get_model(d["model"])
    targets = tuple(d.get("lora_targets", ()))
    fig, ax = plt.subplots(1, 2, figsize=(10, 4))
    for i, src in enumerate(("disk", "cpu")):
        sub = ld[ld["source"] == src]
        ranks = np.array(sorted(sub["rank"].unique()))
        g = sub.groupby("rank")["load_ms"]
        jit = np.random.default_rng(0).uniform(-.8, .8, len(sub))
        ax[i].scatter(sub["rank"] + jit, sub["load_ms"], s=4, alpha=.3, label="individual loads")
        ax[i].errorbar(ranks, g.mean().to_numpy(), yerr=(g.std() / np.sqrt(g.count())).to_numpy(), fmt="o", c="C1",
                       label="mean +- s.e.")
        x = np.arange(1, max(64, ranks.max()) + 1)
        p = ldm.params
        link = [(p[f"{src}_fixed_s"] + spec.adapter_bytes(int(r), targets) / (p[f"{src}_gbps"] * 1e9)) * 1e3 for r in x]
        ax[i].plot(x, link, "k-", lw=1.2, label=f"link model ({p[f'{src}_gbps']:.3g} GB/s)")
        ax[i].set(xlabel="adapter rank", ylabel="load time (ms)", title=f"{src} -> {'CPU' if src == 'disk' else 'GPU'}")
        ax[i].legend(fontsize=7)
    return _save(fig, out / "load.png")


def _figure_kv(d: dict[str, Any], ko, probes, out: Path) -> Path:

    plt = _plt()
    kvm = _model(d, "kv")
    mml = get_model(d["model"]).max_model_len
    fig, ax = plt.subplots(figsize=(6, 4))
    for i, r in enumerate(sorted(set(int(x) for x in ko["rank"]) | set(int(x) for x in probes["rank"]))):
        if r == 0:
            continue
        m = ko["rank"] == r
        ax.scatter(ko.loc[m, "slots"], ko.loc[m, "tokens"] / 1e3, c=f"C{i}", s=14, label=f"measured, max rank {r}")
        x = np.arange(1, int(max(probes["slots"].max(), ko["slots"].max())) + 1)
        ax.plot(x, [kvm.predict(int(s), r) / 1e3 for s in x], c=f"C{i}", lw=1)
        f = probes[(probes["rank"] == r) & ~probes["ok"]]
        ax.scatter(f["slots"], np.zeros(len(f)), marker="x", c=f"C{i}", s=20)
    m0 = ko["slots"] == 0
    if m0.any():
        ax.scatter([0], ko.loc[m0, "tokens"] / 1e3, c="k", marker="s", s=16, label="LoRA disabled")
    ax.axhline(mml / 1e3, c="k", ls="--", lw=1, label="max_model_len (below: start fails)")
    ax.set(xlabel="adapter slots", ylabel="KV capacity (k tokens)", title=f"KV capacity ({kvm.form}); x = failed start")
    ax.legend(fontsize=6)
    return _save(fig, out / "kv.png")


def _figures_vllm050(d: dict[str, Any], meas: Path, out: Path) -> list[Path]:
    import pandas as pd


    plt = _plt()
    spec = get_model(d["model"])
    runs, manual = vllm050.read_runs(meas, spec)
    obs = vllm050.decode_obs(runs)
    bm, lm = _model(d, "backbone"), _model(d, "lora")
    paths = []
    base = obs[obs["k"] == 0]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.scatter(base["D"], base["itl_ms"], s=8, label="median ITL, runs without adapters")
    ax.scatter(base["D"], np.asarray(bm.predict(np.zeros(len(base)), base["D"], base["C"])) * 1e3, s=6, c="C3",
               label="fit at each run's (R, C)")
    ax.set(xscale="log", yscale="log", xlabel="mean running requests", ylabel="ms", title=f"decode step ({bm.form})")
    ax.legend(fontsize=7)
    paths.append(_save(fig, out / "backbone.png"))
    lo = obs[obs["k"] > 0]
    b = np.asarray(bm.predict(np.zeros(len(lo)), lo["D"], lo["C"]), float)
    pl = (b + np.asarray(lm.predict(b, lo["A"].to_numpy(float), lo["rank"].to_numpy(float), lo["D"].to_numpy(float)))) * 1e3
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.scatter(lo["itl_ms"], pl, s=8, c=lo["rank"], cmap="viridis")
    lim = [0, float(max(lo["itl_ms"].max(), pl.max())) * 1.05]
    ax.plot(lim, lim, "k--", lw=1)
    ax.set(xlabel="measured median ITL (ms)", ylabel="fitted (ms)", title=f"LoRA runs ({lm.form}); colour = max rank")
    paths.append(_save(fig, out / "lora.png"))
    rows = []
    for _, r in manual.iterrows():
        if r["phase"] != "first_load":
            rows.append(("disk", int(r["adapter_rank"]), float(r["loading_ms"])))
        rows.append(("cpu", int(r["adapter_rank"]), float(r["activating_ms"])))
    paths.append(_figure_loads(d, pd.DataFrame(rows, columns=["source", "rank", "load_ms"]), out))

    paths.append(_figure_kv(d, *kv_probes(runs), out))
    return paths


def _figures_vidur(d: dict[str, Any], meas: Path, out: Path) -> list[Path]:

    plt = _plt()
    spec = get_model(d["model"])
    gpu = d.get("provenance", {}).get("vidur_gpu") or d["gpu"].split("-")[0].lower()
    ops, source = linear_ops(meas, gpu, spec)
    bm = _model(d, "backbone")
    fitp = d["components"]["backbone"]["fit"]["linear_ops_forms"]
    fig, ax = plt.subplots(figsize=(6, 4))
    what = "Vidur" if source == "measured" else "shape model of Vidur's"
    ax.scatter(ops["num_tokens"], ops["lin_ms"], s=8, label=f"{what} {GPUS[gpu]['ops'].upper()}: linear ops per step")
    x = np.linspace(1, ops["num_tokens"].max(), 400)
    rp = fitp["roofline"]["params"]
    ax.plot(x, rp["a"] + np.maximum(rp["c_mem"], rp["c_tok"] * x), "C1-", label="roofline fit (linear ops)")
    ax.plot(x, np.asarray(bm.predict(x, np.zeros_like(x), np.zeros_like(x))) * 1e3, "C3--", lw=1,
            label="profile prefill step (+ estimated overheads)")
    for i, (tp, table) in enumerate(sorted(d["components"]["backbone"].get("tensor_parallel", {}).items())):
        ops_tp, _ = linear_ops(meas, gpu, spec, int(tp))
        lo = table["fit"]["linear_ops"]
        lp = lo["params_ms"]
        ax.scatter(ops_tp["num_tokens"], ops_tp["lin_ms"], s=4, color=f"C{4 + i}", label=f"TP {tp} (one rank)")
        ax.plot(x, lp["a"] + (np.maximum(lp["c_mem"], lp["c_tok"] * x) if lo["form"] == "roofline"
                              else lp["c_tok"] * x), color=f"C{4 + i}", lw=1)
    ax.set(xlabel="tokens in the step", ylabel="ms", title=f"backbone on {d['gpu']}")
    ax.legend(fontsize=7)
    paths = [_save(fig, out / "backbone.png")]
    return paths + _figures_curves(d, out, skip=("backbone",))


def _figures_curves(d: dict[str, Any], out: Path, skip: tuple[str, ...] = ()) -> list[Path]:
    """Model curves only (no measurements at hand)."""

    plt = _plt()
    paths = []
    spec = get_model(d["model"])
    if "backbone" not in skip:
        bm = _model(d, "backbone")
        fig, ax = plt.subplots(figsize=(6, 4))
        x = np.linspace(1, 1024, 300)
        for cps in (0, 256, 1024):
            ax.plot(x, np.asarray(bm.predict(np.zeros_like(x), x, x * cps)) * 1e3, label=f"decode, {cps} ctx/seq")
        ax.plot(x, np.asarray(bm.predict(x * 2, np.zeros_like(x), np.zeros_like(x))) * 1e3, label="prefill of 2x tokens")
        ax.set(xlabel="sequences", ylabel="ms", title="backbone (model only)")
        ax.legend(fontsize=7)
        paths.append(_save(fig, out / "backbone.png"))
    bm = _model(d, "backbone")
    lm = _model(d, "lora")
    fig, ax = plt.subplots(figsize=(6, 4))
    A = np.arange(1, 129)
    for D in (32, 128, 256):
        base = float(bm.predict(0, D, D * 256))
        ax.plot(A, [float(lm.predict(base, a, 16, D)) * 1e3 for a in A], label=f"{D} decode seqs, rank 16")
    ax.set(xlabel="distinct adapters per step", ylabel="LoRA extra (ms)", title=f"LoRA ({lm.form})")
    ax.legend(fontsize=7)
    paths.append(_save(fig, out / "lora.png"))
    sm = _model(d, "scheduler")
    fig, ax = plt.subplots(figsize=(6, 4))
    R = np.linspace(0, 1000, 200)
    for W in (0, 1000, 10000):
        ax.plot(R, np.asarray(sm.predict(R, W + 0 * R, 32, 128)) * 1e3, label=f"waiting {W} (32 slots, 128 served)")
    ax.set(xlabel="running", ylabel="ms/step", title=f"scheduler ({sm.form})")
    ax.legend(fontsize=7)
    paths.append(_save(fig, out / "scheduler.png"))
    ldm = _model(d, "load")
    fig, ax = plt.subplots(figsize=(6, 4))
    r = np.arange(4, 129, 4)
    for src in ("disk", "cpu"):
        for tp in (1, 2, 4):
            ax.plot(r, [ldm.predict(int(x), spec.adapter_bytes(int(x)), src, tp) * 1e3 for x in r],
                    label=f"{src}, TP {tp}")
    ax.set(xlabel="rank", ylabel="ms", yscale="log", title="adapter load (link model)")
    ax.legend(fontsize=7)
    paths.append(_save(fig, out / "load.png"))
    kvm = _model(d, "kv")
    fig, ax = plt.subplots(figsize=(6, 4))
    s = np.arange(0, 385, 8)
    for rank in (8, 16, 32, 64):
        ax.plot(s, [kvm.predict(int(x), rank) / 1e3 for x in s], label=f"max rank {rank}")
    ax.axhline(spec.max_model_len / 1e3, c="k", ls="--", lw=1, label="max_model_len")
    ax.set(xlabel="slots", ylabel="k tokens", title=f"KV capacity ({kvm.form})")
    ax.legend(fontsize=7)
    paths.append(_save(fig, out / "kv.png"))
    return paths


def report(name_or_path: str, measurements: str | None = None, out_dir: str | None = None, figures: bool = True,
           as_json: bool = False, as_markdown: bool = False) -> int:
    """Print the profile's constants and fit quality; write a figure per model. Returns an exit code.

    The committed figures (``results/calibration/<name>``) are drawn with the measurements; when
    these are not found, the report refuses to replace them (``FileNotFoundError`` before anything
    is printed) and draws curve-only figures only into an explicit ``out_dir`` elsewhere."""
    d, path = load_profile_dict(name_or_path)
    try:  # the checks every other command applies to a profile (layout, finite and physical constants)
        Profile.from_dict(d, str(path))
    except (ValueError, KeyError, TypeError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        raise ValueError(f"{msg}" if str(path) in str(msg) else f"profile file {path}: {msg}") from None
    meas = _measurements_dir(d, measurements) if figures else None
    od = Path(out_dir) if out_dir else default_figures_dir(d["name"], path)
    if figures and measurements and (meas is None or not meas.is_dir()):
        raise FileNotFoundError(f"--measurements {measurements}: not a directory; give the directory of the "
                                f"calibration tables (e.g. $TWIN_DATA_DIR/calibration/vllm085_h100)")
    if figures and od.exists() and not od.is_dir():
        raise FileNotFoundError(f"--out-dir {od}: is a file, not a directory; give a directory for the figures")
    if figures and meas is None and _is_committed(od, d["name"]):
        raise FileNotFoundError(
            f"the measurements of {d['name']} are not found (set TWIN_DATA_DIR to the data directory or pass "
            f"--measurements DIR), and without them the figures would show the fitted curves only: the committed "
            f"figures in {od} are left as they are. Pass --out-dir DIR to draw the curves elsewhere, or --no-figures "
            f"to print the fit quality only")
    # the measurement tables are checked before anything is printed (a bad table: an error naming it)
    tables = Vllm085Tables.read(meas, d["model"]) if figures and meas is not None and _format(d) == "vllm085" else None
    if as_markdown:
        print(markdown(d))
    elif as_json:
        print(json.dumps(quality_table(d), indent=1))
    else:
        print("\n".join(summary_lines(d)))
    if not figures:
        return 0
    if meas is None:
        print("\n(measurements not found: set TWIN_DATA_DIR or pass --measurements; drawing model curves only)",
              file=sys.stderr)
    paths = write_figures(d, meas, od, tables)
    print(f"\nfigures: {', '.join(str(p) for p in paths)}", file=sys.stderr if as_json or as_markdown else sys.stdout)
    return 0
