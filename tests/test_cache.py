"""StaticKVCache: appends at per-sequence lengths, compaction through kv_compact, truncation,
overflow raised before anything is written, and the runner's argument checks."""
import pytest
import torch

from specops.cache import StaticKVCache


def filled_cache(L=2, B=3, H=2, S=16, D=4, dtype=torch.float32):
    cache = StaticKVCache(L, B, H, S, D, dtype=dtype)
    cache.k.copy_(torch.randn_like(cache.k))
    cache.v.copy_(torch.randn_like(cache.v))
    return cache


def test_block_rows_land_after_each_sequence_and_stay_uncommitted():
    cache = filled_cache()
    cache.commit(torch.tensor([2, 5, 0], dtype=torch.int32))
    k = torch.randn(3, 2, 4, 4)
    v = torch.randn(3, 2, 4, 4)
    cache.begin_block(1, 4)
    cache.append_block(1, k, v)
    cache.end_block()
    for b, start in enumerate([3, 6, 1]):
        assert torch.equal(cache.k[1, b, :, start:start + 4], k[b])
        assert torch.equal(cache.v[1, b, :, start:start + 4], v[b])
    assert cache.lens.tolist() == [2, 5, 0]


def test_plain_mode_appends_and_commits_after_the_last_layer():
    cache = filled_cache(L=2, B=1)
    k = torch.randn(1, 2, 3, 4)
    cache.append_block(0, k, k)
    assert cache.lens.tolist() == [0]
    cache.append_block(1, k, k)
    assert cache.lens.tolist() == [3] and cache.get_seq_length() == 3
    assert torch.equal(cache.k[1, 0, :, :3], k[0])


def test_compact_moves_accepted_rows_in_every_layer_and_advances_lens():
    cache = filled_cache()
    cache.commit(torch.tensor([3, 0, 7], dtype=torch.int32))
    before_k, before_v = cache.k.clone(), cache.v.clone()
    accept_idx = torch.tensor([[0, 2, 5], [0, 1, 2], [0, 4, -1]], dtype=torch.int32)
    accept_lens = torch.tensor([3, 3, 2], dtype=torch.int32)
    cache.compact(accept_idx, accept_lens)
    for b, (P, idx) in enumerate([(3, [0, 2, 5]), (0, [0, 1, 2]), (7, [0, 4])]):
        for j, src in enumerate(idx):
            assert torch.equal(cache.k[:, b, :, P + j], before_k[:, b, :, P + src])
            assert torch.equal(cache.v[:, b, :, P + j], before_v[:, b, :, P + src])
    assert cache.lens.tolist() == [6, 3, 9]


def test_overflow_raises_before_anything_is_written():
    cache = filled_cache(S=8)
    cache.commit(torch.tensor([2, 6, 1], dtype=torch.int32))
    before = cache.k.clone()
    with pytest.raises(ValueError, match="cache overflow.*max_len=8"):
        cache.begin_block(0, 3)
    with pytest.raises(ValueError, match="cache overflow"):
        cache.append_block(0, torch.randn(3, 2, 3, 4), torch.randn(3, 2, 3, 4))
    assert torch.equal(cache.k, before) and cache.lens.tolist() == [2, 6, 1]


def test_compact_error_leaves_cache_untouched():
    cache = filled_cache()
    cache.commit(torch.tensor([3, 3, 3], dtype=torch.int32))
    before = cache.k.clone(), cache.v.clone(), cache.lens.clone()
    bad = torch.tensor([[0, 2, 1]] * 3, dtype=torch.int32)  # not increasing
    with pytest.raises(ValueError, match="accept_idx"):
        cache.compact(bad, torch.tensor([3, 3, 3], dtype=torch.int32))
    assert all(torch.equal(a, b) for a, b in zip(before, (cache.k, cache.v, cache.lens)))


def test_truncate_is_metadata_only_and_checked():
    cache = filled_cache()
    cache.commit(torch.tensor([5, 4, 3], dtype=torch.int32))
    before = cache.k.clone()
    cache.truncate(torch.tensor([2, 4, 0], dtype=torch.int32))
    assert cache.lens.tolist() == [2, 4, 0] and torch.equal(cache.k, before)
    with pytest.raises(ValueError, match=r"new_lens must lie in \[0, lens\]"):
        cache.truncate(torch.tensor([3, 4, 0], dtype=torch.int32))
    with pytest.raises(TypeError, match="new_lens must have dtype torch.int32"):
        cache.truncate(torch.tensor([1, 1, 0]))


def test_sizes_and_shape_errors():
    with pytest.raises(ValueError, match="StaticKVCache sizes must be >= 1"):
        StaticKVCache(2, 0, 2, 8, 4)
    cache = filled_cache()
    with pytest.raises(ValueError, match=r"k must have shape \[3, 2, \*, 4\]"):
        cache.append_block(0, torch.randn(3, 1, 2, 4), torch.randn(3, 1, 2, 4))


@pytest.mark.parametrize("lens", [[4, 4, 4], [4, 1, 6]])
def test_every_layer_of_a_block_writes_at_lens_plus_offset_equal_or_ragged(lens):
    # Equal lengths take the slice-copy plan, ragged ones the scatter plan; both convert dtype.
    cache = filled_cache(L=3, dtype=torch.bfloat16)
    cache.commit(torch.tensor(lens, dtype=torch.int32))
    before = cache.k.clone()
    ks = [torch.randn(3, 2, 2, 4) for _ in range(3)]
    cache.begin_block(2, 2)
    for layer, k in enumerate(ks):
        cache.append_block(layer, k, -k)
    cache.end_block()
    want = before.clone()
    for layer, k in enumerate(ks):
        for b, n in enumerate(lens):
            want[layer, b, :, n + 2:n + 4] = k[b].to(torch.bfloat16)
            assert torch.equal(cache.v[layer, b, :, n + 2:n + 4], (-k[b]).to(torch.bfloat16))
    assert torch.equal(cache.k, want) and cache.lens.tolist() == lens
