"""Adaptive speculation: the loop sizes every block from the acceptance it has seen and the measured
cost of a step, for every method with a budget knob (``gamma`` or ``max_depth``; budget 0 is an AR
step, and the draft cache catches up through ``DraftLM.begin``'s catch-up chain when drafting
resumes). docs/methods.md §Adaptive speculation has the estimate, the rule, the probing, the cost
fits and why every method stays lossless; the code follows its names (``S``, ``N``, ``alpha0``,
``n0``, ``E(g)``, ``c(g)``, ``T(g)``, ``R(g)``)."""
import dataclasses
import math

from ..ops.linear import machine_layout


@dataclasses.dataclass
class AdaptiveConfig:
    """The controller's settings. ``max_budget`` / ``min_budget``: None = the drafter's range.
    ``target_cost(T)`` / ``draft_cost(g)``: fixed costs in seconds instead of measured ones."""
    decay: float = 0.8  # lam: weight of the older acceptance evidence per step
    alpha0: float = 0.6  # prior per-level acceptance
    prior_levels: float = 2.0  # n0: the prior's weight, in levels
    probe_after: int = 4
    probe_max: int = 64
    explore: float = 0.05  # failed probes' extra seconds: at most this share of the AR stretch after them
    probe_budget: int = 2  # a probe drafts at most this deep (it measures acceptance; growth follows)
    margin: float = 0.05  # speculate only while R(g) >= 1 + margin
    cost_decay: float = 0.75  # weight of the older cost measurements
    prior_slope: float = None  # extra target cost per block token (of a 1-token step); None: default_slope()
    slope_weight: float = 8.0  # the prior slope's weight against the measured sizes' spread (tokens^2)
    min_budget: int = None
    max_budget: int = None
    target_cost: object = None
    draft_cost: object = None

    def __post_init__(self):
        for name in ("decay", "alpha0", "cost_decay", "margin"):
            self._check(name, (int, float), "a number in [0, 1)", lambda v: 0 <= v < 1)
        self._check("explore", (int, float), "a number > 0.0", lambda v: v > 0)
        for name in ("prior_levels", "prior_slope", "slope_weight"):
            self._check(name, (int, float), "a number >= 0.0", lambda v: v >= 0)
        if self.prior_slope is None:
            self.prior_slope = default_slope()
        for name in ("probe_after", "probe_max", "probe_budget", "min_budget", "max_budget"):
            self._check(name, int, "an int >= 1", lambda v: v >= 1)
        if self.probe_max < self.probe_after:
            raise ValueError(f"AdaptiveConfig.probe_max ({self.probe_max}) must be >= probe_after ({self.probe_after})")
        for name in ("target_cost", "draft_cost"):
            fn = getattr(self, name)
            if fn is not None and not callable(fn):
                raise TypeError(f"AdaptiveConfig.{name} must be a callable or None, got {type(fn).__name__}")

    def _check(self, name, types, want, ok):
        v = getattr(self, name)
        unset = v is None and name in ("min_budget", "max_budget", "prior_slope")  # None: the range / default
        if not unset and (isinstance(v, bool) or not isinstance(v, types) or not ok(v)):
            raise ValueError(f"AdaptiveConfig.{name} must be {want}, got {v!r}")


def default_slope():
    """The prior slope of a block's cost per row: 0.025 of a one-row step where bf16 linears run on the
    AMX tiles (a 16-row block of SmolLM2's projections ~1.4x one row), else 0.07 (the AVX-512 lanes:
    2-4 rows +6-7 % a row; docs/methods.md §Adaptive speculation)."""
    return 0.025 if machine_layout() == "amx" else 0.07


def resolve(adaptive):
    """``generate``'s ``adaptive`` argument -> an AdaptiveConfig or None (off)."""
    if adaptive is None or isinstance(adaptive, AdaptiveConfig):
        return adaptive
    if isinstance(adaptive, bool):
        return AdaptiveConfig() if adaptive else None
    raise TypeError(f"adaptive must be True, False or an AdaptiveConfig, got {type(adaptive).__name__} {adaptive!r}")


def expected_tokens(alpha, g):
    """E(g) = 1 + alpha + ... + alpha^g: tokens per step (bonus included) at per-level acceptance alpha."""
    if g <= 0:
        return 1.0
    if alpha >= 1.0 - 1e-9:
        return float(g + 1)
    return (1.0 - alpha ** (g + 1)) / (1.0 - alpha)


class _Ewma:
    """Exponentially weighted means keyed by an int (block size or budget). ``mean`` changes only
    through ``add``, which drops the fit's cached sums: a step's budget search asks for them once per
    candidate budget (~40 for n-gram), ~1.7 ms of Python a step when recomputed each time."""

    def __init__(self, decay):
        self.decay = decay
        self.mean = {}
        self._fit = None

    def add(self, key, x):
        old = self.mean.get(key)
        self.mean[key] = x if old is None else self.decay * old + (1.0 - self.decay) * x
        self._fit = None

    def moments(self):
        """(mean key, mean value, sum of (k - mk)(v - mv), sum of (k - mk)^2) over the keys seen."""
        if self._fit is None:
            ks, vs = list(self.mean), list(self.mean.values())
            mk, mv = sum(ks) / len(ks), sum(vs) / len(vs)
            self._fit = (mk, mv, sum((k - mk) * (v - mv) for k, v in zip(ks, vs)), sum((k - mk) ** 2 for k in ks),
                         min(vs))
        return self._fit[:4]

    def least(self):
        """The smallest mean seen."""
        self.moments()
        return self._fit[4]


class CostModel:
    """Seconds of a target step by block size and of drafting by budget, measured online
    (or fixed functions from AdaptiveConfig)."""

    def __init__(self, cfg):
        self.cfg = cfg
        # seconds by block size, seconds by budget, block size by budget
        self.target, self.draft, self.size = (_Ewma(cfg.cost_decay) for _ in range(3))
        self.pace = None  # the latest steps' one-row cost: each step's time over its size's shape

    def observe(self, budget, block_size, t_target, t_draft):
        self.target.add(block_size, t_target)
        one = t_target / self.shape(block_size)
        self.pace = one if self.pace is None else self.cfg.cost_decay * self.pace + (1.0 - self.cfg.cost_decay) * one
        if budget > 0:
            self.draft.add(budget, t_draft)
            self.size.add(budget, block_size)

    def block_size(self, g):
        """T(g): the mean block size seen at budget g, else scaled from the nearest seen budget,
        else g + 1 (a chain)."""
        if g <= 0:
            return 1.0
        seen = self.size.mean
        if g in seen:
            return seen[g]
        if not seen:
            return g + 1.0
        near = min(seen, key=lambda k: (abs(k - g), k))
        return 1.0 + (seen[near] - 1.0) * g / near

    def target_cost(self, T):
        """pace x shape(T): the sizes' fit gives the shape, the latest steps of any size the level. A
        VM's pace drifts by 10-20 % within seconds, and a size's mean is as old as its last step: a
        one-row cost last measured in a slow stretch, set against blocks timed in a fast one, made a
        draft accepted one time in eight look worth its cost (translation, budget 1)."""
        if self.cfg.target_cost is not None:
            return float(self.cfg.target_cost(T))
        return max(self.pace * self.shape(T), 0.25 * self.target.least())

    def shape(self, T):
        """The fitted cost of a T-row block over that of one row."""
        return self._line(T) / self._line(1)

    def _line(self, T):
        mk, mv, cov, var = self.target.moments()
        # The least-squares slope, shrunk toward the prior (s of a one-token step per token, with
        # weight W in squared block sizes): a few nearby sizes (budgets 1-2 give T = 2, 3) say
        # little about the slope, and c(0) = t_target(1) is extrapolated from it while speculating.
        s, w = self.cfg.prior_slope, self.cfg.slope_weight
        prior = s * mv / (1.0 + s * (mk - 1))  # s * a, with a the one-token cost on the prior line
        slope = max((cov + w * prior) / (var + w), 0.0)
        floor = 0.25 * self.target.least()  # a steep fit must not extrapolate to ~0 s
        return max(mv + slope * (T - mk), floor)

    def draft_cost(self, g):
        if g > 0 and self.cfg.draft_cost is not None:
            return float(self.cfg.draft_cost(g))
        seen = self.draft.mean
        if g <= 0 or not seen:
            return 0.0
        if len(seen) == 1:
            (k, v), = seen.items()
            return v * g / k  # one budget seen: proportional (a chain drafts g forwards)
        mk, mv, cov, var = self.draft.moments()  # a least-squares line, slope >= 0
        return max(mv + max(cov / var, 0.0) * (g - mk), 0.25 * self.draft.least())

    def step_cost(self, g):
        """c(g) = t_target(T(g)) + t_draft(g); c(0) = t_target(1)."""
        return self.target_cost(self.block_size(g)) + self.draft_cost(g)


class Controller:
    """Per-sequence acceptance estimates and the batch's budget per step (the rule of docs/methods.md
    §Adaptive speculation). Pure Python over small numbers: the loop hands it what it already read.

    ``decide(active) -> g`` before a step (0 = AR step); ``observe(...)`` after it. ``ranks``: the
    :class:`specops.parallel.RankGroup` of a tensor-parallel target (None in one process)."""

    def __init__(self, cfg, batch, initial, lo, hi, ranks=None):
        if not 1 <= lo <= hi:
            raise ValueError(f"budget range must satisfy 1 <= lo <= hi, got lo={lo}, hi={hi}")
        self.cfg, self.lo, self.hi = cfg, lo, hi
        # The first step, drafted before any evidence, is a probe: at most probe_budget deep.
        self.initial = min(max(min(initial, cfg.probe_budget), lo), hi)
        self.costs = CostModel(cfg)
        self.S, self.N = [0.0] * batch, [0.0] * batch
        self.prev = self.initial  # the last speculative budget (growth is capped relative to it)
        self.mode = "spec"  # "spec", "ar" (waiting to probe) or "probe" (the last step was a probe)
        self.ar_left = 0  # AR steps still to run before the next probe
        self.wait = cfg.probe_after  # the current AR stretch between probes
        self.steps = 0
        self.ranks = ranks  # TP: step times differ per rank, so the group's first rank decides for all

    # ---- estimates ----------------------------------------------------------------------------

    def alpha(self, b):
        n0 = self.cfg.prior_levels
        if self.N[b] + n0 <= 0:
            return self.cfg.alpha0
        return min((self.S[b] + self.cfg.alpha0 * n0) / (self.N[b] + n0), 1.0)

    def rate(self, g, active):
        """Expected tokens per second of the batch at budget g: sum_b E_b(g) / c(g)."""
        tokens = sum(expected_tokens(self.alpha(b), g) for b, a in enumerate(active) if a)
        return tokens / self.costs.step_cost(g)

    def best(self, active):
        """The best positive budget within the growth cap, and its rate."""
        cap = min(self.hi, max(2 * self.prev, self.prev + 2))
        g = max(range(self.lo, max(cap, self.lo) + 1), key=lambda g: self.rate(g, active))  # ties: the first
        return g, self.rate(g, active)

    # ---- the protocol -------------------------------------------------------------------------

    def decide(self, active):
        """The next step's budget (0 = an AR step); the same on every rank of ``ranks``."""
        g = self._decide(active)
        return g if self.ranks is None else self.ranks.agree(g)

    def _decide(self, active):
        if not any(active):
            return 0
        fixed, measured = self.cfg.target_cost is not None, self.costs.target.mean  # seconds by block size
        if self.steps == 0 or not (fixed or measured):
            return self.initial
        if not (fixed or 1 in measured):  # measure c(0), the one-row step every budget is weighed against,
            return 0  # once: an AR step loses nothing against AR
        if self.mode == "ar":
            if self.ar_left > 0:
                self.ar_left -= 1
                return 0
            self.mode = "probe"
            return max(min(self.best(active)[0], self.cfg.probe_budget), self.lo)
        g, r = self.best(active)
        if r * self.costs.step_cost(0) >= (1.0 + self.cfg.margin) * sum(active):  # R(g) >= 1 + margin
            self.mode, self.wait = "spec", self.cfg.probe_after
            return g
        if self.mode == "probe":  # a failed probe: the wait doubles and covers the probe's extra cost
            self.wait = min(max(2 * self.wait, self.explore_wait()), self.cfg.probe_max)
        self.mode, self.ar_left = "ar", self.wait - 1
        return 0

    def explore_wait(self):
        """AR steps whose time makes the last speculative budget's extra cost over an AR step
        ``explore`` of it: ceil((c(g) - c(0)) / (explore * c(0)))."""
        c0 = self.costs.step_cost(0)
        extra = self.costs.step_cost(self.prev) - c0
        return 0 if c0 <= 0 or extra <= 0 else math.ceil(extra / (self.cfg.explore * c0) - 1e-9)  # (float noise)

    def observe(self, budget, depth, accepted, block_size, t_target, t_draft):
        """One finished step. ``depth[b]``: levels proposed (0 or None: no proposal, e.g. an
        inactive sequence or an n-gram miss), ``accepted[b]``: draft tokens accepted;
        ``block_size``: the target block's width T; times in seconds."""
        self.steps += 1
        if budget > 0 and not any(depth):  # nothing proposed (an n-gram miss): an AR step's cost
            self.costs.observe(0, block_size, t_target, t_draft)
            return
        self.costs.observe(budget, block_size, t_target, t_draft)
        if budget <= 0:
            return
        self.prev = budget
        lam = self.cfg.decay
        for b, (D, a) in enumerate(zip(depth, accepted)):
            if not D:
                continue
            a = min(a, D)
            self.S[b] = lam * self.S[b] + a
            self.N[b] = lam * self.N[b] + a + (1 if a < D else 0)
