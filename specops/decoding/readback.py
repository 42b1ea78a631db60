"""One host read (one synchronisation) for several small tensors, not one per tensor: drafters'
per-step bookkeeping. ``read_lists`` packs them into one vector (float64 when any is floating, else
int64: exact for token ids, indices and fp32 scores) and hands back nested lists of the original
shapes (ints for integer tensors)."""
import torch


def read_lists(*tensors):
    """Shape: tensors of any shapes, one device -> one nested list per tensor (its shape)."""
    floating = any(t.is_floating_point() for t in tensors)
    dtype = torch.float64 if floating else torch.int64
    flat = torch.cat([t.reshape(-1).to(dtype) for t in tensors]).tolist() if tensors else []
    out, at = [], 0
    for t in tensors:
        part, at = flat[at: at + t.numel()], at + t.numel()
        if floating and not t.is_floating_point():
            part = [int(x) for x in part]
        out.append(_nest(part, tuple(t.shape)))
    return out


def _nest(flat, shape):
    if len(shape) == 0:
        return flat[0]
    if len(shape) == 1:
        return flat
    step = len(flat) // shape[0] if shape[0] else 0
    return [_nest(flat[i * step:(i + 1) * step], shape[1:]) for i in range(shape[0])]
