"""Compiles every Triton kernel's AOT_SPECS for sm_80 and sm_90 without a GPU.

Each spec is ``(kernel, signature, constexprs[, options])``, options being the compile options
its launcher passes (e.g. ``{"enable_fp_fusion": False}``). Run as ``python -m specops.triton_kernels.aot`` with TRITON_INTERPRET unset: the GPU compiler
rejects things the interpreter accepts (e.g. tl.dot with K < 16), so CI runs this. Prints one
line per (kernel, config, arch) and exits non-zero on the first failure.
"""
import importlib
import os
import pkgutil
import sys
import time


def main(archs=(80, 90)):
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise SystemExit("unset TRITON_INTERPRET: the interpreter cannot compile for a GPU")
    import triton
    from triton.backends.compiler import GPUTarget

    import specops.triton_kernels as pkg

    count = 0
    for info in pkgutil.iter_modules(pkg.__path__):
        if info.name == "aot":
            continue
        module = importlib.import_module(f"{pkg.__name__}.{info.name}")
        for spec in getattr(module, "AOT_SPECS", ()):
            # (fn, signature, constexprs[, compile options the launcher passes, e.g. enable_fp_fusion])
            fn, signature, constexprs = spec[:3]
            options = spec[3] if len(spec) > 3 else None
            for arch in archs:
                start = time.perf_counter()
                src = triton.compiler.ASTSource(fn=fn, signature=signature, constexprs=constexprs)
                compiled = triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options)
                if not compiled.asm.get("cubin"):
                    raise SystemExit(f"{fn.__name__}: no cubin for sm_{arch}")
                print(f"{info.name}.{fn.__name__} {constexprs} sm_{arch}: "
                      f"{time.perf_counter() - start:.2f}s, shared {compiled.metadata.shared} B")
                count += 1
    print(f"compiled {count} kernel configs")
    return count


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
