"""Decoding metrics, with vLLM's spec-decode names and definitions; docs/methods.md §Metrics defines
them and what specops adds. Not there: ``num_accepted_tokens_per_pos[j]`` counts the drafts whose
accepted path reaches depth ``j+1``, and ``acceptance_rate_per_pos[j]`` divides it by ``num_drafts``.
"""
import dataclasses
import math


def _ratio(num, den, empty=0.0, doc=None):
    """A derived property: attribute ``num`` / attribute ``den``, ``empty`` while ``den`` is 0 (or None)."""
    return property(lambda m: getattr(m, num) / getattr(m, den) if getattr(m, den) else empty, doc=doc)


@dataclasses.dataclass
class Metrics:
    method: str = ""
    batch_size: int = 0
    num_generated_tokens: int = 0
    num_target_forwards: int = 0  # verification forwards (prefill excluded)
    num_draft_forwards: int = 0
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: list = dataclasses.field(default_factory=list)
    num_drafted_nodes: int = 0
    draft_depth: int = 0
    num_graph_success: int = 0
    prefill_time_s: float = 0.0
    draft_time_s: float = 0.0
    verify_time_s: float = 0.0
    bookkeeping_time_s: float = 0.0
    total_time_s: float = 0.0
    compile_time_s: float = 0.0  # compiling forwards during this call (generate(compile=True)); not in total_time_s
    target_logprob_sum: float = 0.0
    target_logprob_count: int = 0
    ar_tokens_per_s: float = None
    adaptive: bool = False  # budgets chosen per step by the adaptive controller
    num_ar_steps: int = 0  # steps the controller ran without a draft
    num_budget_steps: int = 0  # steps it ran with a draft (budget > 0)
    budget_sum: int = 0  # sum of their budgets
    lengths: list = dataclasses.field(default_factory=list)
    finish_reasons: list = dataclasses.field(default_factory=list)
    steps: list = dataclasses.field(default_factory=list)  # per-step records when requested

    # ---- recording ----------------------------------------------------------------------------

    def record_draft(self, drafted, accepted, depth_drafted=0, drafted_nodes=0, graph_success=False):
        """One sequence's verification step: ``drafted`` tokens proposed, ``accepted`` accepted."""
        self.num_drafts += 1
        self.num_draft_tokens += drafted
        self.num_accepted_tokens += accepted
        self.num_accepted_tokens_per_pos += [0] * (accepted - len(self.num_accepted_tokens_per_pos))
        for j in range(accepted):
            self.num_accepted_tokens_per_pos[j] += 1
        self.draft_depth += depth_drafted
        self.num_drafted_nodes += drafted_nodes
        self.num_graph_success += bool(graph_success)

    def record_budget(self, budget):
        """One step's budget from the adaptive controller (0 = an AR step)."""
        if budget:
            self.num_budget_steps += 1
            self.budget_sum += budget
        else:
            self.num_ar_steps += 1

    # ---- derived ------------------------------------------------------------------------------

    @property
    def mean_acceptance_length(self):
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0

    draft_acceptance_rate = _ratio("num_accepted_tokens", "num_draft_tokens")

    @property
    def acceptance_rate_per_pos(self):
        return [a / self.num_drafts for a in self.num_accepted_tokens_per_pos] if self.num_drafts else []

    draft_tokens_per_step = _ratio("num_draft_tokens", "num_drafts")
    drafted_nodes_per_step = _ratio("num_drafted_nodes", "num_drafts")
    matchness = _ratio("num_accepted_tokens", "draft_depth",
                       doc="GSD's acceptance rate: accepted draft tokens per drafting step executed.")
    graph_success_rate = _ratio("num_graph_success", "num_drafts")

    tokens_per_s = _ratio("num_generated_tokens", "total_time_s")
    speedup = _ratio("tokens_per_s", "ar_tokens_per_s", None)

    @property
    def perplexity(self):
        """exp(-mean log p_target(token | prefix)) over the emitted tokens (unwarped target)."""
        n = self.target_logprob_count
        return math.exp(-self.target_logprob_sum / n) if n else None

    mean_budget = _ratio("budget_sum", "num_budget_steps", None,
                         doc="The adaptive controller's mean budget over its speculative steps (None when off).")
    ar_step_fraction = _ratio("num_ar_steps", "num_target_forwards",
                              doc="Share of the target forwards the adaptive controller ran as AR steps.")

    def as_dict(self):
        """Every field but ``steps``, then every derived value (in the order defined above)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "steps"}
        return out | {k: getattr(self, k) for k, v in vars(Metrics).items() if isinstance(v, property)}

    def summary(self):
        """Multi-line human-readable report."""
        lines = [
            f"method {self.method}: {self.num_generated_tokens} tokens in {self.total_time_s:.2f} s "
            f"= {self.tokens_per_s:.1f} tok/s (batch {self.batch_size}; prefill {self.prefill_time_s:.2f} s"
            + (f"; compiling {self.compile_time_s:.1f} s, not counted" if self.compile_time_s else "") + ")",
            f"target forwards {self.num_target_forwards}, draft forwards {self.num_draft_forwards}",
            f"mean acceptance length {self.mean_acceptance_length:.2f}, draft acceptance rate "
            f"{self.draft_acceptance_rate:.3f}, drafted tokens/step {self.draft_tokens_per_step:.1f}",
        ]
        if self.method == "gsd" or self.num_graph_success:
            lines.append(f"drafted nodes/step {self.drafted_nodes_per_step:.1f} (graph), matchness "
                         f"{self.matchness:.3f}, graph success {self.graph_success_rate:.3f}")
        if self.acceptance_rate_per_pos:
            per = " ".join(f"{a:.2f}" for a in self.acceptance_rate_per_pos[:12])
            lines.append(f"acceptance per position: {per}")
        if self.adaptive:
            mb = f"{self.mean_budget:.1f}" if self.mean_budget is not None else "n/a"
            lines.append(f"adaptive: mean budget {mb} over {self.num_budget_steps} speculative steps, "
                         f"AR steps {self.num_ar_steps} ({100 * self.ar_step_fraction:.0f}% of target forwards)")
        lines.append(f"time: draft {self.draft_time_s:.2f} s, verify {self.verify_time_s:.2f} s, "
                     f"bookkeeping {self.bookkeeping_time_s:.2f} s")
        if self.speedup is not None:
            lines.append(f"speedup vs autoregressive (same process): {self.speedup:.2f}x "
                         f"({self.ar_tokens_per_s:.1f} tok/s)")
        return "\n".join(lines)
