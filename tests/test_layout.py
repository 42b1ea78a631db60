"""KvLayout, the one type of both KV cache layouts: rows, the write address against the C++ kernels'
placement (row r of sequence b is slot r % page_size of page page_table[b, r // page_size]), the
contiguous view, the metadata rules with the ops' messages, and the exported names."""
import pytest
import torch

import specops
from specops import KvLayout
from specops.testing import from_pages, to_pages

from test_kv_compact import i32


def paged_layout(page_size=4, B=2, H=3, S=10, D=5, lead=()):
    cache = torch.randn(*lead, B, H, S, D)
    pages, table = to_pages(cache, page_size, generator=torch.Generator().manual_seed(0), fill=0.0)
    return cache, KvLayout.paged(pages, -pages, table)


def test_rows_and_capacity():
    k = torch.zeros(2, 3, 10, 4)
    contiguous = KvLayout.contiguous(k, k)
    assert (contiguous.rows(), contiguous.capacity(), contiguous.batch(), contiguous.num_kv_heads) == (10, 10, 2, 3)
    assert not contiguous.is_paged and contiguous.op("tree_attention") == "tree_attention"
    _, paged = paged_layout(page_size=4, B=2, H=3, S=10)  # 3 pages a sequence, a garbage column: max_pages 4
    assert (paged.rows(), paged.capacity(), paged.batch(), paged.num_kv_heads, paged.page_size) == (16, 16, 2, 3, 4)
    assert paged.op("kv_compact") == "kv_compact_paged" and paged.names == ("k_pages", "v_pages")
    empty = KvLayout.paged(paged.k[:0], paged.v[:0], paged.page_table)
    assert empty.rows() == 0 and empty.capacity() == 16  # no page to read; the table still bounds the lengths


@pytest.mark.parametrize("page_size", [1, 2, 4, 16])
def test_address_is_where_the_row_lives(page_size):
    cache, kv = paged_layout(page_size=page_size, lead=(2,))
    b = torch.arange(2)[:, None]
    r = torch.arange(10)[None, :]
    page, slot = kv.address(b, r)
    assert torch.equal(page, kv.page_table.long()[b, r // page_size]) and torch.equal(slot, (r % page_size).expand(2, 10))
    rows = kv.k[kv.index(page.flatten(), slot.flatten())]  # [L, B * S, H, D]
    assert torch.equal(rows.view(2, 2, 10, 3, 5).transpose(2, 3), cache)
    contiguous = KvLayout.contiguous(cache, cache)
    rows = cache[contiguous.index(*(t.flatten() for t in contiguous.address(b, r)))]  # [B * S, L, H, D]
    assert torch.equal(rows, cache.permute(1, 3, 0, 2, 4).reshape(20, 2, 3, 5))


def test_gather_is_the_contiguous_cache_the_pages_stand_for():
    cache, kv = paged_layout(lead=(2,))
    flat = kv.gather()
    assert not flat.is_paged and torch.equal(flat.k[..., :10, :], cache) and torch.equal(flat.v[..., :10, :], -cache)
    assert torch.equal(from_pages(kv.k, kv.page_table, 10), cache)


def test_check_names_the_layout_arguments():
    _, kv = paged_layout()
    kv.check(dtype=torch.float32, rank=4, B=2, D=5, Hq=6)
    with pytest.raises(ValueError, match=r"k_pages page_size \(dim 1\) must be a power of two >= 1, got 3"):
        KvLayout.paged(kv.k[:, :3], kv.v[:, :3], kv.page_table).check(dtype=torch.float32, rank=4)
    with pytest.raises(ValueError, match="k_pages has page_size=4, but the layout was declared with page_size=8"):
        KvLayout.paged(kv.k, kv.v, kv.page_table, 8).check(dtype=torch.float32, rank=4)
    with pytest.raises(ValueError, match=r"page_table must have shape \[3, \*\]"):
        kv.check(dtype=torch.float32, rank=4, B=3, D=5)
    with pytest.raises(TypeError, match="page_table must be a torch.Tensor for a paged layout, got None"):
        KvLayout.paged(kv.k, kv.v, None)


def test_page_rule_names_the_first_page_outside_the_pool():
    k = torch.zeros(4, 2, 1, 1)
    kv = KvLayout.paged(k, k, i32([[0, 1, 9], [2, 3, 7]]))
    bad, message = kv.page_rule(torch.tensor([4, 6]))  # rows 0-3 / 0-5: pages 0-1 / 0-2
    assert bad.tolist() == [[False, False, False], [False, False, True]]
    assert message() == ("page_table[1, 2] must lie in [0, num_pages=4) (page 2 holds rows [4, 6) of sequence 1, "
                         "which uses 6 rows), got 7")


def test_exported_names():
    assert specops.tree_attention_paged.__module__ == "specops.ops.tree_attention"
    assert specops.kv_compact_paged.__module__ == "specops.ops.kv_compact"
    assert specops.KvLayout.__module__ == "specops.ops.layout"
    assert {"tree_attention_paged", "kv_compact_paged", "KvLayout"} <= set(specops.__all__)
