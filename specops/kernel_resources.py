"""GPU resource report: registers, spills, shared memory and occupancy of every kernel, per arch.

``python -m specops.kernel_resources [--arch 80 90] [--cuda-so PATH] [--no-triton]`` prints a row per
(kernel, config, arch), no GPU needed. Triton rows: the AOT compile of ``specops.triton_kernels.aot`` (the
launchers' launches, compiled as the JIT does). CUDA rows: ``cuobjdump`` of ``specops/_C_cuda*.so``
(registers, stack, static smem, launch bounds), with ``CUDA_LAUNCH`` for what it lacks (dynamic smem, block
sizes without launch bounds). Invariant tree attention kernels (``Inv`` = true) also keep a query's visible
keys in smem sized per call (:func:`invariant_extra_smem`), named in their notes, left out of smem and
occupancy. Occupancy: resident blocks per SM (A100 / H100 figures below) and the limiting resource."""
import argparse
import glob
import itertools
import math
import os
import re
import shutil
import subprocess
import sys

from specops.triton_kernels import aot

# Per-SM limits of the A100 (sm_80) and H100 (sm_90) (CUDA programming guide, compute capability tables):
# 64 K registers, 2048 threads, 32 blocks; smem per SM and per block (opt-in). The runtime reserves 1 KB of
# smem per resident block, which sm_90 cubins (not sm_80's) count in their static smem (none used: 1024 B).
_SM = dict(regs=65536, threads=2048, blocks=32)
ARCH = {80: dict(_SM, gpu="A100", smem_sm=167936, smem_block=aot.SMEM_PER_BLOCK[80], smem_reserved=1024),
        90: dict(_SM, gpu="H100", smem_sm=233472, smem_block=aot.SMEM_PER_BLOCK[90], smem_reserved=0)}
REG_UNIT = 256  # registers are allocated per warp in units of 256

# What the binary does not say of a launch (csrc/cuda/*.cu): kernel -> (threads per block, None: from
# __launch_bounds__; dynamic shared memory bytes, None: set per call).
CUDA_LAUNCH = {
    "apply_token_bitmask_kernel": (256, 0),  # token_bitmask.cu: 256 threads, no dynamic shared memory
    "combine_kernel": (128, 0),  # tree_attention.cu: <<<rows, 128, 0>>>
    "build_tree_mask_kernel": (128, 0),  # tree_mask.cu: kThreads = 128, no dynamic shared memory
    "tree_attention_kernel": (None, None),  # tree_attention.cu (fp32): dynamic smem sized per call
}
# The tensor-core kernel has per-instantiation entries only (below): cuda_rows reports one that
# matches none (its template arguments changed in the source) as a problem.


def _tc_smem(dp):
    """Dynamic shared memory of tree_attention_tc_kernel<T, DP, Paged, Inv>: TcCfg<DP>::kSmem of
    csrc/cuda/tree_attention_tc.cuh (64 Q rows + 2 x (K, V) tiles of BN rows, DP + 8 halves each)."""
    bn = 32 if dp >= 128 else 64
    return (64 + 4 * bn) * (dp + 8) * 2


def invariant_extra_smem(w, s):
    """Extra dynamic shared memory of an invariant tree attention call (mask width ``w``, cache length
    ``s``): min(32 w, s) int32 visible keys rounded up to 16 B (run_call, csrc/cuda/tree_attention.cu)."""
    return -(-min(32 * w, s) // 4) * 16


INV_NOTE = "+ ceil(min(32 W, S) / 4) * 16 B smem per call (invariant key list)"

# Template parameters <T, DP, Paged, Inv>: Inv (invariant=True) adds invariant_extra_smem per call.
for _t, _dp, _paged, _inv in itertools.product(("Half", "BFloat16"), (64, 128, 256), *[("false", "true")] * 2):
    CUDA_LAUNCH[("tree_attention_tc_kernel", f"<{_t}, {_dp}, {_paged}, {_inv}>")] = (128, _tc_smem(_dp))


def occupancy(arch, regs, threads, smem):
    """(blocks per SM, limiting resource) of a kernel: ``regs`` per thread, ``threads`` per block,
    ``smem`` bytes of shared memory per block (static + dynamic)."""
    a = ARCH[arch]
    warps = -(-threads // 32)
    per_warp = -(-max(regs, 1) * 32 // REG_UNIT) * REG_UNIT
    footprint = smem + a["smem_reserved"]
    fit = a["smem_sm"] // footprint if footprint else a["blocks"]  # blocks whose smem fits in the SM's
    limits = {"threads": a["threads"] // (warps * 32), "regs": (a["regs"] // per_warp) // warps,
              "blocks": a["blocks"], "smem": 0 if smem > a["smem_block"] else fit}
    which = min(limits, key=limits.get)
    return limits[which], which


_VARIANTS = {"G", "SPLIT", "STAGE2", "SAMPLE", "MODE"}  # constexprs shown next to the tiles


def triton_rows(archs, aot_rows=None):
    """Report rows of every Triton kernel, from ``aot_rows`` (of aot.collect) or a fresh AOT compile."""
    if aot_rows is not None:
        rows = [r for r in aot_rows if r["arch"] in archs]
    elif os.environ.get("TRITON_INTERPRET") == "1":
        rows, _ = aot.collect_in_subprocess(archs)
    else:
        rows = aot.collect_parallel(archs)
    out = []
    for r in rows:
        row = {"kind": "triton", "kernel": f"{r['module']}.{r['kernel']}", "config": r["case"], "arch": r["arch"],
               "problems": r["problems"]}
        if "regs" in r:
            tiles = " ".join(f"{k[6:]}{v}" if k.startswith("BLOCK_") else f"{k}={v}" for k, v in
                             (c.split("=") for c in r.get("config", "").split())
                             if k.startswith("BLOCK_") or k in _VARIANTS)
            row.update(regs=r["regs"], spills=r["spills"], smem=r["smem"], threads=32 * r["num_warps"],
                       detail=f"warps {r['num_warps']} stages {r['num_stages']} {tiles}")
        out.append(row)
    return out


def _max_threads(elf_text):
    """{(arch, mangled kernel): __launch_bounds__ threads} from ``cuobjdump -elf``."""
    out, arch, fn, pending = {}, None, None, False
    for line in elf_text.splitlines():
        if m := re.match(r"\s*arch = (sm_\d+)", line):
            arch = m.group(1)
        elif line.startswith(".nv.info."):
            fn = line[len(".nv.info."):].strip()
        elif "EIATTR_MAX_THREADS" in line:
            pending = True
        elif pending and "Value:" in line:
            out[arch, fn] = math.prod(int(v, 16) for v in line.split("Value:")[1].split())
            pending = False
    return out


def _split_name(demangled):
    """("tree_attention_kernel", "<BFloat16, 8>") of a demangled kernel signature."""
    name = demangled.replace("(anonymous namespace)::", "").replace("specops::", "").replace("c10::", "")
    kernel, _, tmpl = re.sub(r"^void ", "", name).split("(", 1)[0].partition("<")  # no return type, no args
    return kernel, (f"<{tmpl}" if tmpl else "-")


def cuda_so_path():
    """The built CUDA extension next to this package, or None."""
    here = os.path.dirname(os.path.abspath(__file__))
    found = sorted(glob.glob(os.path.join(here, "_C_cuda.*.so")))  # not _C_cudasim
    return found[0] if found else None


def cuda_rows(so_path, archs):
    """One row per (CUDA kernel, arch) of the extension at ``so_path``. Stack stands for spills, though
    nvcc stack frames can also be local arrays (``nvcc -Xptxas -v`` tells them apart)."""
    usage = aot.parse_resource_usage(aot.cuobjdump(so_path, "--dump-resource-usage"))
    bounds = _max_threads(aot.cuobjdump(so_path, "-elf"))
    mangled, tool = sorted({r["function"] for r in usage}), shutil.which("c++filt")
    demangled = tool and subprocess.run([tool], input="\n".join(mangled), capture_output=True, text=True)
    names = dict(zip(mangled, (demangled and demangled.stdout.splitlines()) or mangled))  # else: as mangled
    rows = []
    for r in usage:
        arch = int(r["arch"][3:]) if r["arch"] else None
        if arch not in archs:
            continue
        kernel, config = _split_name(names[r["function"]])
        launch = CUDA_LAUNCH.get((kernel, config), CUDA_LAUNCH.get(kernel))
        t, dyn = launch or (None, 0)
        threads = t or bounds.get((r["arch"], r["function"]))
        problems = [f"no CUDA_LAUNCH entry for {config}: dynamic smem unknown"] if (
            launch is None and kernel == "tree_attention_tc_kernel") else []
        notes = ["spills are stack bytes"] if r["STACK"] else []
        if dyn is None:
            notes.append("+ dynamic smem per call")
        elif kernel in ("tree_attention_kernel", "tree_attention_tc_kernel") and config.rstrip(">").endswith(", true"):
            notes.append(INV_NOTE)  # the invariant instantiation: last template argument Inv = true
        rows.append({"kind": "cuda", "kernel": kernel, "config": config, "arch": arch, "regs": r["REG"],
                     "spills": r["STACK"], "smem": r["SHARED"] + (dyn or 0), "threads": threads,
                     "detail": "; ".join(notes), "problems": problems})
    return rows


def table(rows):
    """Text table of rows (dicts with kind, kernel, config, arch, regs, spills, smem, threads)."""
    head = ("kind", "kernel", "config", "arch", "regs", "spills B", "smem B", "threads", "blocks/SM", "limit",
            "notes")
    lines = [head]
    for r in rows:
        which = (r["kind"], r["kernel"], r["config"], f"sm_{r['arch']}")
        if "regs" not in r:
            lines.append((*which, *["-"] * 6, "; ".join(r["problems"])[:80]))
            continue
        if r.get("threads"):
            blocks, limit = occupancy(r["arch"], r["regs"], r["threads"], r["smem"])
            occ = f"{blocks} ({blocks * r['threads'] * 100 // ARCH[r['arch']]['threads']}%)"
        else:
            occ, limit = "?", "no block size"
        lines.append((*which, str(r["regs"]), str(r["spills"]), str(r["smem"]), str(r.get("threads") or "?"),
                      occ, limit, "; ".join(r["problems"]) or r.get("detail", "")))
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(head))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(line, widths)).rstrip() for line in lines)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m specops.kernel_resources", description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", type=int, nargs="+", default=sorted(ARCH), choices=sorted(ARCH))
    parser.add_argument("--cuda-so", default=None, help="CUDA extension to read (default: the built one, if any)")
    parser.add_argument("--no-triton", action="store_true", help="skip the Triton AOT compile")
    args = parser.parse_args(argv)
    rows = [] if args.no_triton else triton_rows(args.arch)
    so = args.cuda_so or cuda_so_path()
    if so:
        rows += cuda_rows(so, args.arch)
    else:
        print("(no CUDA extension built: no CUDA rows)", file=sys.stderr)
    print(table(rows))
    return 1 if any(r["problems"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
