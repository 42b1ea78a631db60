"""The torch reference of apply_token_bitmask, and the allowed set of a bitmask row
(:func:`allowed_tokens`) that the checks and the verify references read."""
import torch


def allowed_tokens(bitmask, V):
    """The boolean allowed set of each row. Shape: bitmask int32 [..., W] -> bool [..., V]."""
    bits = torch.arange(32, device=bitmask.device, dtype=torch.int32)
    return ((bitmask[..., :, None] >> bits) & 1).bool().flatten(-2)[..., :V]


def apply_token_bitmask(logits, bitmask):
    """The spec: unpack the bits, fill the disallowed logits in place; allowed logits are never
    written. Shape: logits [..., V], bitmask int32 [..., ceil(V / 32)] -> None."""
    logits.masked_fill_(~allowed_tokens(bitmask, logits.shape[-1]), float("-inf"))
