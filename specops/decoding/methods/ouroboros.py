"""Ouroboros (docs/methods.md §Ouroboros: the lookahead window and pool guesses that draft, the phrase
branches that lengthen, the pool's updates, ``model_free``; under a grammar: docs/structured.md).
Drafted tokens enter the draft cache as drafting goes: each forward's accepted part is compacted,
window and guess rows dropped (the next ``begin`` keeps what agrees with the emitted sequence)."""
import random

from ..phrase_pool import PhrasePool, shared_pool
from ..sampling import greedy_tokens
from ..tree import Candidates, Trie
from .base import FLAG, ModelDrafter, count, grammar_masked, grammar_prefix


class Ouroboros(ModelDrafter):
    name = "ouroboros"
    description = "Ouroboros: lookahead-accelerated draft + phrase pool + K phrase branches"
    # CPU-sized (the paper's W = 15-20 is GPU-sized: here every window token costs draft compute).
    PARAMS = {"gamma": 4, "window": 2, "ngram": 4, "guesses": 4, "branches": 3, "reuse_pool": True,
              "model_free": False}
    sampling_mode = "sample_match"
    budget_param = "gamma"  # draft tokens before lengthening
    needs_target_argmax = True  # commit reads the target's corrections: in the step's one packed read
    CHECKS = {"gamma": count(), "window": count(0), "ngram": count(2), "guesses": count(0), "branches": count(0),
              "reuse_pool": FLAG, "model_free": FLAG}

    def check_params(self):
        super().check_params()
        self.needs_draft_model = not self.model_free
        self.pool, self._phrase = None, self.ngram - 1  # a phrase: the continuation of an n-gram's key

    def widths(self):
        """This step's (guesses, branches), capped under adaptive speculation (docs/methods.md
        §Ouroboros): at the full widths a gamma-1 probe drafted ~19 rows."""
        if self.adaptive_range is None:
            return self.guesses, self.branches
        return min(self.guesses, self.gamma), min(self.branches, self.gamma - 1)

    def tree_budget(self):
        return 1 + self.gamma + self.ngram + self.branches * self._phrase

    def draft_budget(self):
        per_forward = self.gamma + self.ngram + (self.window + self.guesses) * self._phrase
        return per_forward + self.gamma + self.ngram

    def setup(self, ctx):
        cap = max(self.guesses, self.branches, 1)
        self.pool = shared_pool(ctx.vocab_id, self._phrase, cap) if self.reuse_pool else PhrasePool(self._phrase, cap)
        rng = random.Random(10)
        # per sequence: the length up to which the emitted text's n-grams are in the pool (AR steps
        # of adaptive speculation skip commit; the next commit adds their n-grams too)
        self._pooled = [len(s) for s in ctx.seqs]
        self.windows = []
        for b in range(ctx.batch):
            prompt = ctx.seqs[b][: ctx.prompt_lens[b]]
            self.pool.add_ngrams(prompt)
            self.windows.append([[rng.choice(prompt) for _ in range(self._phrase)] for _ in range(self.window)])

    # ---- drafting ----------------------------------------------------------------------------

    def propose(self, ctx):
        if self.model_free:
            return self._comb(ctx, [self._pool_chain(ctx, b) for b in range(ctx.batch)], [0] * ctx.batch)
        d, B = ctx.draft, ctx.batch
        d.begin(ctx.seqs, ctx.active)
        drafted, going, forwards = [[] for _ in range(B)], list(ctx.active), [0] * B
        while any(going):
            layout = [self._lay_out(d, b) if going[b] else None for b in range(B)]
            d.forward()
            paths = [None] * B
            chains = [[s[-1]] for s in ctx.seqs]  # a stopped sequence's: a placeholder block, never committed
            for b in range(B):
                if not going[b]:
                    continue
                forwards[b] += 1
                new, paths[b] = self._read(ctx, d, b, layout[b], drafted[b])
                drafted[b] += new
                chains[b] = [new[-1]]
                going[b] = len(drafted[b]) < self.gamma
            d.commit_paths(paths)
            if any(going):
                d.begin_chain(chains)
        return self._comb(ctx, drafted, forwards)

    def _pool_chain(self, ctx, b):
        """Model-free draft: newest pool phrases chained from the last token, up to gamma tokens."""
        out, last = [], ctx.seqs[b][-1]
        while ctx.active[b] and len(out) < self.gamma:
            phrase = self.pool.get(last, 1)
            if not phrase:
                break
            out += phrase[0][: self.gamma - len(out)]
            last = out[-1]
        return out

    def _lay_out(self, d, b):
        """Adds window and guess nodes below the block root; returns their block indices."""
        root = d.root[b]

        def chain(tokens, parent):  # the tokens as a chain below block node ``parent``: their nodes
            nodes = []
            for tok in tokens:
                parent = d.add(b, tok, parent)
                nodes.append(parent)
            return nodes
        cols = []  # per column: its spine node (below the previous column's; the first: the root's), its tooth
        for toks in self.windows[b]:
            cols.append(chain(toks, cols[-1][0] if cols else root))
        guesses = self.pool.get(d.tokens[b][root], self.widths()[0])
        return root, cols, [(phrase, chain(phrase, root)) for phrase in guesses]

    def _read(self, ctx, d, b, layout, prefix):
        """The draft's own continuation after this forward (after the ``prefix`` drafted so far);
        updates the window and the pool."""
        root, cols, guesses = layout
        best_nodes = []  # the longest guess prefix the draft agrees with
        for phrase, nodes in guesses:
            m, node = 0, root
            while m < len(phrase) and phrase[m] == d.argmax(b, node):
                node = nodes[m]
                m += 1
            if m > len(best_nodes):
                best_nodes = nodes[:m]
        end = best_nodes[-1] if best_nodes else root
        new = [d.tokens[b][n] for n in best_nodes]
        if ctx.grammar is None:
            new.append(d.argmax(b, end))
        else:  # the draft's choice among the tokens the grammar allows after the drafted path
            row = grammar_masked(ctx, d.logits(b, end)[None].float().clone(), [(b, prefix + new)])
            new.append(int(greedy_tokens(row)))
        path = list(range(root + 1)) + best_nodes
        win = self.windows[b]
        for i, col in enumerate(cols):
            self.pool.insert(win[i][0], win[i][1:] + [d.argmax(b, col[-1])])  # the column's n-gram
            # Jacobi step: every window token becomes the draft's argmax at its parent.
            win[i] = [d.argmax(b, root if i == 0 else cols[i - 1][0])] + [d.argmax(b, x) for x in col[:-1]]
        return new, path

    def _comb(self, ctx, drafted, forwards):
        tokens, parents, tried = [], [], []
        for b in range(ctx.batch):
            root = ctx.seqs[b][-1]
            chain = grammar_prefix(ctx, b, drafted[b])
            trie = Trie(root)
            trie.insert(0, chain)  # a fresh trie: the chain is nodes 1..len(chain)
            key = chain[-1] if chain else root
            phrases = self.pool.get(key, self.widths()[1]) if ctx.active[b] else []
            if ctx.grammar is not None:
                phrases = [ph for ph in phrases if len(grammar_prefix(ctx, b, ph, chain)) == len(ph)]
            below = [(phrase, trie.insert(len(chain), phrase)) for phrase in phrases]  # with their nodes
            tokens.append(trie.tokens)
            parents.append(trie.parents)
            tried.append((trie.tokens, len(chain), below))
        self._tried = tried
        return Candidates(tokens=tokens, parents=parents, depth_drafted=forwards,
                          drafted_nodes=[len(t) for t in tokens]).stage(ctx.stager)

    # ---- after verification --------------------------------------------------------------------

    def commit(self, ctx, draft, result):
        argmax = result.target_argmax()
        for b in range(ctx.batch):
            if not ctx.was_active[b]:
                continue
            # the tree's tokens, n drafted chain tokens (nodes 1..n), the phrases below n with their nodes
            tok, n, phrases = self._tried[b]
            v, path = argmax[b], result.paths[b]
            A = sum(1 for i in path if 1 <= i <= n)
            for j in range(A + 1, n + 1):  # the draft tokens past the first mismatch
                completion, k = [v[j]], j
                while len(completion) < self._phrase and k + 1 <= n and tok[k + 1] == v[k]:
                    k += 1
                    completion.append(v[k])
                self.pool.insert(tok[j], completion)
            for phrase, nodes in phrases:
                corrected = [v[n]] + [v[x] for x in nodes[:-1]]
                self.pool.replace(tok[n], phrase, corrected)
            seq = ctx.seqs[b]
            self.pool.add_ngrams(seq, max(min(self._pooled[b], len(seq) - len(path)), 0))
            self._pooled[b] = len(seq)
