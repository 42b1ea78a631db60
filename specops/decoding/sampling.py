"""One sampling configuration shared by drafter and verifier (docs/methods.md §Warping: acceptance ratios and
residuals use exactly the warped distributions that sampling uses, for both models)."""
import dataclasses
import math

import torch

from . import _kernels


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self):
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {t!r}")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < 0:
            raise ValueError(f"top_k must be an int >= 0 (0 = off), got {self.top_k!r}")
        p = self.top_p
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 < p <= 1:
            raise ValueError(f"top_p must be a number in (0, 1], got {p!r}")

    @property
    def greedy(self):
        return self.temperature == 0

    def warp(self, logits):
        """Shape: logits [N, V] -> probs fp32 [N, V] (one-hot argmax when greedy)."""
        return _kernels.warp_probs(logits.float(), float(self.temperature), int(self.top_k), float(self.top_p))


def draw(probs, generator):
    """One token per row, drawn with ``generator``, left on the rows' device (no host read).

    Shape: probs fp32 [N, V] (rows need not be normalised; zero entries are never drawn) -> int64 [N].
    Device rows with a generator on their device (or none) draw with ``torch.multinomial``; otherwise
    ``generator`` gives a uniform per row (copied non-blocking to device rows) for ``inverse_cdf``:
    torch's CPU multinomial takes 2-4 ms for two 49,152-token rows, ``inverse_cdf`` ~0.1 ms."""
    probs = probs.float()
    if probs.device.type != "cpu" and (generator is None or generator.device == probs.device):
        return torch.multinomial(probs, 1, generator=generator)[:, 0]
    on = generator.device if generator is not None else probs.device  # the generator's device draws
    u = torch.rand(probs.shape[0], 1, generator=generator, dtype=torch.float64, device=on)
    return inverse_cdf(probs, u.to(probs.device, non_blocking=True))


def inverse_cdf(probs, u):
    """The token whose CDF interval holds ``u`` times the row total: the first index with
    cdf > u * total, so a zero-probability token (an empty interval) is never chosen.
    Shape: probs fp32 [N, V], u [N, 1] in [0, 1) -> int64 [N]. In fp64: an fp32 CDF and uniform would
    move up to ~2**-24 of mass per token (a 49,152-token row: ~0.3 % in all)."""
    cdf = probs.double().cumsum(-1)
    total = cdf[:, -1:].contiguous()
    idx = torch.searchsorted(cdf, u * total, right=True)
    # Rounding can put u * total at the total: take the first index whose cdf reaches it, a token
    # with mass (later ones may hold mass too small to move an fp32 sum, or none).
    last = torch.searchsorted(cdf, total)
    return torch.minimum(idx, last)[:, 0]


def greedy_tokens(logits):
    """The argmax of the last dimension, the first maximal index on ties (torch.argmax's rule, which
    ``max`` documents as well). Shape: [..., V] -> int64 [...]. ``max(-1).indices``: torch's bf16 argmax
    is not vectorised on a CPU (a 49,152-token row: ~250 us, against ~90 us)."""
    return logits.max(-1).indices


def choose(logits, sampling, generator):
    """Next tokens and their warped distributions, left on the device (no host read). Shape: logits
    [N, V] -> (int64 [N], probs fp32 [N, V] or None); greedy returns the argmax (and None)."""
    if sampling.greedy:
        return greedy_tokens(logits), None
    probs = sampling.warp(logits)
    return draw(probs, generator), probs
