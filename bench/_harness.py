"""The one benchmark harness: timing with medians and spread, the machine's own limits measured in
the same process, ratios against baselines of the same run, and long-format CSV.

A bench file defines ``measure(rec, quick)`` that calls ``rec.time(...)`` once per (case, provider)
and ends with ``main("<stem>", measure)``; the same file exposes ``test_*`` functions for
``pytest bench/ --benchmark-only`` through :func:`pytest_benchmark`.

Timing rules: warm-up calls first, then repeat until both ``min_repeats`` and ``budget_s`` are met;
on CUDA the device is synchronised around every call. Report the median with p20/p80.
"""
import argparse
import csv
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

import torch

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
FIELDS = ["op", "provider", "case", "params", "metric", "unit", "p50", "p20", "p80", "n",
          "machine", "cpu", "threads", "torch", "triton", "specops", "git_sha", "timestamp"]


@dataclass
class Timing:
    p50: float  # ms
    p20: float
    p80: float
    n: int


def _sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def time_fn(fn, *, device="cpu", warmup=2, min_repeats=5, max_repeats=500, budget_s=0.5):
    """Median / p20 / p80 wall time of ``fn()`` in ms."""
    for _ in range(warmup):
        fn()
    _sync(device)
    times = []
    start = time.perf_counter()
    while len(times) < max_repeats and (len(times) < min_repeats or time.perf_counter() - start < budget_s):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    q = statistics.quantiles(times, n=10, method="inclusive") if len(times) > 1 else times * 9
    return Timing(statistics.median(times), q[1], q[7], len(times))


def peak_extra_memory(fn, device="cpu"):
    """Peak bytes allocated by ``fn()`` above what was live before it (the profiler's allocation
    trace on CPU; the caching allocator's peak on CUDA)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted((e for e in prof.events() if e.cpu_memory_usage), key=lambda e: e.time_range.start)
    live = peak = 0
    for e in events:
        live += e.cpu_memory_usage
        peak = max(peak, live)
    return peak


_LIMITS = {}


def machine_limits(device="cpu", quick=False):
    """The machine's own ceilings, measured now: fp32 / bf16 GEMM GFLOP/s and memcpy GB/s."""
    key = (str(device), quick)
    if key in _LIMITS:
        return _LIMITS[key]
    n = 1024 if quick else 2048
    limits = {}
    for dtype in (torch.float32, torch.bfloat16):
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        t = time_fn(lambda: torch.mm(a, b), device=device, budget_s=0.3 if quick else 1.0)
        limits[f"gemm_{str(dtype).split('.')[-1]}_gflops"] = 2 * n**3 / (t.p50 * 1e6)
    src = torch.empty(64 * 2**20 // 4 if quick else 256 * 2**20 // 4, device=device)
    src.fill_(1.0)
    dst = torch.empty_like(src)
    t = time_fn(lambda: dst.copy_(src), device=device, budget_s=0.3 if quick else 1.0)
    limits["memcpy_gbps"] = 2 * src.numel() * 4 / (t.p50 * 1e6)  # read + write
    _LIMITS[key] = limits
    return limits


def _git_sha():
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=os.path.dirname(os.path.abspath(__file__)), timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def machine_info(device="cpu"):
    import importlib.metadata as md

    def version(dist):
        try:
            return md.version(dist)
        except md.PackageNotFoundError:
            return ""

    if torch.device(device).type == "cuda":
        cpu = torch.cuda.get_device_name()
    else:
        cpu = platform.processor() or platform.machine()
        try:
            with open("/proc/cpuinfo") as f:
                cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
        except (OSError, StopIteration):
            pass
    return {"machine": f"{platform.machine()}-{os.cpu_count()}cores" if device == "cpu" else "cuda",
            "cpu": cpu, "threads": torch.get_num_threads(), "torch": torch.__version__,
            "triton": version("triton"), "specops": version("specops"), "git_sha": _git_sha(),
            "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def case_label(params):
    return ",".join(f"{k}={v}" for k, v in params.items())


class Recorder:
    """Collects rows (one per op x provider x case x metric) and derives throughput and ratios."""

    def __init__(self, op, device="cpu", quick=False, providers=None):
        self.op, self.device, self.quick, self.providers = op, device, quick, providers
        self.rows = []
        self.info = machine_info(device)
        self.limits = machine_limits(device, quick)
        for name, value in self.limits.items():
            self._row("machine", "limits", {}, name, "GFLOP/s" if "gflops" in name else "GB/s", value)

    def wants(self, provider):
        return self.providers is None or provider in self.providers

    def _row(self, provider, case, params, metric, unit, p50, p20=None, p80=None, n=1):
        self.rows.append({"op": self.op, "provider": provider, "case": case, "params": json.dumps(params),
                          "metric": metric, "unit": unit, "p50": p50, "p20": p20 if p20 is not None else p50,
                          "p80": p80 if p80 is not None else p50, "n": n, **self.info})

    def value(self, provider, params, metric, unit, value, n=1):
        """Records one measured number that is not a repeated timing (e.g. an end-to-end run over
        ``n`` prompts)."""
        if value is not None:
            self._row(provider, case_label(params), params, metric, unit, value, n=n)

    def skip(self, provider, params, reason):
        """Records that a provider could not run (a row with the reason, no number)."""
        self.rows.append({"op": self.op, "provider": provider, "case": case_label(params),
                          "params": json.dumps(params), "metric": "skipped", "unit": reason,
                          "p50": "", "p20": "", "p80": "", "n": 0, **self.info})

    def time(self, provider, params, fn, *, flop=None, bytes=None, memory=False, **timing):
        """Times ``fn`` for one (provider, case); ``flop``/``bytes`` of useful work give GFLOP/s, GB/s
        and the share of the measured machine limit (``gemm_peak`` / ``memcpy`` by dtype)."""
        if not self.wants(provider):
            return None
        if self.quick:
            timing.setdefault("budget_s", 0.05)
            timing.setdefault("min_repeats", 3)
        t = time_fn(fn, device=self.device, **timing)
        case = case_label(params)
        self._row(provider, case, params, "time", "ms", t.p50, t.p20, t.p80, t.n)
        if flop:
            self._row(provider, case, params, "throughput", "GFLOP/s", flop / (t.p50 * 1e6),
                      flop / (t.p80 * 1e6), flop / (t.p20 * 1e6), t.n)
            peak_key = "gemm_bfloat16_gflops" if params.get("dtype") in ("bf16", "bfloat16") else "gemm_float32_gflops"
            self._row(provider, case, params, "pct_gemm_peak", "%", 100 * flop / (t.p50 * 1e6) / self.limits[peak_key])
        if bytes:
            self._row(provider, case, params, "bandwidth", "GB/s", bytes / (t.p50 * 1e6),
                      bytes / (t.p80 * 1e6), bytes / (t.p20 * 1e6), t.n)
            self._row(provider, case, params, "pct_memcpy", "%", 100 * bytes / (t.p50 * 1e6) / self.limits["memcpy_gbps"])
        if memory:
            self._row(provider, case, params, "peak_extra_memory", "bytes", peak_extra_memory(fn, self.device))
        return t

    def add_ratios(self, baseline, *, over=None):
        """For every case, ``speedup_vs_<baseline>`` = baseline time / provider time (same run)."""
        times = {(r["case"], r["provider"]): r["p50"] for r in self.rows if r["metric"] == "time"}
        for (case, provider), t in list(times.items()):
            base = times.get((case, baseline))
            if base is None or provider == baseline or (over is not None and provider not in over):
                continue
            params = json.loads(next(r["params"] for r in self.rows if r["case"] == case and r["metric"] == "time"))
            self._row(provider, case, params, f"speedup_vs_{baseline}", "x", base / t)

    def write(self, out_dir=None):
        out_dir = out_dir or os.path.join(RESULTS, self.info["machine"])
        os.makedirs(out_dir, exist_ok=True)
        path = os.path.join(out_dir, f"{self.op}.csv")
        with open(path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=FIELDS)
            writer.writeheader()
            writer.writerows(self.rows)
        return path

    def table(self, metrics=("time",)):
        """A plain-text table: one line per case x provider with the chosen metrics."""
        by_key = {}
        for r in self.rows:
            if r["provider"] == "machine" or r["metric"] not in metrics + tuple(
                    m for m in {r2["metric"] for r2 in self.rows} if m.startswith("speedup_vs_")):
                continue
            by_key.setdefault((r["case"], r["provider"]), {})[r["metric"]] = r
        lines = [f"# {self.op} on {self.info['cpu']} ({self.info['threads']} threads), torch {self.info['torch']}",
                 "# limits: " + ", ".join(f"{k}={v:.1f}" for k, v in self.limits.items())]
        for (case, provider), ms in by_key.items():
            cells = []
            for m, r in ms.items():
                if r["metric"] == "time":
                    cells.append(f"{r['p50']:.4g} ms [{r['p20']:.3g}-{r['p80']:.3g}]")
                else:
                    cells.append(f"{m}={r['p50']:.3g}{'' if r['unit'] in ('x', '%') else ' '}{r['unit']}")
            lines.append(f"{case:<48} {provider:<16} " + "  ".join(cells))
        for r in self.rows:
            if r["metric"] == "skipped":
                lines.append(f"{r['case']:<48} {r['provider']:<16} skipped: {r['unit']}")
        return "\n".join(lines)


def compare(new_csv, old_csv, threshold=1.1):
    """Cases whose median time got slower by more than ``threshold`` x between two CSVs."""
    def load(path):
        with open(path) as f:
            return {(r["op"], r["provider"], r["case"]): float(r["p50"])
                    for r in csv.DictReader(f) if r["metric"] == "time" and r["p50"]}
    new, old = load(new_csv), load(old_csv)
    return [(k, old[k], new[k]) for k in sorted(new) if k in old and new[k] > threshold * old[k]]


def main(op, measure, argv=None):
    """CLI of a bench file: ``python bench/bench_<stem>.py [--quick] [--out DIR] [--providers a,b]``."""
    parser = argparse.ArgumentParser(description=f"benchmark {op}")
    parser.add_argument("--quick", action="store_true", help="tiny shapes and budgets (smoke test)")
    parser.add_argument("--out", default=None, help="directory for the CSV (default bench/results/<machine>)")
    parser.add_argument("--providers", default=None, help="comma-separated subset of providers")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--compare", default=None, help="earlier CSV: print cases >10%% slower now")
    args = parser.parse_args(argv)
    rec = Recorder(op, args.device, args.quick, args.providers.split(",") if args.providers else None)
    measure(rec, args.quick)
    path = rec.write(args.out)
    print(rec.table(metrics=("time", "throughput", "bandwidth", "pct_gemm_peak", "pct_memcpy", "peak_extra_memory", "lower_bound")))
    print(f"# wrote {path}")
    if args.compare:
        for key, old, new in compare(path, args.compare):
            print(f"REGRESSION {key}: {old:.4g} -> {new:.4g} ms")
    return rec


def pytest_benchmark(benchmark, fn, device="cpu", **extra):
    """Runs ``fn`` under pytest-benchmark and stores the harness median in ``extra_info``."""
    t = time_fn(fn, device=device, budget_s=0.2)
    benchmark.extra_info.update({"harness_p50_ms": t.p50, "harness_p20_ms": t.p20, "harness_p80_ms": t.p80, **extra})
    benchmark.pedantic(fn, rounds=max(3, min(t.n, 50)), iterations=1, warmup_rounds=1)


if __name__ == "__main__":
    sys.exit("run a bench_<stem>.py file, not the harness")
