"""KVCache on both layouts (StaticKVCache, PagedKVCache; ``layout``, read through ``dense``): appends at
per-sequence lengths, compaction, truncation, a cache still usable after a rejected call, and the
argument checks that tests/test_bad_input_state.py's battery lacks."""
import pytest
import torch
from test_bad_input_state import CACHE, _cache  # the cache's bad-input battery
from test_kv_compact import i32

from specops.cache import KVCacheBase, PagedKVCache, StaticKVCache
from specops.engine.cache import KVCache
from specops.ops.layout import KvLayout
from specops.testing import from_pages, random_accept


@pytest.fixture(params=["contiguous", "paged"])
def layout(request):
    return request.param


def filled_cache(L=2, B=3, H=2, S=16, D=4, dtype=torch.float32, layout="contiguous", lens=None):
    """Random K/V rows; ``lens`` (a list) committed."""
    if layout == "paged":  # pages of 4 rows, scattered over the pool, S not a multiple of the page
        cache = PagedKVCache(L, B, H, S, D, page_size=4, dtype=dtype)
    else:
        cache = StaticKVCache(L, B, H, S, D, dtype=dtype)
    for t in (cache.layout.k, cache.layout.v):
        t.copy_(torch.randn_like(t))
    if lens is not None:
        cache.commit(i32(lens))
    return cache


def dense(cache):
    """Every layer's rows as a contiguous cache (a copy): k, v [L, B, Hkv, max_len, D]."""
    kv = cache.layout.gather()
    return tuple(t[..., :cache.max_len, :].clone() for t in (kv.k, kv.v))


def test_plain_mode_appends_and_commits_after_the_last_layer(layout):
    cache = filled_cache(L=2, B=1, layout=layout)
    k = torch.randn(1, 2, 3, 4)
    cache.append_block(0, k, k)
    assert cache.lens.tolist() == [0]
    cache.append_block(1, k, k)
    assert cache.lens.tolist() == [3] and cache.get_seq_length() == 3
    assert torch.equal(dense(cache)[0][1, 0, :, :3], k[0])


def test_compact_moves_accepted_rows_in_every_layer_and_advances_lens(layout):
    cache = filled_cache(layout=layout, lens=[3, 0, 7])
    before = dense(cache)
    cache.compact(i32([[0, 2, 5], [0, 1, 2], [0, 4, -1]]), i32([3, 3, 2]))
    for got, old in zip(dense(cache), before):
        for b, (P, idx) in enumerate([(3, [0, 2, 5]), (0, [0, 1, 2]), (7, [0, 4])]):
            for j, src in enumerate(idx):
                assert torch.equal(got[:, b, :, P + j], old[:, b, :, P + src])
    assert cache.lens.tolist() == [6, 3, 9]


def test_truncate_is_metadata_only(layout):
    cache = filled_cache(layout=layout, lens=[5, 4, 3])
    k = cache.layout.k.clone()
    cache.truncate(i32([2, 4, 0]))
    assert cache.lens.tolist() == [2, 4, 0] and torch.equal(cache.layout.k, k)


def test_host_counts_keep_the_host_lengths_fresh_without_a_read(monkeypatch):
    # compact(host_counts=) and truncate(host_lens=): the caller's lists replace the device reads
    cache = filled_cache()
    cache.commit(i32([5, 4, 3]), host_counts=[5, 4, 3])
    cache.begin_block(0, 4)
    cache.append_block(0, *torch.randn(2, 3, 2, 4, 4))
    cache.end_block()
    reads = []
    monkeypatch.setattr(torch.Tensor, "tolist", lambda t: reads.append(t) or [])
    cache.compact(i32([[0, 2], [1, 3], [0, 1]]), i32([2, 1, 0]), check=False, host_counts=[2, 1, 0])
    assert cache.host_lens() == [7, 5, 3]
    cache.truncate(i32([6, 5, 1]), host_lens=[6, 5, 1])
    assert cache.host_lens() == [6, 5, 1] and reads == []
    with pytest.raises(ValueError, match=r"new_lens must lie in \[0, lens\], got new_lens\[2\] = 2 for lens\[2\] = 1"):
        cache.truncate(i32([6, 5, 2]), host_lens=[6, 5, 2])
    with pytest.raises(ValueError, match="host_counts / host_lens must have 3 entries, got 2"):
        cache.truncate(i32([6, 5, 1]), host_lens=[6, 5])
    monkeypatch.undo()
    assert cache.lens.tolist() == [6, 5, 1]


@pytest.mark.parametrize("lens, offset, T, dtype", [
    ([4, 4, 4], 2, 2, torch.bfloat16), ([4, 1, 6], 2, 2, torch.bfloat16), ([2, 5, 0], 1, 4, torch.float32)])
def test_a_block_writes_every_layer_at_lens_plus_offset_uncommitted(lens, offset, T, dtype, layout):
    # Contiguous: equal lengths take the slice copy, ragged ones row addresses (paged: always); dtypes convert
    cache = filled_cache(L=3, dtype=dtype, layout=layout, lens=lens)
    want_k, want_v = dense(cache)
    ks = torch.randn(3, 3, 2, T, 4)  # per layer
    cache.begin_block(offset, T)
    for layer, k in enumerate(ks):
        cache.append_block(layer, k, -k)
    cache.end_block()
    for b, n in enumerate(lens):
        want_k[:, b, :, n + offset:n + offset + T] = ks[:, b].to(dtype)
        want_v[:, b, :, n + offset:n + offset + T] = (-ks[:, b]).to(dtype)
    got_k, got_v = dense(cache)
    assert torch.equal(got_k, want_k) and torch.equal(got_v, want_v) and cache.lens.tolist() == lens


# ---- issue #16 item 1: a rejected call leaves the cache usable ----------------------------------

@pytest.mark.parametrize("label, call, exc, shows", CACHE, ids=[c[0] for c in CACHE])
def test_a_rejected_call_leaves_the_cache_usable(label, call, exc, shows, layout):
    # Each rejected call of the battery (whose test checks message and state), then a block lands as usual.
    cache = _cache(layout, "cpu")  # lens [6, 3]
    rows = dense(cache)[0]
    with pytest.raises(exc):
        call(cache)
    cache.begin_block(0, 2)
    k = torch.randn(2, 2, 2, 4)
    cache.append_block(0, k, k)
    got = dense(cache)[0]
    for b, n in enumerate([6, 3]):
        assert torch.equal(got[0, b, :, n:n + 2], k[b]) and torch.equal(got[0, b, :, :n], rows[0, b, :, :n])


def test_commit_with_host_counts_checks_them_and_keeps_the_mirror_fresh():
    cache = filled_cache(S=8)
    cache.commit(i32([1, 2, 3]), host_counts=[1, 2, 3])
    assert cache._host_lens == [1, 2, 3]
    cache.commit(i32([1, 1, 1]))  # checked: one sync, mirror refreshed
    assert cache._host_lens == [2, 3, 4] == cache.lens.tolist()
    with pytest.raises(ValueError, match=r"counts\[2\] must lie in \[0, max_len - lens\[2\]\] = \[0, 4\]"):
        cache.commit(i32([0, 0, 5]))
    cache.commit(i32([0, 0, 5]), check=False)  # unchecked: no sync, no error
    assert cache._host_lens is None and cache.lens.tolist() == [2, 3, 9]


def test_crop_follows_transformers_sign_convention_and_reorder_is_checked(layout):
    cache = filled_cache(layout=layout, lens=[5, 2, 7])
    cache.crop(-3)  # what transformers' assisted generation passes
    assert cache.lens.tolist() == [2, 0, 4]
    cache.crop(1)
    assert cache.lens.tolist() == [1, 0, 3]
    k, v = dense(cache)
    cache.reorder_cache(torch.tensor([2, 2, 0]))
    got_k, got_v = dense(cache)
    assert cache.lens.tolist() == [3, 3, 1]
    assert torch.equal(got_k, k[:, [2, 2, 0]]) and torch.equal(got_v, v[:, [2, 2, 0]])


# ---- KVCache over a layout: the constructors only allocate ---------------------------------------

def test_kvcache_wraps_a_users_layout():
    k, v = torch.zeros(2, 3, 2, 8, 4), torch.zeros(2, 3, 2, 8, 4)
    cache = KVCache(KvLayout.contiguous(k, v), max_len=6)
    assert KVCacheBase is KVCache and isinstance(StaticKVCache(1, 1, 1, 4, 2), KVCache)
    assert cache.k is k and (cache.max_len, cache.num_layers, cache.num_kv_heads, cache.head_dim) == (6, 2, 2, 4)
    rows = torch.randn(3, 2, 6, 4)
    for layer in range(2):
        cache.append_block(layer, rows, -rows)
    assert torch.equal(k[1, :, :, :6], rows) and torch.equal(v[0, :, :, :6], -rows) and cache.lens.tolist() == [6] * 3
    (kp, vp), table = torch.zeros(2, 2, 5, 4, 1, 2), i32([[3, 1], [0, 4]])
    paged = KVCache(KvLayout.paged(kp, vp, table))
    assert paged.k_pages is kp and paged.v_pages is vp and paged.page_table is table
    assert (paged.max_len, paged.page_size, paged.num_pages) == (8, 4, 5)
    with pytest.raises(ValueError, match="cache overflow"):
        paged.begin_block(0, 9)


@pytest.mark.parametrize("make, exc, match", [
    (lambda k, v, t: KVCache((k, v)), TypeError, "KVCache layout must be a specops.ops.layout.KvLayout, got tuple"),
    (lambda k, v, t: KVCache(KvLayout.contiguous(k, v), max_len=9), ValueError,
     r"KVCache max_len must be <= 8 \(the rows the layout holds per sequence\), got 9"),
    (lambda k, v, t: KVCache(KvLayout.contiguous(k, v), max_len=0), ValueError, "KVCache sizes must be >= 1"),
    (lambda k, v, t: KVCache(KvLayout.contiguous(k.double(), v.double())), TypeError, "k_cache must have dtype"),
    (lambda k, v, t: KVCache(KvLayout.contiguous(k, k)), ValueError, "v_cache must not share memory with k_cache"),
    (lambda k, v, t: KVCache(KvLayout.contiguous(k[0], v[0])), ValueError, "k_cache must have rank 5"),
    (lambda k, v, t: KVCache(KvLayout.paged(k, v, t.long())), TypeError, "page_table must have dtype torch.int32"),
    (lambda k, v, t: KVCache(KvLayout.paged(*torch.zeros(2, 2, 3, 3, 2, 4), t)), ValueError,
     "page_size .* power of two"),
    # the rest (sizes, dtypes, page_size, num_pages, page_order's values): tests/test_bad_input_state.py
    (lambda k, v, t: StaticKVCache(1, 1, 1, 4, 2, dtype=torch.bool), TypeError,
     "StaticKVCache dtype must be .*got torch.bool"),
    (lambda k, v, t: PagedKVCache(2, 3, 2, 21, 4, page_size=4, page_order=torch.arange(17)), ValueError,
     r"page_order must have shape \[18\]"),
])
def test_constructors_check_their_arguments(make, exc, match):
    k, v = torch.zeros(2, 3, 2, 8, 4), torch.zeros(2, 3, 2, 8, 4)
    with pytest.raises(exc, match=match):
        make(k, v, torch.zeros(3, 2, dtype=torch.int32))


# ---- PagedKVCache: the semantics of StaticKVCache on scattered pages -----------------------------

def pair(L=2, B=3, H=2, S=21, D=4, page_size=4, **kw):
    return StaticKVCache(L, B, H, S, D), PagedKVCache(L, B, H, S, D, page_size=page_size, **kw)


def same_rows(static, paged):
    S = static.max_len
    return (torch.equal(from_pages(paged.k_pages, paged.page_table, S), static.k)
            and torch.equal(from_pages(paged.v_pages, paged.page_table, S), static.v)
            and torch.equal(static.lens, paged.lens) and static.host_lens() == paged.host_lens())


def test_paged_table_is_scattered_and_covers_max_len():
    cache = PagedKVCache(2, 3, 2, 21, 4, page_size=4)
    table = cache.page_table
    assert table.shape == (3, 6) and table.dtype == torch.int32 and cache.k_pages.shape == (2, 18, 4, 2, 4)
    assert sorted(table.flatten().tolist()) == list(range(18))
    assert not torch.equal(table.flatten(), torch.arange(18, dtype=torch.int32))  # not in pool order
    order = torch.arange(20).flip(0)
    cache = PagedKVCache(1, 3, 1, 21, 2, page_size=4, num_pages=20, page_order=order)
    assert cache.page_table.tolist() == [[19, 18, 17, 16, 15, 14], [13, 12, 11, 10, 9, 8], [7, 6, 5, 4, 3, 2]]


@pytest.mark.parametrize("page_size", [1, 4, 8])
@pytest.mark.parametrize("seed", [0, 1])
def test_paged_cache_matches_static_over_random_ragged_steps(page_size, seed):
    g = torch.Generator().manual_seed(seed)
    static, paged = pair(page_size=page_size, page_order=torch.Generator().manual_seed(seed + 7))
    L, B, H, D = 2, 3, 2, 4
    prompt = torch.randint(1, 6, (B,), generator=g).to(torch.int32)
    for cache in (static, paged):
        cache.commit(prompt)
    for step in range(6):
        T = int(torch.randint(1, 5, (1,), generator=g))
        offset = int(torch.randint(0, 2, (1,), generator=g))
        if max(static.host_lens()) + offset + T > static.max_len:
            break
        rows = [(torch.randn(B, H, T, D, generator=g), torch.randn(B, H, T, D, generator=g)) for _ in range(L)]
        for cache in (static, paged):
            cache.begin_block(offset, T)
            for layer, (k, v) in enumerate(rows):
                cache.append_block(layer, k, v)
            cache.end_block()
        assert same_rows(static, paged)
        what = ("compact", "commit", "truncate")[step % 3]
        if what == "compact":  # keep an accepted path of the block
            args = random_accept(B, offset + T, generator=g)
        elif what == "commit":  # keep a chain
            args = (torch.randint(0, offset + T + 1, (B,), generator=g).to(torch.int32),)
        else:  # roll back some committed rows
            args = ((static.lens - torch.randint(0, 3, (B,), generator=g).to(torch.int32)).clamp(min=0),)
        for cache in (static, paged):
            getattr(cache, what)(*args)
        assert same_rows(static, paged), f"step {step} ({what})"
    for cache in (static, paged):
        cache.reorder_cache(torch.tensor([2, 0, 0]))
        cache.crop(-1)
    assert same_rows(static, paged)


def test_paged_plain_mode_hands_attention_a_contiguous_copy():
    static, paged = pair(L=2, B=2, S=10, page_size=4)
    for step in (3, 2):
        k = torch.randn(2, 2, step, 4)
        for cache in (static, paged):
            got = [cache.update(k * (layer + 1), -k, layer) for layer in range(2)]
            assert got[1][0].shape == (2, 2, 10, 4)
            assert torch.equal(got[1][0], static.k[1]) and torch.equal(got[1][1], static.v[1])
    assert same_rows(static, paged) and paged.lens.tolist() == [5, 5]
    paged.begin_block(0, 1)  # in a block the layer's pools go to the specops attention
    kp, _ = paged.append_block(0, *torch.randn(2, 2, 2, 1, 4))
    assert kp.data_ptr() == paged.k_pages[0].data_ptr() and kp.shape == (6, 4, 2, 4)

