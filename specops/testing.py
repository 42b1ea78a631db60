"""Generators of valid random inputs, shared by the tests and the benchmarks."""
import torch

from .ops.layout import KvLayout
from .ops.tree_attention import visibility


def random_parents(B, T, *, num_nodes=None, generator=None, device="cpu", max_children=None):
    """Random topologically ordered trees, ``parents[b, i]`` uniform in ``[0, i)`` (``max_children=1``:
    chains). Shape: -> int32 [B, T]; padding (``i >= num_nodes[b]``) is garbage a kernel must ignore."""
    i = torch.arange(T)
    u = torch.rand(B, T, generator=generator)
    parents = (u * i.clamp(min=1)).long().clamp(max=(i - 1).clamp(min=0))
    if max_children == 1:
        parents = (i - 1).expand(B, T).clone()
    parents[:, 0] = -1
    if num_nodes is not None:
        pad = i[None, :] >= num_nodes.cpu()[:, None]
        parents[pad] = torch.randint(-5, T + 5, (int(pad.sum()),), generator=generator)
    return parents.to(torch.int32).to(device)


def random_num_nodes(B, T, *, generator=None, device="cpu"):
    """Ragged valid node counts in [1, T], with at least one full row. Shape: -> int32 [B]."""
    n = torch.randint(1, T + 1, (B,), generator=generator)
    n[0] = T
    return n.to(torch.int32).to(device)


def random_accept(B, A, *, generator=None, device="cpu", pattern="random", max_len=None):
    """Accepted node lists of a draft block of ``A`` nodes. Shape: -> accept_idx int32 [B, A] (padding
    garbage), accept_lens int32 [B]. ``pattern``: ``random`` (an increasing subset, length in [0,
    max_len or A], usually rooted at 0), ``all``, ``last`` (node A-1), ``alternating`` (0, 2, ...),
    ``shift`` (1, ..., A-1: every destination is the previous move's source)."""
    fixed = {"all": torch.arange(A), "last": torch.tensor([A - 1]), "alternating": torch.arange(0, A, 2),
             "shift": torch.arange(1, A)}
    if pattern not in fixed and pattern != "random":
        raise ValueError(f"pattern must be random, all, last, alternating or shift, got {pattern!r}")
    idx = torch.randint(-3, 2 * A + 3, (B, A), generator=generator)
    lens = torch.zeros(B, dtype=torch.int64)
    top = A if max_len is None else min(max_len, A)
    for b in range(B):
        chosen = fixed.get(pattern)
        if chosen is None:
            n = int(torch.randint(0, top + 1, (1,), generator=generator))
            perm = torch.randperm(A, generator=generator)[:n]
            if n and float(torch.rand(1, generator=generator)) < 0.7:
                perm[0] = 0 if 0 not in perm[1:] else perm[0]
            chosen = perm.unique(sorted=True)
        idx[b, : len(chosen)] = chosen
        lens[b] = len(chosen)
    return idx.to(torch.int32).to(device), lens.to(torch.int32).to(device)


def random_verify_case(B, T, V, *, generator=None, device="cpu", chain=False, match=0.7, sharpness=3.0):
    """A ragged batch of draft trees for the verification ops: target logits ``sharpness * N(0, 1)``;
    draft rows the softmax of those plus noise (correlated, not equal); a node's token is, with
    probability ``match``, its parent's target argmax (greedy paths go deep), else a draw from its
    draft row; padding tokens and parents are garbage. Shape: -> dict of tokens, parents int32 [B, T];
    num_nodes int32 [B]; target_logits, target_probs, draft_probs fp32 [B, T, V]; uniforms [B, T, 2]."""
    g = generator
    num_nodes = random_num_nodes(B, T, generator=g)
    parents = random_parents(B, T, num_nodes=num_nodes, generator=g, max_children=1 if chain else None)
    logits = torch.randn(B, T, V, generator=g) * sharpness
    draft = (logits + torch.randn(B, T, V, generator=g) * sharpness).softmax(-1)
    drawn = torch.multinomial(draft.reshape(B * T, V), 1, generator=g).reshape(B, T)
    par = parents.long().clamp(0, T - 1)
    greedy = logits.argmax(-1).gather(1, par)
    tokens = torch.where(torch.rand(B, T, generator=g) < match, greedy, drawn)
    pad = torch.arange(T)[None, :] >= num_nodes[:, None]
    tokens[pad] = torch.randint(-5, V + 5, (int(pad.sum()),), generator=g)
    tokens[:, 0] = torch.randint(0, V, (B,), generator=g)
    case = dict(tokens=tokens.to(torch.int32), parents=parents, num_nodes=num_nodes, target_logits=logits,
                target_probs=logits.softmax(-1), draft_probs=draft, uniforms=torch.rand(B, T, 2, generator=g))
    return {k: v.to(device) for k, v in case.items()}


# ---- paged KV caches ---------------------------------------------------------------------------

def to_pages(cache, page_size, *, generator=None, spare_pages=3, fill=float("nan"), shared_prefix_pages=0):
    """Lays a contiguous KV cache out in a pool of pages in random order (``tree_attention_paged``'s).
    Shape: cache [*lead, B, Hkv, S, D] -> (pages [*lead, num_pages, page_size, Hkv, D], page_table int32
    [B, ceil(S / page_size) + 1]). ``spare_pages`` unused pages and the slots past S are ``fill`` (NaN: a
    kernel that reads them shows it); the table's last column is garbage ids. ``shared_prefix_pages``:
    sequences b >= 1 map their first pages onto sequence 0's (compare against :func:`from_pages`)."""
    *lead, B, H, S, D = cache.shape
    n = -(-S // page_size)
    num_pages = B * n + spare_pages
    perm = torch.randperm(num_pages, generator=generator)
    table = perm[:B * n].view(B, n).clone()
    if shared_prefix_pages:
        table[1:, :shared_prefix_pages] = table[0, :shared_prefix_pages]
    pages = torch.full((*lead, num_pages, page_size, H, D), fill, dtype=cache.dtype)
    rows = cache.cpu().movedim(-2, -3)  # [*lead, B, S, H, D]
    for b in range(B):
        for i in range(shared_prefix_pages if b else 0, n):
            r0, r1 = i * page_size, min(S, (i + 1) * page_size)
            pages[..., int(table[b, i]), : r1 - r0, :, :] = rows[..., b, r0:r1, :, :]
    garbage = torch.randint(-5, num_pages + 5, (B, 1), generator=generator)
    page_table = torch.cat([table, garbage], dim=1).to(torch.int32)
    return pages.to(cache.device), page_table.to(cache.device)


def from_pages(pages, page_table, S):
    """The contiguous cache (first S rows) a paged one stands for. Shape: pages [*lead, num_pages,
    page_size, Hkv, D], page_table int32 [B, max_pages] -> [*lead, B, Hkv, S, D]."""
    return KvLayout.paged(pages, pages, page_table).gather().k[..., :S, :]


# ---- tiny language models for the decoding-loop tests (no downloads, built in milliseconds) ------

def tiny_causal_lm(arch="llama", *, vocab_size=128, hidden_size=64, num_layers=2, seed=0, sharpness=16.0,
                   dtype=None):
    """A random-init HF causal LM for exhaustive loop tests, with no BOS/EOS/PAD ids (nothing stops
    early). ``sharpness`` scales the final norm so next-token distributions are peaked like a trained
    model's (random init gives nearly uniform ones, where every tree stays one level deep)."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    configs = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}
    if arch not in configs:
        raise ValueError(f"arch must be one of {sorted(configs)}, got {arch!r}")
    config_cls, model_cls = configs[arch]
    cfg = config_cls(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                     num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2,
                     max_position_embeddings=1024, tie_word_embeddings=False, bos_token_id=None,
                     eos_token_id=None, pad_token_id=None)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = model_cls(cfg).eval()
    with torch.no_grad():
        model.model.norm.weight.fill_(sharpness)
    return model.to(dtype) if dtype is not None else model


def perturbed_copy(model, scale, seed=1):
    """A draft that agrees with ``model`` part of the time: every weight plus Gaussian noise of
    ``scale`` times that weight's standard deviation (0 = an exact copy)."""
    import copy

    out = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in out.parameters():
            if p.numel() > 1 and p.std() > 0:
                # The noise is drawn on the CPU (the same draft on every device), then moved to the weight's.
                p.add_(torch.randn(p.shape, generator=gen).to(p.device, p.dtype) * scale * p.std())
    return out


def reference_greedy(model, prompt, n):
    """Plain greedy decoding by full recomputation (no cache, no specops): ``n`` new token ids."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt):]


# ---- the batch-invariant schedule (tree_attention(..., invariant=True)) -------------------------

def ar_view(q, k_cache, v_cache, prefix_lens, block_lens, mask, b, i, *, self_in_block=True, spare_rows=3):
    """The one-query call AR decoding makes for query ``i`` of sequence ``b``: the query alone, the
    keys it sees in index order (its *virtual sequence*); an invariant backend gives row ``[b, i]``
    of the block call that call's bits. Shape: :func:`specops.tree_attention`'s arguments -> (q [1,
    1, Hq, D], k, v [1, Hkv, L + spare_rows, D] (``spare_rows`` NaN rows, never read), prefix_lens,
    block_lens int32 [1], mask int32 [1, 1, 1]). ``self_in_block``: the last visible key is the
    one-row block (AR's step: the token sees itself), else all are prefix."""
    vis = visibility(prefix_lens[b:b + 1], block_lens[b:b + 1], mask[b:b + 1, i:i + 1], None,
                     k_cache.shape[2])[0, 0]  # [S]
    rows = vis.nonzero().squeeze(1)
    L = rows.numel()
    pad = lambda c: torch.cat([c[b:b + 1, :, rows], c.new_full((1, c.shape[1], spare_rows, c.shape[3]), float("nan"))],
                              dim=2)
    own = 1 if self_in_block and L else 0
    int32 = lambda x: torch.tensor(x, dtype=torch.int32, device=q.device)
    return q[b:b + 1, i:i + 1], pad(k_cache), pad(v_cache), int32([L - own]), int32([own]), int32([[[own]]])
