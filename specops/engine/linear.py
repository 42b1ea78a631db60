"""specops.linear inside a Hugging Face model: its ``nn.Linear`` modules (the LM head included) run
the batch-invariant small-row GEMM while a :class:`ModelRunner` drives them (docs/batch_invariance.md
§specops.linear, §In the engine). They call the op's kernel directly: :func:`specops.linear`'s checks
hold for a module's weight once, at patch time, and a per-call Python check would cost more than a
small projection (211 calls per token for SmolLM2). bf16 weights may be read from packed copies
(:func:`packs`)."""
import os
import weakref

import torch

from .. import extension
from ..ops.linear import DTYPES, cpu_kernel, pack_weight, packing_pays

_PACKED = weakref.WeakKeyDictionary()  # module -> (its weight's (storage, version) when packed, packed copy)


class SpecopsLinear(torch.nn.Linear):
    """An ``nn.Linear`` computing every call through specops.linear. A patched module's class is
    swapped to this subclass (and back by the undo): an instance-bound ``forward`` would be a closure
    a saved compiled graph cannot carry."""

    def forward(self, x):  # x [..., K] -> [..., N]
        if x.dtype != self.weight.dtype:  # a mixed-precision caller: torch's promotion rules
            return torch.nn.functional.linear(x, self.weight, self.bias)
        y = cpu_kernel(x.reshape(-1, x.shape[-1]), self.weight, self.bias, self.specops_packed)  # [M, N]
        return y.view(*x.shape[:-1], y.shape[-1])


def eligible(model):
    """specops.linear pays where torch's GEMM is slow and the compiled CPU kernel exists: CPU
    models in bf16 or fp16 (in fp32 torch's MKL GEMM is as fast; docs/batch_invariance.md)."""
    p = next(model.parameters(), None)
    return (p is not None and extension.cpu_ext is not None and p.device.type == "cpu"
            and p.dtype in (torch.bfloat16, torch.float16))


def invariant_unavailable(model):
    """None when every linear of ``model`` can run through ``specops::linear`` (the batch-invariant
    mode's requirement), else why not: the compiled CPU kernels and CPU weights in fp32/bf16/fp16."""
    if extension.cpu_ext is None:
        return "the compiled CPU extension (specops._C) is not built"
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and not _patchable(module):
            return (f"its linear layer {name!r} ({type(module).__name__}, {module.weight.dtype} weights on "
                    f"{module.weight.device}) is not a plain nn.Linear with dense CPU weights in "
                    f"{', '.join(str(d) for d in DTYPES)}")
    return None


def _patchable(module):
    """A plain nn.Linear with a dense CPU weight the op takes (quantized, subclassed or DTensor (TP)
    layers are left alone)."""
    w = module.weight
    return (type(module) in (torch.nn.Linear, SpecopsLinear) and w.dtype in DTYPES and w.device.type == "cpu"
            and w.stride(-1) == 1 and type(w.data) is torch.Tensor)


def packs(model):
    """Whether :func:`use_specops_linear` gives ``model``'s linears packed weight copies: where
    :func:`packing_pays`, for bf16 weights whose copies take under a quarter of the physical memory."""
    if not packing_pays():
        return False
    weights = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear) and _patchable(m)]
    if not weights or any(w.dtype != torch.bfloat16 for w in weights):
        return False
    total = sum(w.numel() * w.element_size() for w in weights)
    try:
        memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return False
    return 4 * total <= memory


def _packed_copy(module):
    """The packed copy of ``module``'s weight, made again when the weight was replaced or changed in place
    (an inference tensor, e.g. a model loaded under ``torch.inference_mode()``, has no version counter:
    only its replacement is seen)."""
    w = module.weight
    key = (w.untyped_storage().data_ptr(), w.data_ptr(), None if w.is_inference() else w._version)
    entry = _PACKED.get(module)
    if entry is None or entry[0] != key:
        with torch.no_grad():
            entry = (key, pack_weight(w.detach()))
        _PACKED[module] = entry
    return entry[1]


def use_specops_linear(model):
    """Routes every plain ``torch.nn.Linear`` of ``model`` (same dtype as its input, on the CPU)
    through ``specops::linear``, one-row calls (an AR step) included: torch's bf16 one-row GEMM is the
    slower one on AVX-512 (docs/batch_invariance.md §In the engine). Returns a callable that restores
    the modules' own forwards. Quantized or subclassed linear layers are left alone."""
    patched = []
    pack = packs(model)
    for module in model.modules():
        if type(module) is torch.nn.Linear and _patchable(module):
            module.__class__ = SpecopsLinear
            module.specops_packed = _packed_copy(module) if pack else None
            patched.append(module)

    def undo():
        for module in patched:
            module.__class__ = torch.nn.Linear
            del module.specops_packed
        patched.clear()

    return undo
