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
        room = self.max_new_tokens - len(generated)
        kept = list(new[:room])
        reason = "length" if len(generated) + len(kept) >= self.max_new_tokens else None
        for j, tok in enumerate(kept):
            if tok in self.eos:
                kept, reason = kept[: j + 1], "eos"
                break
        if self.stop_strings:
            k = self._stop_string_cut(generated, kept)
            if k is not None:
                kept, reason = kept[:k], "stop"
        return kept, reason

    def _stop_string_cut(self, generated, kept):
        # The earlier text contained no stop string, so the first hit ends inside the new tokens:
        # find the shortest extension whose decoded text contains one.
        dec = self.tokenizer.decode
        if not any(s in dec(generated + kept) for s in self.stop_strings):
            return None
        for k in range(1, len(kept) + 1):
            text = dec(generated + kept[:k])
            if any(s in text for s in self.stop_strings):
                return k
        return len(kept)
