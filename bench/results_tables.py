"""Writes the results text from the benchmark CSVs (nothing typed by hand).

    python -m bench.results_tables [--results bench/results/<machine>] [--readme README.md]
                           [--tables bench/results/README.md]

Two outputs:

* the README's short summary, between ``<!-- bench:begin -->`` and ``<!-- bench:end -->``: one
  headline row per kernel op (ours against the fastest peer timed in the same run, and the
  throughput ours reached next to the machine's measured limit), the end-to-end table per prompt
  category (best specops method vs AR and vs the best HF peer), and links to the plots;
* the full tables, one file for every machine directory beside ``--results``
  (``bench/results/README.md``): per op every case and provider (median ms), the ratios, achieved
  GB/s or GFLOP/s, then the end-to-end summary, the paper claims re-checked (bench/paper_claims.py), the
  plots and every provider on every case. One file keeps every machine's numbers in one place, and
  GitHub shows it when the folder is opened.

Throughput is what ours achieved (bytes moved or FLOPs / median time), never a percentage of a
"limit": a small working set can stay in cache and beat the DRAM copy rate, so the machine's
measured memcpy GB/s (DRAM-sized buffers) or GEMM GFLOP/s is named beside it instead. A time whose
spread is wider than its median (p80 - p20 > p50) is marked with a dagger.
"""
import argparse
import csv
import glob
import json
import os
import statistics
import sys

from . import _HERE  # noqa: F401
from . import paper_claims  # noqa: E402
from _harness import RESULTS  # noqa: E402

BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"
OURS = ("cpp", "triton", "cuda")
# Timed beside the op as the physical floor of its work, not as an alternative implementation.
FLOORS = ("memcpy_clone", "read_rows", "softmax")
REFERENCES = ("torch", "torch_ref")  # the torch backend: the spec, plain rather than fast
# Our own engine-facing forms of an op (paged layouts, plans, the raw compiled op): not peers; the
# summary sets each against its counterpart instead (VARIANT_ROWS).
VARIANTS = ("paged", "cpp_paged", "plan", "plan_paged", "cpp_raw")
# stem -> (variant, counterpart, what the row says); ratio = counterpart's time / the variant's.
VARIANT_ROWS = {
    "tree_attention": [("paged", "cpp", "`tree_attention_paged` (cpp; pages of 16, scattered) vs `tree_attention` "
                        "cpp on the same K/V")],
    "kv_compact": [("plan", "cpp_raw", "`KVCompactPlan.run` vs the compiled op called directly "
                    "(`torch.ops.specops.kv_compact`): time ratio; extra µs per call"),
                   ("plan", "per_layer_loop", "`KVCompactPlan.run` vs a per-layer index_copy loop"),
                   ("plan_paged", "cpp_paged", "`KVCompactPlan.run` paged vs `kv_compact_paged` (check=False)"),
                   ("cpp_paged", "cpp", "`kv_compact_paged` vs `kv_compact` (cpp, check=False)")],
}
NOISY = "†"
NOISY_NOTE = (f"{NOISY}: that time's spread is wider than its median (p80 - p20 > p50 over the repeats): "
              "an outlier-prone measurement, read its ratios with care.")
REPRODUCE = ("`python -m bench` (kernels) and `python bench/bench_decoding.py --profile final` (end to end), "
             "then `python -m bench.plots` and `python -m bench.results_tables`")


def load(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def _fmt(x):
    return f"{x:.3g}" if x < 100 else f"{x:.0f}"


def _ratio(x):
    return f"{x:.2f}x" if x < 10 else f"{x:.3g}x" if x < 100 else f"{x:.0f}x"


def _limits(rows):
    """The machine's limits measured in the same run: {metric: value}."""
    return {r["metric"]: float(r["p50"]) for r in rows if r["provider"] == "machine" and r["p50"]}


def _noisy(r):
    return float(r["p80"]) - float(r["p20"]) > float(r["p50"])


def _times(rows):
    """{case: {provider: time row}} in CSV order."""
    out = {}
    for r in rows:
        if r["metric"] == "time" and r["p50"]:
            out.setdefault(r["case"], {})[r["provider"]] = r
    return out


def _providers(times):
    out = []
    for case in times.values():
        out += [p for p in case if p not in out]
    return out


def _is_bf16(row):
    return json.loads(row["params"] or "{}").get("dtype") in ("bf16", "bfloat16")


def achieved(rows):
    """{(case, provider): (value, unit)}: GB/s for memory-bound ops, GFLOP/s for compute-bound ones.
    Read from the ``bandwidth`` / ``throughput`` rows; for older CSVs that recorded only the share
    of the limit, derived as share x limit."""
    lim, out = _limits(rows), {}
    for r in rows:
        key, p50 = (r["case"], r["provider"]), float(r["p50"] or "nan")
        if r["metric"] == "bandwidth":
            out[key] = (p50, "GB/s")
        elif r["metric"] == "throughput":
            out[key] = (p50, "GFLOP/s")
    for r in rows:
        key, p50 = (r["case"], r["provider"]), float(r["p50"] or "nan")
        if key in out:
            continue
        if r["metric"] == "pct_memcpy" and "memcpy_gbps" in lim:
            out[key] = (p50 / 100 * lim["memcpy_gbps"], "GB/s")
        elif r["metric"] == "pct_gemm_peak":
            peak = lim.get("gemm_bfloat16_gflops" if _is_bf16(r) else "gemm_float32_gflops")
            if peak:
                out[key] = (p50 / 100 * peak, "GFLOP/s")
    return out


def limit_label(rows, unit):
    """The machine figure named beside an achieved rate, e.g. "memcpy 29" or "GEMM fp32 175 / bf16 408"."""
    lim = _limits(rows)
    if unit == "GB/s":
        return f"memcpy {lim['memcpy_gbps']:.0f}" if "memcpy_gbps" in lim else "memcpy not measured"
    parts = [f"{name} {lim[key]:.0f}" for name, key in (("fp32", "gemm_float32_gflops"),
                                                        ("bf16", "gemm_bfloat16_gflops")) if key in lim]
    return "GEMM " + " / ".join(parts) if parts else "GEMM not measured"


def _rate_unit(rates, provider):
    units = {u for (_, p), (_, u) in rates.items() if p == provider}
    return units.pop() if len(units) == 1 else None


def kernel_table(rows):
    """Markdown: one line per case; a column per provider (median ms, † when noisy), the speedup of
    each of ours over each baseline, and the rate each of ours achieved."""
    times = _times(rows)
    providers = _providers(times)
    ours = [p for p in OURS if p in providers]
    rates = achieved(rows)
    units = {o: _rate_unit(rates, o) for o in ours}
    head = (["case"] + [f"{p} ms" for p in providers]
            + [f"{o} vs {p}" for o in ours for p in providers if p not in OURS]
            + [f"{o} {units[o]} ({limit_label(rows, units[o])})" for o in ours if units[o]])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    noisy = 0
    for case, t in times.items():
        flags = {p for p, r in t.items() if _noisy(r)}
        noisy += bool(flags)
        cells = [case.replace(",", ", ")]
        cells += [_fmt(float(t[p]["p50"])) + (NOISY if p in flags else "") if p in t else "–" for p in providers]
        for o in ours:
            for p in providers:
                if p not in OURS:
                    cells.append(f"{float(t[p]['p50']) / float(t[o]['p50']):.2f}x" if o in t and p in t else "–")
        cells += [_fmt(rates[(case, o)][0]) if (case, o) in rates else "–" for o in ours if units[o]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines), noisy


HEADLINE = ("| op | ours | cases | vs fastest peer | peers | vs the torch reference | achieved | noisy cases |\n"
            + "|---" * 8 + "|")


def _spread(ratios, n):
    if not ratios:
        return "–"
    out = f"{_ratio(statistics.median(ratios))} ({_ratio(min(ratios))}-{_ratio(max(ratios))})"
    return out if len(ratios) == n else f"{out} on {len(ratios)} cases"


def headline(stem, rows):
    """One summary row per (op, one of ours): cases; per case the ratio to the fastest peer (other
    implementations, not the plain torch reference, not floors) and to the torch reference, as median
    (range) over cases; the achieved rate (median, range) beside the machine figure; noisy cases."""
    times = _times(rows)
    rates = achieved(rows)
    out = []
    for o in [p for p in OURS if p in _providers(times)]:
        vs_peer, vs_ref, peers, got, noisy, n = [], [], [], [], 0, 0
        for case, t in times.items():
            if o not in t:
                continue
            n += 1
            noisy += any(_noisy(r) for r in t.values())
            ours = float(t[o]["p50"])
            others = {p: float(r["p50"]) for p, r in t.items()
                      if p not in OURS + FLOORS + REFERENCES + VARIANTS and not p.endswith("_checked")}
            peers += [p for p in others if p not in peers]
            if others:
                vs_peer.append(min(others.values()) / ours)
            refs = [float(t[p]["p50"]) for p in REFERENCES if p in t]
            if refs:
                vs_ref.append(refs[0] / ours)
            if (case, o) in rates:
                got.append(rates[(case, o)])
        rate = "–"
        if got:
            vals = [v for v, _ in got]
            unit = got[0][1]
            rate = (f"{_fmt(statistics.median(vals))} {unit} ({_fmt(min(vals))}-{_fmt(max(vals))}; "
                    f"{limit_label(rows, unit)})")
        out.append(f"| {stem} | {o} | {n} | {_spread(vs_peer, n)} | {', '.join(peers) or '–'} | "
                   f"{_spread(vs_ref, n)} | {rate} | {noisy} |")
    return out


VARIANT_HEAD = ("| form | cases | ratio: median (range) | extra per call |\n"
                "|---|---|---|---|")


def variant_rows(stem, rows):
    """The engine-facing forms of an op against their counterparts (VARIANT_ROWS), same cases, same run."""
    times = _times(rows)
    out = []
    for variant, other, what in VARIANT_ROWS.get(stem, ()):
        ratios, extra = [], []
        for t in times.values():
            if variant in t and other in t:
                a, b = float(t[variant]["p50"]), float(t[other]["p50"])
                ratios.append(b / a)
                extra.append((a - b) * 1e3)  # ms -> us
        if ratios:
            us = (f"{statistics.median(extra):+.2f} µs ({min(extra):+.2f} to {max(extra):+.2f})"
                  if other == "cpp_raw" else "–")
            out.append(f"| {what} | {len(ratios)} | {_spread(ratios, len(ratios))} | {us} |")
    return out


def _kernel_csvs(results_dir):
    return [p for p in sorted(glob.glob(os.path.join(results_dir, "*.csv"))) if os.path.basename(p) != "decoding.csv"]


def _when(rows):
    info = rows[0]
    return f"{info['timestamp'][:10]}, specops {info['git_sha']}"


def _machine_line(rows, what):
    info = rows[0]
    n = int(info["threads"])
    return (f"Measured ({what}) {info['timestamp'][:10]} on {info['cpu']} ({info['machine']}, {n} "
            f"thread{'s' if n != 1 else ''}), torch {info['torch']}, triton {info['triton']}, "
            f"specops {info['git_sha']}.")


def _limits_line(row_sets):
    """The machine's limits as measured by each run (a range when the runs disagree)."""
    got = {}
    for rows in row_sets:
        for k, v in _limits(rows).items():
            got.setdefault(k, []).append(v)

    def span(key):
        lo, hi = min(got[key]), max(got[key])
        return f"{lo:.0f}" if round(lo) == round(hi) else f"{lo:.0f}-{hi:.0f}"

    parts = []
    if "memcpy_gbps" in got:
        parts.append(f"memcpy {span('memcpy_gbps')} GB/s (DRAM-sized buffers, read + write)")
    gemm = [f"{name} {span(key)}" for name, key in (("fp32", "gemm_float32_gflops"), ("bf16", "gemm_bfloat16_gflops"))
            if key in got]
    if gemm:
        parts.append("GEMM " + " / ".join(gemm) + " GFLOP/s")
    if not parts:
        return ""
    return "Machine limits measured by each run (the tables name each run's own): " + ", ".join(parts) + "."


def _reruns(rows):
    """Names the cases a later partial run (``--tasks`` / ``--modes``) replaced, if any."""
    runs = {}
    for r in rows:
        if r["provider"] != "machine":
            p = json.loads(r["params"] or "{}")
            runs.setdefault((r["git_sha"], r["timestamp"]), set()).add(
                f"{p.get('target')} {p.get('task')} {p.get('mode')} b{p.get('batch')}")
    if len(runs) < 2:
        return ""
    main = max(runs, key=lambda k: len(runs[k]))
    later = sorted(c for k, cases in runs.items() if k != main for c in cases)
    return (f" Rerun later in a separate run on the same machine: {', '.join(later)} "
            f"(rows carry their git sha and time).")


def _best(cell):
    """(AR tok/s, best specops method, its tok/s, best HF peer or None, its tok/s) of one case."""
    ar = cell.get("ar", {}).get("tokens_per_s")
    ours = {p: v["tokens_per_s"] for p, v in cell.items()
            if "tokens_per_s" in v and p != "ar" and not p.startswith("hf_")}
    peers = {p: v["tokens_per_s"] for p, v in cell.items() if "tokens_per_s" in v and p.startswith("hf_")}
    if ar is None or not ours:
        return None
    best = max(ours, key=ours.get)
    hf = max(peers, key=peers.get) if peers else None
    return ar, best, ours[best], hf, peers.get(hf)


def _cells(piv):
    out = {}
    for k, v in piv.items():
        out.setdefault(k[:4], {})[k[4]] = v
    return out


def summary_table(rows):
    """Markdown: per (target, sampling, batch, task): AR tok/s, the best specops method and the best
    HF peer with their tok/s, and the ratio between them; then the targets line."""
    head = ["target", "sampling", "batch", "task", "AR tok/s", "best specops method", "tok/s", "vs AR",
            "best HF peer", "tok/s", "specops / HF"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    vs_hf, code_edit = [], []
    for (target, mode, batch, task), cell in sorted(_cells(paper_claims.pivot(rows)).items()):
        got = _best(cell)
        if got is None:
            continue
        ar, best, tps, hf, hf_tps = got
        lines.append(f"| {target} | {mode} | {batch} | {task} | {ar:.1f} | {best} | {tps:.1f} | "
                     f"{tps / ar:.2f}x | {hf or '–'} | {_fmt(hf_tps) if hf else '–'} | "
                     f"{f'{tps / hf_tps:.2f}x' if hf else '–'} |")
        if hf:
            vs_hf.append((str(batch) == "1", tps / hf_tps >= 1.5))
        if task == "code_edit":
            code_edit.append(tps / ar >= 3)
    return "\n".join(lines) + "\n\n" + _targets_line(vs_hf, code_edit)


def _targets_line(vs_hf, code_edit):
    per_cat = [ok for b1, ok in vs_hf if b1]
    return (f"Targets on this run: best specops method >= 1.5x the best HF peer on {sum(per_cat)} of "
            f"{len(per_cat)} (target, sampling, prompt category) cases at batch 1, and on "
            f"{sum(ok for _, ok in vs_hf)} of {len(vs_hf)} cases counting the mixed batch-4 rows; "
            f">= 3x AR on code-editing prompts in {sum(code_edit)} of {len(code_edit)} cases.")


def category_table(rows):
    """Markdown: one row per prompt category (batch > 1 apart), one column per (target, sampling):
    the best specops method, its tok/s and its ratios to AR and to the best HF peer."""
    cells = _cells(paper_claims.pivot(rows))
    cols = sorted({(t, m) for t, m, _, _ in cells}, key=lambda c: (c[0] != "smollm2-135m", c))
    tasks = sorted({(b, task) for _, _, b, task in cells})
    lines = ["| prompts | " + " | ".join(f"{t} {m}" for t, m in cols) + " |", "|" + "---|" * (len(cols) + 1)]
    vs_hf, code_edit = [], []
    for batch, task in tasks:
        row = [task if batch == 1 else f"{task} (batch {batch})"]
        for t, m in cols:
            got = _best(cells.get((t, m, batch, task), {}))
            if got is None:
                row.append("–")
                continue
            ar, best, tps, hf, hf_tps = got
            row.append(f"{best} {tps:.1f} tok/s: {tps / ar:.2f}x AR" + (f", {tps / hf_tps:.2f}x HF" if hf else ""))
            if hf:
                vs_hf.append((batch == 1, tps / hf_tps >= 1.5))
            if task == "code_edit":
                code_edit.append(tps / ar >= 3)
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n\n" + _targets_line(vs_hf, code_edit)


def decoding_table(rows):
    """Markdown: one line per (target, task, sampling, batch, provider): tok/s, speedup vs AR and vs
    the best HF peer, mean acceptance length, drafted tokens per step, time split, deviation."""
    piv = paper_claims.pivot(rows)
    head = ["target", "task", "sampling", "batch", "provider", "tok/s", "vs AR", "vs best HF", "MAL",
            "drafted/step", "draft/verify/other %", "differs from AR %", "ppl vs AR"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (target, mode, batch, task, provider), m in sorted(piv.items()):
        def cell(name, fmt="{:.2f}"):
            return fmt.format(m[name]) if m.get(name) is not None else "–"
        split = "–" if "time_draft_share" not in m else (
            f"{m['time_draft_share']:.0f}/{m['time_verify_share']:.0f}/"
            f"{m['time_bookkeeping_share'] + m.get('time_prefill_share', 0):.0f}")
        lines.append(f"| {target} | {task} | {mode} | {batch} | {provider} | {cell('tokens_per_s', '{:.1f}')} | "
                     f"{cell('speedup_vs_ar')} | {cell('speedup_vs_best_hf')} | {cell('mean_acceptance_length')} | "
                     f"{cell('drafted_tokens_per_step', '{:.1f}')} | {split} | "
                     f"{cell('tokens_differing_from_ar', '{:.1f}')} | {cell('perplexity_vs_ar', '{:.3f}')} |")
    return "\n".join(lines)


def _plots(results_dir, kernel):
    found = sorted(glob.glob(os.path.join(results_dir, "plots", "*.png")))
    return [p for p in found if os.path.basename(p).startswith("kernel_") == kernel]


def _link(path, base):
    return f"[{os.path.basename(path)[:-4]}]({os.path.relpath(path, base)})"


def summary(results_dir, readme_dir, tables_path):
    """The README's part: machine, headline kernel rows, end to end per category, plots, a link to
    the full tables."""
    kernels = _kernel_csvs(results_dir)
    decoding = os.path.join(results_dir, "decoding.csv")
    tables = os.path.relpath(tables_path, readme_dir)
    out = []
    if kernels:
        out.append(_machine_line(load(kernels[0]), "kernels") + " " + _limits_line([load(p) for p in kernels]) + "\n")
    if os.path.exists(decoding):
        rows = load(decoding)
        out.append(_machine_line(rows, "end to end") + _reruns(rows) + "\n")
    out.append(f"Full tables (every case and provider, spreads, the paper claims re-checked): [{tables}]({tables}). "
               f"Reproduce: {REPRODUCE}. GPU rows appear once measured on a GPU.")
    if kernels:
        out.append("\n**Kernels**: ours against the fastest other implementation timed in the same run and against "
                   "the plain torch reference (time ratios per case: median and range over cases), and the rate ours "
                   "reached with the machine's own figure beside it (a rate above memcpy means the data stayed in "
                   "cache).\n")
        out.append(HEADLINE)
        for path in kernels:
            out += headline(os.path.basename(path)[:-4], load(path))
        forms = [r for path in kernels for r in variant_rows(os.path.basename(path)[:-4], load(path))]
        if forms:
            out.append("\n**Engine-facing forms** (paged caches, plans; `docs/plans.md`), each against its "
                       "counterpart in the same run (> 1: the form is faster; same cases, same machine):\n")
            out.append(VARIANT_HEAD)
            out += forms
    if os.path.exists(decoding):
        out.append("\n**End to end**: per prompt category, the fastest specops method (method/draft) with its "
                   "tok/s (generated tokens / wall time, prefill included) and its ratios to AR and to the best "
                   "HF peer (generate, assisted generation, prompt lookup) run in the same process.\n")
        out.append(category_table(load(decoding)))
    for what, kernel in (("end to end", False), ("kernels", True)):
        links = [_link(p, readme_dir) for p in _plots(results_dir, kernel)]
        if links:
            out.append(f"\nPlots, {what}: " + " · ".join(links))
    return "\n".join(out)


def machine_tables(results_dir, base_dir):
    """The full tables of one machine directory (links relative to ``base_dir``)."""
    kernels = _kernel_csvs(results_dir)
    decoding = os.path.join(results_dir, "decoding.csv")
    out = []
    if kernels:
        out.append(_machine_line(load(kernels[0]), "kernels") + " " + _limits_line([load(p) for p in kernels]))
    for path in kernels:
        stem = os.path.basename(path)[:-4]
        rows = load(path)
        table, noisy = kernel_table(rows)
        out.append(f"\n### {stem}\n\nCommand: `python -m bench --only {stem}` ({_when(rows)}). Median ms per "
                   f"case; `X vs Y` = Y's time / X's (> 1: X is faster).\n\n{table}")
        if noisy:
            out.append(f"\n{NOISY_NOTE}")
        skipped = sorted({(r["provider"], r["unit"]) for r in rows if r["metric"] == "skipped"})
        if skipped:
            out.append("\nNot measured here: " + "; ".join(f"{p} ({why})" for p, why in skipped) + ".")
        plot = os.path.join(results_dir, "plots", f"kernel_{stem}.png")
        if os.path.exists(plot):
            out.append(f"\nPlot: [{stem}: baseline time / ours per shape]({os.path.relpath(plot, base_dir)})")
    if os.path.exists(decoding):
        rows = load(decoding)
        out.append("\n### end to end\n\n" + _machine_line(rows, "end to end") + " Command: `python "
                   "bench/bench_decoding.py --profile final` (plan and cost: the module docstring). tok/s = "
                   "generated tokens / wall time, prefill included, summed over the task's prompts; every ratio "
                   "compares runs of the same process." + _reruns(rows))
        out.append("\n" + summary_table(rows))
        out.append("\n#### Paper claims re-checked on our models\n\nFrom `python -m bench.paper_claims` (the claims: "
                   "docs/methods.md §Paper claims re-checked; the rules: bench/paper_claims.py).\n\n"
                   + paper_claims.markdown(paper_claims.findings(rows)))
        plots = _plots(results_dir, False)
        if plots:
            out.append("\n#### Plots\n\n" + "\n".join(f"- {_link(p, base_dir)}" for p in plots))
        out.append("\n#### Every provider on every case\n\n" + decoding_table(rows))
    return "\n".join(out)


def tables(root, tables_path):
    """The full-tables file: every machine directory under ``root`` that holds CSVs."""
    base = os.path.dirname(os.path.abspath(tables_path))
    dirs = [d for d in sorted(glob.glob(os.path.join(root, "*")))
            if os.path.isdir(d) and glob.glob(os.path.join(d, "*.csv"))]
    out = ["# Benchmark results", "",
           "Generated by `python -m bench.results_tables` from the CSVs in the folders below (do not edit by hand); the "
           "README shows a summary. Reproduce: " + REPRODUCE + ".", "",
           "Achieved GB/s (memory-bound ops) or GFLOP/s (compute-bound ones) are what the kernel reached; the "
           "machine's memcpy GB/s and GEMM GFLOP/s, measured in the same run, are named beside them. Rates above the "
           "memcpy figure mean the working set stayed in cache. " + NOISY_NOTE]
    for d in dirs:
        out += ["", f"## {os.path.basename(d)}", "", machine_tables(d, base)]
    return "\n".join(out) + "\n"


def _only_dir():
    dirs = sorted(d for d in glob.glob(os.path.join(RESULTS, "*")) if os.path.isdir(d))
    if len(dirs) != 1:
        raise SystemExit(f"pass --results: found {dirs or 'no result directories'}")
    return dirs[0]


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench.results_tables", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", default=None,
                        help="directory of CSVs (default: the only one under bench/results)")
    parser.add_argument("--readme", default=os.path.join(os.path.dirname(_HERE), "README.md"))
    parser.add_argument("--tables", default=None, help="full-tables file (default: README.md beside the results dir)")
    args = parser.parse_args(argv)
    results = os.path.abspath(args.results or _only_dir())
    if not _kernel_csvs(results) and not os.path.exists(os.path.join(results, "decoding.csv")):
        raise SystemExit(f"no CSVs under {results}: run `python -m bench` first")
    tables_path = os.path.abspath(args.tables or os.path.join(os.path.dirname(results), "README.md"))
    with open(args.readme) as f:
        text = f.read()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{args.readme} lacks the {BEGIN} / {END} markers")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    readme_dir = os.path.dirname(os.path.abspath(args.readme))
    with open(tables_path, "w") as f:
        f.write(tables(os.path.dirname(results), tables_path))
    with open(args.readme, "w") as f:
        f.write(head + BEGIN + "\n" + summary(results, readme_dir, tables_path) + "\n" + END + tail)
    print(f"updated {args.readme} and {tables_path} from {results}")


if __name__ == "__main__":
    sys.exit(main())
