"""The Drafter protocol, how a method plugs into the one loop (docs/methods.md §The decoding loop): a
Drafter + a verification mode (``verify_mode``). A drafter sees a ``DraftContext`` ``ctx``
(specops.decoding.context), never the decoder: ``setup(ctx)`` once after prefill, then per step
``propose(ctx) -> Draft`` and ``commit(ctx, draft, result)``. Capabilities: ``needs_draft_model``,
``needs_target_argmax`` (for ``commit``: the target's argmax rows come with the step's one packed
read), ``needs_target_features`` (``ctx.target.features``, for EAGLE-style drafters)."""
import itertools
import math

from ...ops.token_bitmask import apply_token_bitmask

# Verification modes: docs/methods.md §Verification rules (its table maps each to R1-R6).
MODES = ("greedy", "mss", "mss_pointmass", "mss_noreplace", "sample_match", "gsd", "joint")
LOSSLESS_SAMPLING_MODES = ("mss", "mss_pointmass", "mss_noreplace", "sample_match")


def _number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def count(minimum=1, maximum=None):
    bound = f"in [{minimum}, {maximum}]" if maximum is not None else f">= {minimum}"
    return f"an int {bound}", lambda v: (_number(v) and isinstance(v, int) and v >= minimum
                                         and (maximum is None or v <= maximum))


def fraction(lo=0.0, hi=1.0, *, open_lo=False):
    """A number in [lo, hi] ((lo, hi] with ``open_lo``; NaN fails)."""
    return f"a number in {'(' if open_lo else '['}{lo}, {hi}]", lambda v: (_number(v) and lo <= v <= hi
                                                                          and not (open_lo and v == lo))


def real(*, positive=False):
    """A finite number, > 0 (``positive``) or >= 0 (NaN and inf fail)."""
    return f"a finite number {'> 0' if positive else '>= 0'}", lambda v: (_number(v) and math.isfinite(v)
                                                                         and (v > 0 if positive else v >= 0))


def optional(check):
    """``check``, or None (the parameter's "choose for me")."""
    return check[0], lambda v: v is None or check[1](v)


FLAG = ("True or False", lambda v: isinstance(v, bool))


class Drafter:
    """Base class. Subclasses set ``name``, ``PARAMS`` (name -> default) and override ``propose``."""

    name = "base"  # the method name the registry and the CLI use
    description = ""  # one line for `specops demo` / --help
    PARAMS = {}
    needs_draft_model = False
    needs_target_argmax = False
    needs_target_features = False
    sampling_mode = "mss_pointmass"  # deterministic proposals: R3p is lossless for them
    CHECKS = {}  # parameter -> (what it must be, a test of its value): count, fraction, real, optional, FLAG
    VERIFY = ()  # with a ``verify`` parameter: the rules it may pick instead of ``sampling_mode``
    budget_param = None  # the depth set per step: docs/methods.md §Adaptive speculation
    budget_cap_factor = 4  # its largest value, as a multiple of the configured one
    adaptive_range = None  # (initial, lo, hi) once enable_adaptive ran

    def __init__(self, **params):
        unknown = sorted(set(params) - set(self.PARAMS))
        if unknown:
            raise ValueError(f"unknown parameter(s) {unknown} for method {self.name!r}; "
                             f"valid: {sorted(self.PARAMS) or 'none'}")
        self.params = {**self.PARAMS, **params}
        vars(self).update(self.params)
        self.check_params()

    def uses_draft_vocab(self, sampling):
        """Whether this drafter, under ``sampling``, searches the draft head's own vocabulary where it
        has one (a subset head): its draft logits are then [*, Vd], column ``j`` token
        ``ctx.draft.vocab_keep[j]`` (:func:`vocab_ids`), which skips the head's scatter into the full
        vocabulary and shrinks each layer's softmax / top-k / warp. Only where verification reads no
        draft row (no ``draft_logits``); never under a grammar (its masks cover the full vocabulary)."""
        return False

    def check_params(self):
        """Raises ValueError for a bad parameter: each ``CHECKS`` entry, then ``verify``."""
        for name, spec in self.CHECKS.items():
            self.check_param(name, spec)
        verify = self.params.get("verify")
        if verify is not None:
            if verify not in self.VERIFY:
                raise ValueError(f"verify must be one of {self.VERIFY} (the rule used when sampling), got {verify!r}")
            self.sampling_mode = verify

    def check_param(self, name, spec):
        """Raises ValueError unless parameter ``name`` passes ``spec`` (a ``CHECKS`` entry)."""
        want, ok = spec
        if not ok(getattr(self, name)):
            raise ValueError(f"{name} must be {want}, got {getattr(self, name)!r}")

    @property
    def lossless(self):
        """Whether sampling keeps the target's distribution (greedy decoding is exact for every method)."""
        return self.sampling_mode in LOSSLESS_SAMPLING_MODES

    # ---- sizes (for cache allocation) ---------------------------------------------------------

    def tree_budget(self):
        """Upper bound on the target block (root included); sizes the target cache."""
        return 1

    def draft_budget(self):
        """Upper bound on the draft-side block beyond the catch-up chain; sizes the draft cache."""
        return 0

    # ---- adaptive budget ----------------------------------------------------------------------

    def budget_cap(self, initial):
        """The largest budget the controller may choose when the knob is configured to ``initial``."""
        return max(initial, self.budget_cap_factor * initial)

    def enable_adaptive(self, cfg):
        """Lets the controller set ``budget_param`` per step in [cfg.min_budget (default 1), cfg.max_budget
        (default ``budget_cap``)] from the configured value; runs before the caches are sized, so the
        knob is left at the cap. Returns (initial, lo, hi), or None without a knob (AR)."""
        if self.budget_param is None:
            return None
        initial = getattr(self, self.budget_param)
        lo = cfg.min_budget if cfg.min_budget is not None else 1
        hi = cfg.max_budget if cfg.max_budget is not None else self.budget_cap(initial)
        if lo > hi:
            raise ValueError(f"adaptive budget range for {self.name!r} ({self.budget_param}) is empty: "
                             f"min_budget {lo} > max_budget {hi}")
        self.adaptive_range = (min(max(initial, lo), hi), lo, hi)
        self.set_budget(hi)
        return self.adaptive_range

    def set_budget(self, g):
        """Sets the knob for the next ``propose`` (the controller's budget, within adaptive_range)."""
        setattr(self, self.budget_param, int(g))

    # ---- the protocol ------------------------------------------------------------------------

    def verify_mode(self, sampling):
        return "greedy" if sampling.greedy else self.sampling_mode

    def setup(self, ctx):
        """Called once after prefill (the draft model, if any, is prefilled)."""

    def propose(self, ctx):
        raise NotImplementedError

    def commit(self, ctx, draft, result):
        """Called after verification; ``ctx.seqs`` already holds the emitted tokens."""


class ModelDrafter(Drafter):
    """A drafter that runs ``ctx.draft`` (a DraftLM) and fills ``Draft.src``; ``commit`` keeps the
    accepted path's draft K/V (its nodes and tokens come with the step's read: nothing more is read)."""

    needs_draft_model = True

    def commit(self, ctx, draft, result):
        paths, tokens = [None] * ctx.batch, [None] * ctx.batch
        for b in range(ctx.batch):
            if draft.src is None or not ctx.was_active[b]:
                continue
            root = ctx.draft.root[b]
            # the path's fed draft-block nodes (src >= 0, a prefix below the root) and their tokens
            fed = list(itertools.takewhile(lambda x: x[0] >= 0, zip(result.path_src[b][1:], result.path_tokens[b][1:])))
            paths[b] = list(range(root + 1)) + self.draft_nodes(b, [node for node, _ in fed])
            tokens[b] = [None] * (root + 1) + [tok for _, tok in fed]  # the catch-up chain's are on the host
        ctx.draft.commit_paths(paths, tokens)

    @staticmethod
    def first_forward(ctx):
        """Opens the draft block and feeds the catch-up chains; the upload brings the roots' block
        nodes and which sequences draft, where a device search starts. Shape: -> (logits [B, V]
        after each root, grammar-masked; roots int64 [B]; active int64 [B] 0/1) on the device."""
        d, B = ctx.draft, ctx.batch
        d.begin(ctx.seqs, ctx.active)
        logits, up = d.forward(rows=[(b, d.root[b]) for b in range(B)],
                               extra=list(d.root) + [int(a) for a in ctx.active])
        return grammar_masked(ctx, logits, [(b, []) for b in range(B)]), up[:B], up[B:]

    @staticmethod
    def feed_layer(ctx, live, width, parents, tokens, paths=None):
        """Feeds one layer of a device search: the first ``live[b]`` of sequence b's ``width`` slots,
        slot (b, i) taking ``tokens[b * width + i]`` below ``parents[b * width + i]`` (a device tensor;
        a host list: one per fed slot). A slot not fed gets any computed row (never expanded); under a
        grammar ``paths[b][i]`` masks slot (b, i). Shape: tokens int64 [B * width] -> (logits
        [B * width, V], int64 [B] each sequence's first new block node, -1 where it feeds none)."""
        d, B = ctx.draft, len(live)
        pick = [(b, i) for b in range(B) for i in range(live[b])]
        first = [len(d.tokens[b]) if live[b] else -1 for b in range(B)]
        new = iter(d.add_device([b for b, _ in pick], parents, tokens, [b * width + i for b, i in pick]))
        pad, slots = min(d.fed), [(b, i) for b in range(B) for i in range(width)]  # pad: the first node fed
        logits, first = d.forward(rows=[(b, next(new) if i < live[b] else pad) for b, i in slots],
                                  extra=first)
        if paths is not None:  # no grammar work for the padding slots
            logits = grammar_masked(ctx, logits, [(b, paths[b][i] if i < live[b] else None)
                                                  for b, i in slots])
        return logits, first

    def draft_nodes(self, b, nodes):
        """The draft-block nodes whose K/V to keep for an accepted path whose fed prefix below the
        root has ``src`` ``nodes``: the same unless the drafter's block holds its tokens elsewhere."""
        return nodes


def vocab_ids(draft, cols):
    """Draft-logit columns as token ids: ``draft.vocab_keep[cols]`` where the draft scores its own
    vocabulary (a negative column, a dead entry, reads column 0), else ``cols`` unchanged. Shape:
    cols int [...] -> the same shape (int64 when mapped)."""
    return cols if draft.vocab_keep is None else draft.vocab_keep[cols.clamp(min=0).long()]


def grammar_prefix(ctx, b, tokens, after=()):
    """The longest prefix of ``tokens`` the grammar allows after sequence b's text and ``after``
    (all of them without a grammar, or for a sequence not drafting): a point mass on a token the
    grammar rejects would leave its draft row nothing to draw."""
    if ctx.grammar is None or not ctx.active[b] or not tokens:
        return list(tokens)
    n = len(after)
    toks, _ = ctx.grammar.constrain(b, [ctx.seqs[b][-1], *after, *tokens], list(range(-1, n + len(tokens))), forced=0)
    return list(tokens)[:max(len(toks) - 1 - n, 0)]


def grammar_masked(ctx, logits, paths):
    """A model drafter's logits masked to what the grammar allows (unchanged without one): row ``i``
    after ``paths[i]`` = (b, tokens drafted after sequence b's committed state), so the drafter draws
    from its distribution renormalised over allowed tokens, the ``q`` the rejection modes read
    (docs/structured.md). Shape: logits [N, V] -> [N, V] (in place, on a contiguous copy if needed)."""
    if ctx.grammar is None:
        return logits
    logits = logits.contiguous()
    apply_token_bitmask(logits, ctx.grammar.rows_after(paths).to(logits.device), check=False)
    return logits

