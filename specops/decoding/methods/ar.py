"""AR (docs/methods.md §AR): autoregressive decoding through the same loop, the speed-up baseline."""
from ..tree import root_draft
from .base import Drafter


class AR(Drafter):
    """The block is the pending root alone: one target forward per token."""

    name = "ar"
    description = "autoregressive decoding (the baseline, same loop)"

    def propose(self, ctx):
        return root_draft(ctx.root)
