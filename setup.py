"""Build specops: the CPU extension always, the CUDA extension when it can (or must), and the
test-only CUDA emulation (the CUDA sources compiled as host C++) when it can.

Sources are found by directory convention, the same one CMakeLists.txt uses, so there
is no second list to keep: csrc/cpu/*.cpp -> specops._C, csrc/cuda/*.{cu,cpp} -> specops._C_cuda,
csrc/cudasim/*.cpp + every csrc/cuda/*.cu compiled as C++ -> specops._C_cudasim.

Environment:
  SPECOPS_CUDA=auto|0|1     auto (default): build CUDA if torch has CUDA and nvcc exists, warn and
                            skip on failure; 0: never; 1: always, failure is fatal (CI).
  SPECOPS_CUDASIM=auto|0|1  the emulator build (a C++ compiler is all it needs); same meanings.
  SPECOPS_SANITIZE=1        build _C and _C_cudasim with -fsanitize=address,undefined (docs/testing.md).
  TORCH_CUDA_ARCH_LIST      default "8.0;9.0".   CUDA_HOME   default /usr/local/cuda if present.
  MAX_JOBS                  parallel compile jobs (ninja).
Install with `pip install --no-build-isolation .` (torch is the build dependency).
"""
import glob
import os
import warnings

if "CUDA_HOME" not in os.environ and os.path.exists("/usr/local/cuda/bin/nvcc"):
    # torch otherwise guesses CUDA_HOME from the nvcc wrapper on PATH, which is wrong here.
    os.environ["CUDA_HOME"] = "/usr/local/cuda"

import torch  # noqa: E402
from setuptools import find_packages, setup  # noqa: E402
from torch.utils import cpp_extension  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SANITIZE = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer"] if os.environ.get("SPECOPS_SANITIZE") == "1" else []
CXX_FLAGS = ["-O3", "-fopenmp", "-std=c++20"] + SANITIZE
# The emulator build: no FMA contraction (a device's __f*_rn intrinsics are single IEEE operations),
# CUDA's "#pragma unroll" is not GCC's.
# Racecheck: ThreadSanitizer's instrumentation without its runtime; csrc/cudasim/racecheck.cpp defines
# the __tsan_* calls (a flag test when racecheck is off). Only kernel code carries it (KERNEL_CODE:
# every csrc/cuda/*.cu and the planted kernels of selftest.cpp); the emulator's runtime (fibers,
# scheduler, collectives, racecheck itself) is compiled without, so it pays nothing for it.
# SPECOPS_RACECHECK tells the runtime the kernels are instrumented. ASan builds go without (the two
# exclude each other).
RACECHECK = [] if SANITIZE else ["-fsanitize=thread", "--param=tsan-instrument-func-entry-exit=0"]
CUDASIM_FLAGS = (["-O2", "-std=c++20", "-DSPECOPS_CUDASIM", "-ffp-contract=off", "-Wno-unknown-pragmas"] + SANITIZE
                 + (["-DSPECOPS_RACECHECK"] if RACECHECK else []))
KERNEL_CODE = [os.path.join("csrc", "cudasim", "selftest.cpp")]  # + the csrc/cuda/*.cu wrappers


def _sources(*patterns):
    found = []
    for pattern in patterns:
        found += glob.glob(os.path.join("csrc", pattern), root_dir=HERE)
    return sorted(found)


def _mode(var):
    mode = os.environ.get(var, "auto").lower()
    if mode not in ("auto", "0", "1"):
        raise ValueError(f"{var} must be auto, 0 or 1, got {mode!r}")
    return mode


def _cudasim_sources():
    """csrc/cudasim/*.cpp, plus a one-line C++ file per csrc/cuda/*.cu that includes it: the
    CUDA sources compile unchanged as host C++ (torch's build would hand a .cu to nvcc).
    Returns (every source, the kernel code among them)."""
    out = os.path.join("build", "cudasim")
    os.makedirs(os.path.join(HERE, out), exist_ok=True)
    wrappers = []
    for cu in _sources("cuda/*.cu"):
        path = os.path.join(out, os.path.basename(cu)[: -len(".cu")] + ".cpp")
        text = f'#include "{os.path.join(HERE, cu)}"\n'
        full = os.path.join(HERE, path)
        if not os.path.exists(full) or open(full).read() != text:  # keep mtimes for ninja
            with open(full, "w") as f:
                f.write(text)
        wrappers.append(path)
    return _sources("cudasim/*.cpp") + wrappers, wrappers + KERNEL_CODE


def _cuda_reason_missing():
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU-only build"
    home = cpp_extension.CUDA_HOME
    if home is None or not os.path.exists(os.path.join(home, "bin", "nvcc")):
        return f"no nvcc under CUDA_HOME={home!r}"
    return None


def _arch_tag(arch_list):
    # "8.0;9.0+PTX" -> "sm80_sm90": a bare token so it survives the compiler command line.
    archs = [a.split("+")[0].replace(".", "") for a in arch_list.replace(" ", ";").split(";") if a]
    return "_".join(f"sm{a}" for a in archs)


def extensions():
    exts = [
        cpp_extension.CppExtension(
            "specops._C",
            _sources("cpu/*.cpp"),
            extra_compile_args={"cxx": CXX_FLAGS},
            extra_link_args=["-fopenmp"] + SANITIZE,
        )
    ]
    if _mode("SPECOPS_CUDASIM") != "0":
        sources, kernel_code = _cudasim_sources()
        sim = cpp_extension.CppExtension(
            "specops._C_cudasim",
            sources,
            extra_compile_args={"cxx": CUDASIM_FLAGS},
            extra_link_args=SANITIZE,
        )
        sim.extra_flags = {"flags": RACECHECK, "sources": kernel_code} if RACECHECK else None  # BuildExt
        exts.append(sim)
    mode = _mode("SPECOPS_CUDA")
    missing = _cuda_reason_missing()
    if mode == "0":
        return exts
    if missing:
        if mode == "1":
            raise RuntimeError(f"SPECOPS_CUDA=1 but the CUDA extension cannot be built: {missing}")
        warnings.warn(f"specops: skipping the CUDA extension: {missing}")
        return exts
    arch_list = os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "8.0;9.0")
    define = f"-DSPECOPS_CUDA_ARCHS={_arch_tag(arch_list)}"
    exts.append(
        cpp_extension.CUDAExtension(
            "specops._C_cuda",
            _sources("cuda/*.cu", "cuda/*.cpp"),
            extra_compile_args={
                "cxx": ["-O3", "-std=c++20", define],
                "nvcc": ["-O3", "-std=c++20", "-diag-suppress=3189", "--expt-relaxed-constexpr", define],
            },
        )
    )
    return exts


class BuildExt(cpp_extension.BuildExtension):
    """Makes a CUDA (or emulator) build failure non-fatal under SPECOPS_CUDA(SIM)=auto, and compiles an
    extension's `extra_flags["sources"]` with `extra_flags["flags"]` added (racecheck's instrumentation
    of the emulator's kernel code only)."""

    OPTIONAL = {"specops._C_cuda": "SPECOPS_CUDA", "specops._C_cudasim": "SPECOPS_CUDASIM"}

    def build_extensions(self):
        self._failed = set()
        super().build_extensions()
        # Drop what failed so the install (and the in-place copy of -e) skips it.
        self.extensions = [e for e in self.extensions if e.name not in self._failed]

    def build_extension(self, ext):
        extra = getattr(ext, "extra_flags", None)
        if not extra:
            return self._build_extension(ext)
        compile_all = self.compiler.compile  # torch's ninja build of a list of sources with one set of flags

        def compile_two_sets(sources, output_dir=None, extra_postargs=None, **kw):
            marked = set(extra["sources"])
            plain, special = [s for s in sources if s not in marked], [s for s in sources if s in marked]
            flags = dict(extra_postargs, cxx=extra_postargs["cxx"] + extra["flags"])
            # a folder of their own: their own build.ninja and objects
            return (compile_all(plain, output_dir=output_dir, extra_postargs=extra_postargs, **kw)
                    + compile_all(special, output_dir=os.path.join(output_dir, "extra_flags"), extra_postargs=flags, **kw))

        self.compiler.compile = compile_two_sets
        try:
            return self._build_extension(ext)
        finally:
            self.compiler.compile = compile_all

    def _build_extension(self, ext):
        var = self.OPTIONAL.get(ext.name)
        if var is None or _mode(var) == "1":
            return super().build_extension(ext)
        try:
            return super().build_extension(ext)
        except Exception as err:  # noqa: BLE001 - any compiler failure
            warnings.warn(f"specops: {ext.name} failed to build, skipping it: {err}")
            self._failed.add(ext.name)
            stale = os.path.join(HERE, *ext.name.split(".")[:-1], os.path.basename(self.get_ext_filename(ext.name)))
            if os.path.exists(stale):
                os.remove(stale)


def _record_torch_version():
    """specops/_build_info.py: the torch the extensions are compiled against, so that importing them
    under another torch fails with a clear message instead of an undefined symbol (specops/extension.py)."""
    path = os.path.join(HERE, "specops", "_build_info.py")
    text = f'"""Written by setup.py at build time."""\nTORCH_VERSION = {torch.__version__!r}\n'
    if not os.path.exists(path) or open(path).read() != text:
        with open(path, "w") as f:
            f.write(text)


_record_torch_version()
setup(
    packages=find_packages(include=["specops", "specops.*"]) + ["specops.triton_kernels"],
    package_dir={"specops.triton_kernels": "triton_kernels"},
    # the distilled drafts ship inside the package (specops/drafts/<name>/)
    package_data={"specops": ["drafts/*/*.safetensors", "drafts/*/*.json"]},
    ext_modules=extensions(),
    cmdclass={"build_ext": BuildExt.with_options(use_ninja=True)},
)
