"""Token bitmasks: a grammar's allowed tokens applied to logits, in place (docs/structured.md §The op).

A bitmask row allows token ``j`` in bit ``j % 32`` of int32 word ``j // 32`` (the word format of
:func:`specops.pack_mask`, the one ``llguidance`` and ``xgrammar`` fill): ``W = ceil(V / 32)`` words
for ``V`` tokens, bits at ``j >= V`` ignored."""
import torch

from ...backend import register_op, resolve
from .. import checks
from ..sampling import FLOAT_DTYPES
from . import ref
from .ref import allowed_tokens


def apply_token_bitmask(logits, bitmask, *, check=True, backend=None):
    """Sets every logit whose bit is clear to ``-inf``, in place; returns ``logits``.

    Shape: logits [B, T, V] or [N, V] (fp32/bf16/fp16, stride 1 in V; views are fine), bitmask int32
    [B, T, W] or [N, W] with ``W = ceil(V / 32)`` -> logits. ``check=True`` also requires every row to
    allow one of its ``V`` tokens (one host sync; else softmax is undefined; ``check=False``: such a
    row becomes all ``-inf``). Metadata errors are raised before anything is written."""
    checks.tensor("logits", logits, dtype=FLOAT_DTYPES, last_stride_one=True)
    if logits.dim() not in (2, 3):
        raise ValueError(f"logits must have rank 2 ([N, V]) or 3 ([B, T, V]), got shape {tuple(logits.shape)}")
    V = checks.nonempty("logits", logits, -1, "token (V >= 1)")
    W = (V + 31) // 32
    checks.tensor("bitmask", bitmask, dtype=torch.int32, rank=logits.dim(),
                  shape=(*logits.shape[:-1], W), device=logits.device)
    if check and bitmask.numel():
        checks.raise_first([rows_rule(bitmask, V)])
    impl = resolve("apply_token_bitmask", logits.device, backend)
    if logits.numel():
        impl(logits, bitmask)
    return logits


def rows_rule(bitmask, V):
    """The value rule of a bitmask (int32 [..., W]): every row allows one of the ``V`` tokens."""
    return checks.row_rule("bitmask", ~allowed_tokens(bitmask, V).any(-1), f"allow at least one of the V={V} tokens "
                           "(the masked distribution of that row would be undefined)", f"no bit set below {V}")


def _triton(*args):
    from ...triton_kernels import token_bitmask

    return token_bitmask.apply_token_bitmask(*args)


register_op("apply_token_bitmask", ref.apply_token_bitmask, _triton, lambda logits, bitmask: None)
