"""What a drafter sees of a decode: :class:`DraftContext` (specops/decoding/README.md §The loop), and
nothing of the decoder's own: the target's runner, the tokenizer and the verification are the loop's,
so a method cannot come to depend on them."""
import dataclasses

import torch


@dataclasses.dataclass
class DraftContext:
    """``seqs[b]`` = prompt + emitted tokens (the loop appends to these lists); its last token is
    the pending root (emitted, not yet in the target cache), also on the target's device as ``root``
    int64 [B]. ``active[b]``: still generating; ``was_active``: active when the current block was
    proposed. ``generator`` lives on the target's device. ``stager``: the target's
    :class:`~specops.engine.Stager` (``Candidates.stage(ctx.stager)``: one non-blocking upload).
    ``vocab_id``: a hashable identity of the vocabulary (what survives a call: Ouroboros' shared
    phrase pool keys on it). ``draft``: the drafter's DraftLM, None for model-free methods.
    ``target``: :class:`TargetFeatures` for drafters with ``needs_target_features``, else None.
    ``grammar``: the request's Grammar or None (drafters constrain their drafts with it)."""
    seqs: list
    prompt_lens: list
    active: list
    was_active: list
    sampling: object
    generator: torch.Generator
    vocab_size: int
    root: torch.Tensor
    stager: object
    vocab_id: tuple = None
    draft: object = None
    target: object = None
    grammar: object = None

    @property
    def batch(self):
        return len(self.seqs)

    def generated(self, b):
        return self.seqs[b][self.prompt_lens[b]:]


class TargetFeatures:
    """The target's final hidden states, read-only, for EAGLE-style drafters (a view of the target's
    runner that exposes nothing else). Shape: ``features`` [B, max_len, H] (row ``p``: the hidden
    state that gave the logits for token ``p + 1``), ``lens`` int32 [B] (tokens in the target cache)."""

    def __init__(self, runner):
        self._runner = runner

    @property
    def features(self):
        return self._runner.features

    @property
    def lens(self):
        return self._runner.lens
