"""What ``python -m specops`` prints: every backend, available or not, and why."""
import importlib.metadata
import platform

import torch

from . import backend


def _version(dist):
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def report():
    lines = [f"specops {importlib.import_module('specops').__version__} on {platform.machine()}, "
             f"{torch.get_num_threads()} threads"]
    lines.append("versions: " + ", ".join(f"{d} {_version(d)}" for d in ("torch", "triton", "transformers")))
    lines += [f"cuda device visible: {torch.cuda.is_available()}", "", f"{'backend':<10} {'cpu':<5} {'cuda':<5} why"]
    for name in backend.BACKENDS:
        cpu_ok, cpu_why = backend.available(name, "cpu")
        cuda_ok, cuda_why = backend.available(name, "cuda")
        why = cpu_why if cpu_ok or not cuda_ok else cuda_why
        if not cpu_ok and not cuda_ok and cpu_why != cuda_why:
            why = f"cpu: {cpu_why}; cuda: {cuda_why}"
        lines.append(f"{name:<10} {'yes' if cpu_ok else 'no':<5} {'yes' if cuda_ok else 'no':<5} {why}")
    lines += [f"test-only (never chosen automatically): {', '.join(backend.TEST_ONLY)}", "",
              "default backend per op (a call a backend cannot take falls through to the next):",
              f"{'op':<20} {'cpu':<8} {'cuda':<8} implemented by"]
    for op in backend.ops():
        lines.append(f"{op:<20} {backend.default_backend(op, 'cpu'):<8} {backend.default_backend(op, 'cuda'):<8} "
                     f"{'/'.join(backend.implementations(op))}")
    return "\n".join(lines)
