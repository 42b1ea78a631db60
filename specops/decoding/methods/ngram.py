"""Model-free drafting by n-gram / prompt lookup: continue the sequence as it continued after earlier
occurrences of its end (``branches`` > 1: several continuations as a tree). docs/methods.md §n-gram
gives the ``max_gamma`` doubling rule, the adaptive evidence rule (:func:`longest_matches`,
``MAX_MATCH``, ``MATCH_SCALE``, ``SHORT_MATCH``) and their measurements."""
from ..tree import Candidates, Trie
from .base import Drafter, count


def lookup(seq, max_ngram, min_ngram, length, branches):
    """Continuations (lists of up to ``length`` tokens) that followed earlier occurrences of the
    sequence's last n tokens, for the largest n in [min_ngram, max_ngram] that has any. Distinct,
    full-length ones first, each group most recent first (a recent match near the end of the text
    would otherwise cut every continuation short in repetitive text)."""
    n_seq = len(seq)
    for n in range(min(max_ngram, n_seq - 1), min_ngram - 1, -1):
        key = seq[n_seq - n:]
        found, full = [], 0
        for start in range(n_seq - n - 1, -1, -1):
            if seq[start] != key[0] or seq[start:start + n] != key:
                continue
            cont = seq[start + n:start + n + length]
            if cont and cont not in found:
                found.append(cont)
                full += len(cont) == length
                if full >= branches:
                    break
        if found:
            found.sort(key=len, reverse=True)  # stable: recency kept within a length
            return found[:branches]
    return []


def longest_matches(seq, min_ngram, max_match, length, branches):
    """[(continuation, match length)] of the earlier occurrences of the sequence's last token whose
    match with the end of the sequence (counted backwards, up to ``max_match`` tokens) is at least
    ``min_ngram`` long: distinct continuations of up to ``length`` tokens, longest match first, then
    full-length ones, then most recent; at most ``branches``."""
    n_seq = len(seq)
    if n_seq < 2:
        return []
    last = seq[-1]
    found = []  # (match, full, start)
    for start in range(n_seq - 2, -1, -1):
        if seq[start] != last:
            continue
        m, lim = 1, min(max_match, start + 1)
        while m < lim and seq[start - m] == seq[n_seq - 1 - m]:
            m += 1
        if m >= min_ngram:
            found.append((m, min(n_seq - 1 - start, length) == length, start))
    found.sort(key=lambda f: (-f[0], not f[1], -f[2]))
    out = []
    for m, _, start in found:
        cont = seq[start + 1:start + 1 + length]
        if cont not in [c for c, _ in out]:
            out.append((cont, m))
            if len(out) >= branches:
                break
    return out


class NGram(Drafter):
    name = "ngram"
    description = "prompt lookup / n-gram draft (model-free)"
    # gamma 12 doubling to 48: measured in docs/methods.md §n-gram (a verified token costs little on a CPU)
    PARAMS = {"gamma": 12, "max_ngram": 3, "min_ngram": 1, "branches": 1, "max_gamma": None}  # None: 4 x gamma
    budget_param = "gamma"  # under adaptive speculation the controller replaces the doubling rule
    MAX_MATCH, MATCH_SCALE, SHORT_MATCH = 32, 2, 2  # adaptive speculation's evidence rule (docs/methods.md)
    CHECKS = {"gamma": count(), "max_ngram": count(), "min_ngram": count(), "branches": count()}

    def check_params(self):
        super().check_params()
        if self.max_gamma is None:
            self.max_gamma = 4 * self.gamma
        self.check_param("max_gamma", count(self.gamma))
        if self.min_ngram > self.max_ngram:
            raise ValueError(f"min_ngram ({self.min_ngram}) must be <= max_ngram ({self.max_ngram})")

    def tree_budget(self):
        return 1 + self.max_gamma * self.branches

    def budget_cap(self, initial):
        return max(initial, self.max_gamma)

    def enable_adaptive(self, cfg):
        out = super().enable_adaptive(cfg)
        self.max_gamma = max(self.max_gamma, self.gamma)  # a max_budget above max_gamma widens the cache
        return out

    def setup(self, ctx):
        self._len = [self.gamma] * ctx.batch  # per sequence: tokens to propose next

    def propose(self, ctx):
        tokens, parents, self._proposed = [], [], []
        for b in range(ctx.batch):
            seq, conts = ctx.seqs[b], []
            if ctx.active[b] and self.adaptive_range is not None:
                conts = [cont[:1 if m <= self.SHORT_MATCH else self.MATCH_SCALE * m]
                         for cont, m in longest_matches(seq, self.min_ngram, self.MAX_MATCH, self.gamma, self.branches)]
            elif ctx.active[b]:
                conts = lookup(seq, self.max_ngram, self.min_ngram, self._len[b], self.branches)
            trie = Trie(seq[-1])
            for cont in conts:
                trie.insert(0, cont)
            toks, pars = trie.tokens, trie.parents
            if ctx.grammar is not None and ctx.active[b]:  # only what the grammar allows, plus what it forces
                toks, pars = ctx.grammar.constrain(b, toks, pars)
            self._proposed.append(max(map(len, conts), default=0))
            tokens.append(toks)
            parents.append(pars)
        return Candidates(tokens=tokens, parents=parents, depth_drafted=[0] * ctx.batch,
                          drafted_nodes=[len(t) for t in tokens]).stage(ctx.stager)

    def commit(self, ctx, draft, result):
        if self.max_gamma == self.gamma or self.adaptive_range is not None:
            return
        for b in range(ctx.batch):
            if not ctx.was_active[b]:
                continue
            full = self._proposed[b] == self._len[b] and len(result.paths[b]) - 1 == self._len[b]
            self._len[b] = min(2 * self._len[b], self.max_gamma) if full else self.gamma
