"""specops.linear: a small-row GEMM whose every output element is reduced in one fixed order, which
depends on its length ``K`` only, never on the rows sharing the call or the column split between
threads. So row ``i`` of an ``M``-row call equals the one-row call on row ``i`` bit for bit, for every
``M``, thread count and batch layout, on each backend, and a verification block produces the logits
an AR step produces for the same prefix (docs/batch_invariance.md). Each backend has its own order
(they agree within that doc's tolerance, not bit for bit); the values' spec is :mod:`.ref` (torch)."""
import os

import torch

from ... import extension
from ...backend import register, register_op, register_supports, resolve
from .. import checks
from . import ref

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def linear(x, weight, bias=None, *, packed=None, backend=None):
    """``x @ weight.T + bias`` with fp32 accumulation, rounded once to ``x``'s dtype; each output
    element depends on its rows of ``x`` and ``weight`` and its bias only (the module's contract).
    Shape: x [..., K], weight [N, K], bias [N] or None -> [..., N] in x's dtype (fp32, bf16 or fp16;
    weight and bias alike). ``packed``: :func:`pack_weight` of a bf16 ``weight`` in either layout (a copy
    the cpp backend reads faster, the same bits; a layout this machine's kernel does not read, and the
    other backends, read ``weight``)."""
    checks.tensor("x", x, dtype=DTYPES)
    if x.dim() < 1:
        raise ValueError(f"x must have rank >= 1 ([..., K]), got shape {tuple(x.shape)}")
    K = x.shape[-1]
    checks.tensor("weight", weight, dtype=x.dtype, rank=2, device=x.device)
    if weight.shape[1] != K:
        raise ValueError(f"weight must have shape [N, K={K}] (K = x.shape[-1]), got {tuple(weight.shape)}")
    N = weight.shape[0]
    if K == 0 or N == 0:
        raise ValueError(f"x and weight must have K >= 1 and N >= 1, got K={K}, N={N}")
    if bias is not None:
        checks.tensor("bias", bias, dtype=x.dtype, shape=(N,), device=x.device)
    if packed is not None:
        shapes = [packed_shape(weight, layout) for layout in LAYOUTS]
        checks.tensor("packed", packed, dtype=torch.bfloat16, rank=3, device=weight.device)
        if tuple(packed.shape) not in shapes:
            want = [f"[{', '.join(map(str, shape))}] (layout {name})" for shape, name in zip(shapes, LAYOUTS)]
            raise ValueError(f"packed must be pack_weight(weight): shape {' or '.join(want)}, got {tuple(packed.shape)}")
    x2 = x if x.dim() == 2 else x.reshape(-1, K)  # [M, K]
    if x2.stride(-1) != 1 and x2.numel():
        x2 = x2.contiguous()
    if weight.stride(-1) != 1:
        weight = weight.contiguous()
    fn = resolve("linear", x.device, backend, (x2, weight, bias))
    extra = (packed.contiguous(),) if fn is cpu_kernel and packed is not None else ()  # only cpp reads it
    out = fn(x2, weight, bias, *extra)  # [M, N]
    return out if x.dim() == 2 else out.reshape(*x.shape[:-1], N)


LAYOUTS = ("avx512", "amx")  # the packed layouts: the AVX-512 tiles', the AMX tiles'


def machine_layout():
    """The packed layout this machine's cpp kernel reads for bf16: "amx" where it runs the AMX tiles
    (``specops._C.linear_isa()``; ``SPECOPS_CPU_ISA=avx512`` keeps it off them), else "avx512"."""
    return "amx" if extension.cpu_ext is not None and extension.cpu_ext.linear_isa() == "amx" else "avx512"


def packed_shape(weight, layout=None):
    """The shape of :func:`pack_weight` of ``weight`` [N, K]: [ceil(N / 8), ceil(K / 16), 128] (layout
    "avx512") or [ceil(N / 16), ceil(K / 32), 512] ("amx"); None: :func:`machine_layout`."""
    N, K = weight.shape
    if (layout or machine_layout()) == "amx":
        return (-(-N // 16), -(-K // 32), 512)
    return (-(-N // 8), -(-K // 16), 128)


def pack_weight(weight, layout=None):
    """A bf16 ``weight`` [N, K] in a layout the cpp backend streams in one pass (docs/batch_invariance.md,
    Packed weights): "avx512", the AVX-512 tiles' (read without widening shuffles; csrc/cpu/linear.cpp,
    above ``rows_packed``), or "amx", the AMX tiles' (16 x 32 blocks, 1 KB each; csrc/cpu/linear_amx.h);
    None: :func:`machine_layout`. Shape: [N, K] -> :func:`packed_shape` bf16 (a copy of about the
    weight's bytes)."""
    checks.tensor("weight", weight, dtype=torch.bfloat16, rank=2)
    layout = layout or machine_layout()
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS} or None, got {layout!r}")
    G, C, _ = packed_shape(weight, layout)
    rows, cols = (16, 32) if layout == "amx" else (8, 16)
    w = weight.new_zeros(G * rows, C * cols)
    w[: weight.shape[0], : weight.shape[1]] = weight
    if layout == "amx":  # [t, i, c, k] -> [t, c, i, k]
        return w.view(G, 16, C, 32).permute(0, 2, 1, 3).reshape(G, C, 512).contiguous()
    # [g, p, h, c, s, l] -> [g, c, p, h, l, s]
    return w.view(G, 4, 2, C, 2, 8).permute(0, 3, 1, 2, 5, 4).reshape(G, C, 128).contiguous()


def packing_pays():
    """Whether :func:`pack_weight` copies pay on this machine: the cpp backend's packed kernel (a CPU
    whose vector ISA is AVX-512; ``SPECOPS_CPU_ISA`` may lower it), and ``SPECOPS_LINEAR_PACK`` not
    ``0``. Elsewhere the op reads the plain weight (the same bits), so a copy would only cost memory."""
    if os.environ.get("SPECOPS_LINEAR_PACK", "1") == "0" or os.environ.get("SPECOPS_CPU_ISA") in ("avx2", "generic"):
        return False
    return extension.cpu_ext is not None and torch.backends.cpu.get_cpu_capability() == "AVX512"


def _triton_supports(x, weight, bias):
    if x.device.type == "cuda" and torch.cuda.get_device_capability(x.device) < (8, 0):
        return "the Triton kernel's bf16/fp16 tl.dot needs sm_80 or newer"
    return None


def _triton(*args):
    from ...triton_kernels import linear

    return linear.linear(*args)


register_op("linear", ref.linear, _triton, lambda x, weight, bias: x.new_empty((x.shape[0], weight.shape[0])))
register_supports("linear", ("triton",), _triton_supports)


_PLAIN = (torch.Tensor, torch.nn.Parameter)  # not a subclass with its own dispatch (fake, DTensor, ...)


def cpu_kernel(x, weight, bias, packed=None):
    """The cpp backend's kernel on checked arguments (x [M, K], weight [N, K], bias [N] or None, same dtype,
    CPU, last stride 1; packed: :func:`pack_weight` of weight, or None) -> [M, N]. Eager calls of plain
    tensors go to the extension's direct entry (``specops._C.linear``: the dispatcher's argument parsing
    costs ~4 us a call, as much as a one-row projection of a small model); torch.compile and tensor
    subclasses get the registered op."""
    plain = all(t is None or type(t) in _PLAIN for t in (x, weight, bias, packed))
    if torch.compiler.is_compiling() or not plain:
        if packed is not None:
            return torch.ops.specops.linear_packed(x, weight, packed, bias)
        return torch.ops.specops.linear(x, weight, bias)
    return extension.cpu_ext.linear(x, weight, bias, packed)


if extension.cpu_ext is not None:
    register("linear", "cpp")(cpu_kernel)  # replaces register_op's: the same op, called directly
if extension.has_op("linear_packed"):
    torch.library.register_fake("specops::linear_packed")(
        lambda x, weight, packed, bias: x.new_empty((x.shape[0], weight.shape[0])))

