"""Grammar-constrained decoding over draft trees, one grammar state per tree node (docs/structured.md
§Design): a :class:`Grammar` compiles a JSON schema, regex or EBNF grammar once per request with an
optional engine (``pip install specops[grammar]``), keeps one committed matcher per sequence (the
tree's root included), gives every draft-tree node its allowed tokens and commits the emitted ones.
The engines run on the CPU: one mask per tree node and sequence a step (measured in docs/structured.md)."""
import importlib.util
import json

import torch

from ..ops import checks

ENGINES = ("xgrammar", "llguidance")  # preference order: docs/structured.md §Engine choice
KINDS = ("json_schema", "regex", "ebnf")


def available_engines():
    """The grammar engines importable here, in order of preference."""
    return tuple(e for e in ENGINES if importlib.util.find_spec(e) is not None)


class _LLGuidance:
    """llguidance; ``ebnf`` (GBNF) goes through the Lark converter it ships (docs/structured.md
    §Engine choice)."""

    def __init__(self, tokenizer, vocab_size):
        import llguidance
        import llguidance.hf
        import llguidance.torch

        self._llg = llguidance
        self.fill = llguidance.torch.fill_next_token_bitmask  # fill(m, bitmask, row), as _XGrammar's
        self.rollback = llguidance.LLMatcher.rollback  # unbound: rollback(m, n)
        self.tok = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size)
        self.vocab_size = self.tok.vocab_size
        self.stop_tokens = set(self.tok.eos_tokens)

    def compile(self, kind, spec):
        from llguidance.gbnf_to_lark import gbnf_to_lark

        M = self._llg.LLMatcher
        make = {"json_schema": M.grammar_from_json_schema, "regex": M.grammar_from_regex,
                "ebnf": lambda gbnf: M.grammar_from_lark(gbnf_to_lark(gbnf))}[kind]
        grammar = make(spec)
        is_error, messages = M.validate_grammar_with_warnings(grammar, self.tok)
        if is_error:
            raise ValueError("; ".join(messages) or "invalid grammar")
        return grammar

    def matcher(self, compiled):
        m = self._llg.LLMatcher(self.tok, compiled, log_level=0)
        if m.is_error():
            raise ValueError(m.get_error())
        return m

    def consume(self, m, token):
        # A rejected token must leave the matcher as it was: consume_token would put it in its error
        # state (rollback does not clear that), try_consume_tokens does not, but it never takes the
        # end of text, which is allowed where the grammar accepts.
        if token in self.stop_tokens:
            return m.is_accepting() and m.consume_token(token) and not m.is_error()
        return m.try_consume_tokens([token]) == 1

    def forced(self, m):
        """The tokens the grammar forces from here (its fast-forward tokens)."""
        return list(m.compute_ff_tokens())


class _XGrammar:
    """xgrammar; ``ebnf`` is GBNF, its own dialect (docs/structured.md §Engine choice)."""

    def __init__(self, tokenizer, vocab_size):
        import xgrammar

        self._tokenizer = tokenizer
        info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
        self.vocab_size = info.vocab_size
        self._compiler = xgrammar.GrammarCompiler(info, max_threads=1)
        self.stop_tokens = set(info.stop_token_ids)
        # matcher(compiled) is the matcher class, and its own methods, unbound, are the adapter's:
        # fill(m, bitmask, row), consume(m, token) (False where rejected, m unchanged), rollback(m, n).
        M = self.matcher = xgrammar.GrammarMatcher
        self.fill, self.consume, self.rollback = M.fill_next_token_bitmask, M.accept_token, M.rollback

    def compile(self, kind, spec):
        # json_schema: fixed separators (", " and ": "), no free whitespace: a small model otherwise
        # fills its budget with newlines inside an object.
        c = self._compiler
        make = {"json_schema": lambda schema: c.compile_json_schema(schema, any_whitespace=False),
                "regex": c.compile_regex, "ebnf": c.compile_grammar}[kind]
        return make(spec)

    def forced(self, m):
        """The tokens of the string the grammar forces from here (its jump-forward string), without
        trailing whitespace, which the model writes merged with what follows (' "', ' 3')."""
        text = m.find_jump_forward_string().rstrip()
        return self._tokenizer.encode(text, add_special_tokens=False) if text else []


_ADAPTERS = {"llguidance": _LLGuidance, "xgrammar": _XGrammar}


def _children(parents, n, where=""):
    """Each node's children among the first ``n`` nodes of a tree in topological order; ``where``:
    the index prefix the error names (``"b, "`` for row b of a batch)."""
    children = [[] for _ in range(n)]
    for i in range(1, n):
        p = parents[i]
        if not 0 <= p < i:
            raise ValueError(f"parents[{where}{i}] must satisfy -1 < parent < {i} (topological order), got {p}")
        children[p].append(i)
    return children


class Grammar:
    """One compiled grammar and the committed state of each of ``batch_size`` sequences (only
    :meth:`advance` moves them).

    Exactly one of ``json_schema`` (a dict or a JSON string), ``regex`` (the whole output must
    match) or ``ebnf`` (llama.cpp's GBNF, start rule ``root``, for either engine) is given.
    ``vocab_size`` is the logits' V (default: the tokenizer's); rows have ``ceil(V / 32)`` words
    and tokens the tokenizer does not have are never allowed. ``engine``: one of :data:`ENGINES`
    (default: the first installed). Raises ImportError when no engine is installed, ValueError
    naming the argument and quoting the engine when the grammar does not compile."""

    def __init__(self, tokenizer, *, json_schema=None, regex=None, ebnf=None, batch_size=1, vocab_size=None,
                 engine=None):
        given = [(k, v) for k, v in zip(KINDS, (json_schema, regex, ebnf)) if v is not None]
        if len(given) != 1:
            raise ValueError(f"exactly one of json_schema, regex, ebnf must be given, got "
                             f"{[k for k, _ in given] or 'none'}")
        self.kind, spec = given[0]
        if self.kind == "json_schema" and isinstance(spec, dict):
            spec = json.dumps(spec)
        if not isinstance(spec, str):
            raise TypeError(f"{self.kind} must be a str{' or dict' if self.kind == 'json_schema' else ''}, "
                            f"got {type(spec).__name__}")
        batch_size = checks.integer("batch_size", batch_size, 1)
        installed = available_engines()
        if engine is None:
            if not installed:
                raise ImportError("constrained decoding needs a grammar engine: pip install specops[grammar] "
                                  f"(one of {ENGINES})")
            engine = installed[0]
        if engine not in ENGINES:
            raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
        if engine not in installed:
            raise ImportError(f"engine {engine!r} is not installed (pip install {engine})")
        tok_vocab = len(tokenizer)
        V = checks.integer("vocab_size", tok_vocab if vocab_size is None else vocab_size, 1)
        self.engine = _ADAPTERS[engine](tokenizer, max(V, tok_vocab))
        self.vocab_size, self.words = V, (V + 31) // 32
        self._engine_words = (self.engine.vocab_size + 31) // 32
        try:
            compiled = self.engine.compile(self.kind, spec)
            self._matchers = [self.engine.matcher(compiled) for _ in range(batch_size)]
            # Per sequence: a stop token was committed. The engines' own "stopped" flags differ
            # (llguidance sets it as soon as only the stop token may follow), so this is the rule.
            self._done = [False] * batch_size
        except Exception as err:  # the engines' parse errors (ValueError / RuntimeError)
            raise ValueError(f"{self.kind} does not compile with {engine}: {err}") from err

    @property
    def batch_size(self):
        return len(self._matchers)

    def _fit(self, rows):
        """Engine rows [N, W_engine] -> [N, W] for the logits' V (extra tokens disallowed)."""
        rows = torch.nn.functional.pad(rows, (0, self.words - self._engine_words))
        tail = self.vocab_size % 32
        if tail:  # bits past V are ignored by apply_token_bitmask; cleared so rows compare exactly
            rows[:, -1] &= (1 << tail) - 1
        return rows

    def fill_next_bitmask(self):
        """Allowed next tokens of each committed state (an AR step, or the prefill's first token).
        Shape: -> int32 [B, W]; a terminated sequence's row allows every token (never read)."""
        return self.rows_after([(b, ()) for b in range(self.batch_size)])

    def fill_tree_bitmask(self, parents, tokens, num_nodes=None, *, with_valid=False):
        """Allowed next tokens at every node of a batch of draft trees (docs/structured.md §Design).
        Shape: parents, tokens int32 [B, T] (``build_tree_mask``'s convention; node 0, the pending
        token, is committed), num_nodes int32 [B] or None (= T) -> bitmask int32 [B, T, W] on the CPU
        (+ valid bool [B, T] with ``with_valid``: False for padding and dead nodes, a token its
        parent's row disallows or a descendant of one; their rows allow every token)."""
        B, T = checks.tensor("parents", parents, rank=2).shape
        checks.tensor("tokens", tokens, shape=(B, T))
        if B != self.batch_size:
            raise ValueError(f"parents must have B = batch_size = {self.batch_size} rows, got {B}")
        checks.nonempty("parents", parents, 1, "node (T >= 1)")
        if num_nodes is not None:
            checks.tensor("num_nodes", num_nodes, shape=(B,))
        par, tok = parents.tolist(), tokens.tolist()
        n_nodes = [T] * B if num_nodes is None else num_nodes.tolist()
        rows = torch.full((B * T, self._engine_words), -1, dtype=torch.int32)
        valid = torch.zeros(B, T, dtype=torch.bool)
        for b in range(B):
            self._fill_tree(b, par[b], tok[b], max(1, min(n_nodes[b], T)), rows, valid[b], b * T)
        out = self._fit(rows).view(B, T, self.words)
        return (out, valid) if with_valid else out

    def _fill_tree(self, b, parents, tokens, n, rows, valid, base):
        """Sequence ``b``'s tree of ``n`` nodes into ``rows[base:base + n]`` and ``valid``."""
        eng, m = self.engine, self._matchers[b]
        children = _children(parents, n, f"{b}, ")
        if self._done[b]:
            return  # a finished sequence: every row allows everything, nothing is valid
        eng.fill(m, rows, base)
        valid[0] = True
        # Depth-first, a stack of (node, its children left): entering a child consumes its token,
        # leaving it rolls one token back, so the matcher always holds the path to the top of the stack.
        stack = [(0, iter(children[0]))]
        while stack:
            node, kids = stack[-1]
            child = next(kids, None)
            if child is None:
                stack.pop()
                if node != 0:
                    eng.rollback(m, 1)
                continue
            t = tokens[child]
            allowed = 0 <= t < min(self.vocab_size, eng.vocab_size) and \
                (int(rows[base + node, t >> 5]) >> (t & 31)) & 1
            if allowed and t in eng.stop_tokens:
                # The end of the output: nothing follows it (its row stays all-allowed, its subtree
                # dead), and it is not consumed: llguidance's rollback of a stop token does not
                # restore the state before it.
                valid[child] = True
            elif allowed and eng.consume(m, t):
                valid[child] = True
                eng.fill(m, rows, base + child)
                stack.append((child, iter(children[child])))
            # else dead: this node and its subtree keep all-allowed rows, valid False

    def _take(self, m, tokens):
        """How many of ``tokens`` the matcher ``m`` consumes, in order, before the first the grammar
        rejects there or a stop token (the end of the output: never consumed, see _fill_tree)."""
        n, eng = 0, self.engine
        for t in tokens:
            if not (0 <= t < min(self.vocab_size, eng.vocab_size) and t not in eng.stop_tokens
                    and eng.consume(m, t)):
                break
            n += 1
        return n

    def rows_after(self, paths):
        """Allowed next tokens after each drafted path, for model drafters' own logits. ``paths``:
        (b, tokens) pairs, ``tokens`` drafted after sequence ``b``'s committed state (None: a row nobody
        reads) -> int32 [len(paths), W]; the row of a finished sequence, a None path or a path the
        grammar rejects or that has ended allows every token (such a draft is never accepted past it)."""
        rows = torch.zeros(len(paths), self._engine_words, dtype=torch.int32)
        for i, (b, toks) in enumerate(paths):
            m, live = self._matchers[b], not self._done[b] and toks is not None
            n = self._take(m, toks) if live else 0
            if live and n == len(toks):
                self.engine.fill(m, rows, i)
            else:
                rows[i] = -1
            if n:
                self.engine.rollback(m, n)
        return self._fit(rows)

    def constrain(self, b, tokens, parents, *, forced=8):
        """Sequence ``b``'s host-built draft tree (token and parent lists, node 0 the pending root,
        ``parents[i] < i``) without the candidates the grammar rejects or stop tokens (each with its
        subtree), plus up to ``forced`` tokens of the grammar's forced continuation after every
        surviving leaf (docs/structured.md §Drafts), nodes in their relative order -> ``(tokens,
        parents)`` lists."""
        if not 0 <= b < self.batch_size:
            raise ValueError(f"b must be in [0, {self.batch_size}), got {b}")
        if len(tokens) != len(parents) or not tokens:
            raise ValueError(f"tokens and parents must be non-empty lists of one length, got {len(tokens)} and "
                             f"{len(parents)}")
        if self._done[b]:
            return tokens[:1], [-1]
        eng, m = self.engine, self._matchers[b]
        children = _children(parents, len(tokens))
        out_t, out_p = [tokens[0]], [-1]
        stack = [[0, iter(children[0]), False]]  # output index, the input node's children left, one survived
        while stack:
            top = stack[-1]
            at, kids, kept = top
            child = next(kids, None)
            if child is not None:
                if self._take(m, [tokens[child]]):
                    top[2] = True
                    out_t.append(tokens[child]), out_p.append(at)
                    stack.append([len(out_t) - 1, iter(children[child]), False])
                continue
            stack.pop()
            if not kept:  # a leaf: the forced chain after it (the matcher is at its state)
                chain = eng.forced(m)[:forced] if forced else []
                n = self._take(m, chain)
                for t in chain[:n]:
                    out_t.append(t), out_p.append(at)
                    at = len(out_t) - 1
                if n:
                    eng.rollback(m, n)
            if stack:
                eng.rollback(m, 1)
        return out_t, out_p

    def advance(self, accepted_tokens):
        """Commits each sequence's emitted tokens (the accepted path's, then the bonus token):
        ``accepted_tokens``, B token lists (a flat list when B = 1). Raises ValueError naming the
        sequence and position of a token the grammar rejects; the tokens before it stay committed."""
        if self.batch_size == 1 and accepted_tokens and not isinstance(accepted_tokens[0], (list, tuple)):
            accepted_tokens = [accepted_tokens]
        if len(accepted_tokens) != self.batch_size:
            raise ValueError(f"accepted_tokens must hold {self.batch_size} token lists, got {len(accepted_tokens)}")
        for b, (m, toks) in enumerate(zip(self._matchers, accepted_tokens)):
            for j, t in enumerate(toks):
                t = int(t)
                if self._done[b]:
                    raise ValueError(f"accepted_tokens[{b}][{j}] = {t} follows the end of the grammar's output")
                if not 0 <= t < self.engine.vocab_size or not self.engine.consume(m, t):
                    raise ValueError(f"accepted_tokens[{b}][{j}] = {t} is not allowed by the grammar there")
                self._done[b] = t in self.engine.stop_tokens

    @property
    def stop_tokens(self):
        """The token ids that end the grammar's output (the tokenizer's EOS ids, as the engine sees them)."""
        return sorted(self.engine.stop_tokens)

    def is_terminated(self):
        """Per sequence: the grammar has finished (its stop token was committed)."""
        return list(self._done)
