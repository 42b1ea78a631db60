"""Stop conditions, applied to each block of emitted tokens so that output is cut exactly where
plain decoding would stop: at ``max_new_tokens``, right after the first EOS (kept, as HF does),
or right after the first token whose decoded text completes a stop string (kept)."""


class Stopper:
    def __init__(self, max_new_tokens, eos_token_ids=(), stop_strings=(), tokenizer=None):
        self.max_new_tokens = max_new_tokens
        self.eos = set(eos_token_ids or ())
        self.stop_strings = [s for s in (stop_strings or ()) if s]
        if self.stop_strings and tokenizer is None:
            raise ValueError("stop strings need a tokenizer (pass tokenizer= or an embedded target)")
        self.tokenizer = tokenizer

    def cut(self, generated, new):
        """``generated``: tokens emitted so far; ``new``: this step's tokens.

        Returns (kept prefix of ``new``, finish reason or None)."""
        kept = list(new[:self.max_new_tokens - len(generated)])
        reason = "length" if len(generated) + len(kept) >= self.max_new_tokens else None
        for j, tok in enumerate(kept):
            if tok in self.eos:
                kept, reason = kept[: j + 1], "eos"
                break
        if self.stop_strings and self._stops(generated + kept):
            # The earlier text held no stop string, so the first hit ends inside the new tokens:
            # keep the shortest extension whose decoded text holds one.
            k = next((k for k in range(1, len(kept)) if self._stops(generated + kept[:k])), len(kept))
            kept, reason = kept[:k], "stop"
        return kept, reason

    def _stops(self, ids):
        return any(s in self.tokenizer.decode(ids) for s in self.stop_strings)
