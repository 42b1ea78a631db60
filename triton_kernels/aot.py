"""Compiles, for sm_80 and sm_90 and without a GPU, the Triton kernels the launchers launch, as the
JIT would compile them on a device, and checks their budgets.

What the JIT compiles depends on the arguments: pointers and ints divisible by 16 get a
``tt.divisibility = 16`` hint, ints equal to 1 become constants, and ``num_warps`` /
``num_stages`` / ``enable_fp_fusion`` come from the launch. So the check does not describe kernels
by hand: each module's ``AOT_SPECS`` gives launches (``Launch`` objects, or a call of the
module's own launcher on meta tensors, whose launches are recorded), and ``bind`` runs them
through the JIT's own argument binder (``create_function_from_signature`` and ``_pack_args`` of
``triton.runtime.jit``) for the target arch. Meta tensors have data pointer 0, i.e. 16-aligned,
as fresh CUDA allocations are.

``AOT_SPECS``: an iterable (or a function returning one) of ``(name, arch, launches, budget)``;
``arch`` None means every arch, ``launches`` a list of ``Launch`` or a zero-argument function
that calls the launcher, ``budget`` the register spill bytes allowed (0 for the main configs) or
a dict {"spills": bytes, "smem": bytes} (smem: a limit below the arch's).

Run ``python -m specops.triton_kernels.aot [--json PATH]`` with TRITON_INTERPRET unset: one line
per (case, kernel, arch), then exits non-zero if a kernel did not compile, needs more shared
memory than the arch allows, or spills more than its case allows.
"""
import argparse
import contextlib
import importlib
import json
import os
import pkgutil
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

ARCHS = (80, 90)
# Shared memory a block may opt in to (cudaDevAttrMaxSharedMemoryPerBlockOptin) on the A100 / H100.
SMEM_PER_BLOCK = {80: 166912, 90: 232448}


@dataclass
class Launch:
    """One kernel launch: ``kernel[grid](*args, **kwargs)``."""
    kernel: object
    grid: tuple
    args: tuple
    kwargs: dict


@contextlib.contextmanager
def _recording(launches):
    from triton.runtime.jit import JITFunction

    def run(self, *args, grid, warmup, **kwargs):
        launches.append(Launch(self, tuple(grid) if not callable(grid) else grid, args, dict(kwargs)))

    original = JITFunction.run
    JITFunction.run = run
    try:
        yield
    finally:
        JITFunction.run = original


def record(fn):
    """The launches ``fn()`` makes (nothing is compiled or run): call a launcher on meta tensors."""
    launches = []
    with _recording(launches):
        fn()
    return launches


def bind(launch, arch):
    """(signature, constexprs, attrs, options) the JIT derives from this launch's arguments for sm_<arch>."""
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature

    kernel = launch.kernel
    backend = make_backend(GPUTarget("cuda", arch, 32))
    kwargs = dict(launch.kwargs)
    # As JITFunction.run does before binding.
    kwargs["debug"] = kwargs.get("debug", kernel.debug) or knobs.runtime.debug
    kwargs["instrumentation_mode"] = knobs.compilation.instrumentation_mode
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound, specialization, options = binder(*launch.args, **kwargs)
    options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound, specialization, options)
    return signature, constexprs, attrs, options


def compile_launch(launch, arch, float_scalars="fp32"):
    """(compiled kernel, bind(launch, arch)): what the JIT would compile for this launch.
    ``float_scalars="fp64"`` types the Python-float arguments fp64, as torch.compile's inductor does
    when it traces a call of the kernel into a graph (the JIT types them fp32)."""
    import triton
    from triton.backends.compiler import GPUTarget

    bound = bind(launch, arch)
    signature, constexprs, attrs, options = bound
    if float_scalars != "fp32":
        signature = {k: float_scalars if t == "fp32" else t for k, t in signature.items()}
    src = triton.compiler.ASTSource(launch.kernel, signature, constexprs, attrs)
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options.__dict__), bound


_FUNCTION = re.compile(r"^\s*Function (\S+):\s*$")
_USAGE = re.compile(r"(\w+(?:\[\d+\])?):(\d+)")
_ARCH = re.compile(r"^\s*arch = (sm_\d+)")


def parse_resource_usage(text):
    """Rows {arch, function, REG, STACK, SHARED, LOCAL, ...} of ``cuobjdump --dump-resource-usage``
    output (a cubin, or a fat binary / shared library holding several archs)."""
    rows, arch, function = [], None, None
    for line in text.splitlines():
        if m := _ARCH.match(line):
            arch = m.group(1)
        elif m := _FUNCTION.match(line):
            function = m.group(1)
        elif function is not None and "REG:" in line:
            rows.append({"arch": arch, "function": function, **{k: int(v) for k, v in _USAGE.findall(line)}})
            function = None
    return rows


def cuobjdump(path, *flags):
    from triton import knobs

    return subprocess.run([knobs.nvidia.cuobjdump.path, *flags, path], capture_output=True, text=True,
                          check=True).stdout


_STL = re.compile(r"\bSTL(?:\.(\d+))?\b")


def resources(compiled):
    """{regs, spills, stack, smem, smem_static, num_warps, num_stages} of a compiled Triton kernel.

    ``spills`` counts the bytes of local-memory stores (STL) in the SASS, which is what ptxas
    reports as spill stores for Triton kernels (they have no local arrays); read only when the
    kernel has a stack frame at all."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.cubin")
        with open(path, "wb") as f:
            f.write(compiled.asm["cubin"])
        usage = [r for r in parse_resource_usage(cuobjdump(path, "--dump-resource-usage"))
                 if r["function"] == compiled.name]
        if len(usage) != 1:
            raise RuntimeError(f"{compiled.name}: cuobjdump reported {len(usage)} entries")
        usage = usage[0]
        spills = 0
        if usage["STACK"] or usage["LOCAL"]:
            sass = cuobjdump(path, "-sass")
            spills = sum(int(w or 32) // 8 for w in _STL.findall(sass))
    md = compiled.metadata
    return {"regs": usage["REG"], "spills": spills, "stack": usage["STACK"], "smem": md.shared + usage["SHARED"],
            "smem_static": usage["SHARED"], "num_warps": md.num_warps, "num_stages": md.num_stages}


def cases(module):
    """(name, arch, launches, budget dict) of one module's AOT_SPECS, launcher calls recorded."""
    specs = getattr(module, "AOT_SPECS", ())
    for name, arch, launches, budget in (specs() if callable(specs) else specs):
        budget = {"spills": budget} if isinstance(budget, int) else dict(budget)
        yield name, arch, (record(launches) if callable(launches) else launches), budget


def _specialisation(bound, kernel):
    """The constants (constexprs and ints the JIT fixed at 1) and the 16-divisible arguments."""
    _, constexprs, attrs, _ = bound
    names = kernel.arg_names
    consts = " ".join(f"{names[k[0]]}={v}" for k, v in sorted(constexprs.items()) if len(k) == 1)
    aligned = [names[k[0]] for k, v in sorted(attrs.items()) if len(k) == 1 and ["tt.divisibility", 16] in v]
    return consts, aligned


def collect(archs=ARCHS, modules=None, log=None):
    """Compiles every case for every arch: one dict per (module, case, kernel, arch) with its
    resources, its limits and a list ``problems`` (empty when within budget)."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise RuntimeError("unset TRITON_INTERPRET: the interpreter cannot compile for a GPU")
    import specops.triton_kernels as pkg

    names = modules or [m.name for m in pkgutil.iter_modules(pkg.__path__) if m.name != "aot"]
    rows, widened = [], set()
    for mod_name in names:
        module = importlib.import_module(f"{pkg.__name__}.{mod_name}")
        for name, case_arch, launches, budget in cases(module):
            for arch in archs:
                if case_arch is not None and case_arch != arch:
                    continue
                for launch in launches:
                    key = (mod_name, launch.kernel.__name__, arch)
                    if key not in widened and "fp32" in bind(launch, arch)[0].values():
                        # A kernel that takes a Python float compiles with it typed fp64 too (once per
                        # kernel and arch): that is how inductor passes it inside a compiled graph.
                        widened.add(key)
                        row = {"module": mod_name, "case": f"{name} (float args fp64)", "kernel": key[1],
                               "arch": arch, "budget": budget}
                        start = time.perf_counter()
                        try:
                            row.update(resources(compile_launch(launch, arch, "fp64")[0]), problems=[])
                        except Exception as err:
                            row["problems"] = [f"compile failed: {type(err).__name__}: {str(err)[:2000]}"]
                        row["seconds"] = round(time.perf_counter() - start, 2)
                        rows.append(row)
                        if log:
                            log(row)
                    start = time.perf_counter()
                    row = {"module": mod_name, "case": name, "kernel": launch.kernel.__name__, "arch": arch}
                    try:
                        compiled, bound = compile_launch(launch, arch)
                        row.update(resources(compiled))
                        row["config"], row["aligned"] = _specialisation(bound, launch.kernel)
                        problems = []
                        smem = min(SMEM_PER_BLOCK[arch], budget.get("smem", SMEM_PER_BLOCK[arch]))
                        if row["smem"] > smem:
                            problems.append(f"shared memory {row['smem']} B > {smem} B")
                        spills = budget.get("spills", 0)
                        if row["spills"] > spills:
                            problems.append(f"{row['spills']} B of register spills (allowed: {spills} B)")
                    except Exception as err:  # a compile error is a finding, reported with the rest
                        problems = [f"compile failed: {type(err).__name__}: {str(err)[:2000]}"]
                    row.update(problems=problems, budget=budget, seconds=round(time.perf_counter() - start, 2))
                    rows.append(row)
                    if log:
                        log(row)
    return rows


def _collect_one(arch, module):
    return collect((arch,), (module,))


def collect_parallel(archs=ARCHS, modules=None, jobs=None, log=None):
    """``collect`` split over (arch, module) pairs in ``jobs`` processes (default: the CPU count,
    at most 8); rows grouped by module, then case name, then arch."""
    import concurrent.futures
    import multiprocessing

    import specops.triton_kernels as pkg

    names = modules or [m.name for m in pkgutil.iter_modules(pkg.__path__) if m.name != "aot"]
    jobs = jobs or min(8, os.cpu_count() or 1)
    if jobs <= 1:
        return collect(archs, names, log)
    tasks = [(arch, name) for name in names for arch in archs]
    with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {task: pool.submit(_collect_one, *task) for task in tasks}
        done = {task: f.result() for task, f in futures.items()}
    rows = []
    for name in names:
        by_arch = [done[arch, name] for arch in archs]
        keys = []
        for part in by_arch:
            for r in part:
                if r["case"] not in keys:
                    keys.append(r["case"])
        for case in keys:
            for part in by_arch:
                rows += [r for r in part if r["case"] == case]
    if log:
        for row in rows:
            log(row)
    return rows


def collect_in_subprocess(archs=ARCHS):
    """``collect`` in a fresh interpreter without TRITON_INTERPRET (for callers that run interpreted)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "aot.json")
        proc = subprocess.run([sys.executable, "-m", "specops.triton_kernels.aot", "--json", path, "--quiet",
                               "--arch", *map(str, archs)], env=env, capture_output=True, text=True,
                              timeout=3600)
        if not os.path.exists(path):
            raise RuntimeError(f"AOT run failed ({proc.returncode}):\n{proc.stdout[-4000:]}{proc.stderr[-4000:]}")
        with open(path) as f:
            return json.load(f), proc


def _line(row):
    if "regs" not in row:
        return f"{row['module']}.{row['kernel']} [{row['case']}] sm_{row['arch']}: {'; '.join(row['problems'])}"
    status = "; ".join(row["problems"]) or "ok"
    return (f"{row['module']}.{row['kernel']} [{row['case']}] sm_{row['arch']} warps {row['num_warps']} "
            f"stages {row['num_stages']}: regs {row['regs']}, spills {row['spills']} B, smem {row['smem']} B, "
            f"{row['seconds']:.2f}s: {status}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", type=int, nargs="+", default=list(ARCHS))
    parser.add_argument("--module", nargs="+", help="only these modules of specops.triton_kernels")
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--quiet", action="store_true")
    parser.add_argument("--jobs", type=int, default=None, help="compile processes (default: CPU count, max 8)")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise SystemExit("unset TRITON_INTERPRET: the interpreter cannot compile for a GPU")
    rows = collect_parallel(args.arch, args.module, args.jobs,
                            log=None if args.quiet else lambda r: print(_line(r), flush=True))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    bad = [r for r in rows if r["problems"]]
    print(f"compiled {len(rows)} kernel configs, {len(bad)} over budget or failed")
    for row in bad:
        print("FAIL", _line(row))
    return 1 if bad or not rows else 0


if __name__ == "__main__":
    sys.exit(main())
