"""build_tree_mask: golden trees, every backend vs the reference, properties, registration (bad input:
tests/test_bad_input.py)."""
import pytest
import torch
from _op_checks import needs_cpp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_kv_compact import i32

import specops
from specops import backend as _backend
from specops.testing import random_num_nodes, random_parents


def bits(mask_row):
    """Set bit positions of one packed mask row, as a sorted list."""
    return [j for j in range(32 * mask_row.numel()) if (int(mask_row[j // 32]) >> (j % 32)) & 1]


# ---- golden cases, each on every backend -------------------------------------------------------

GOLDEN = {  # name: (parents, num_nodes, the set bits of each row of sequence 0 (or a check of the mask), depths)
    "chain_sees_every_earlier_node": ([-1, 0, 1, 2, 3], None, [list(range(i + 1)) for i in range(5)], [[0, 1, 2, 3, 4]]),
    "star_children_see_root_and_themselves": ([-1, 0, 0, 0, 0, 0], None, [[0]] + [[0, i] for i in range(1, 6)],
                                              [[0, 1, 1, 1, 1, 1]]),
    # 0 -> (1, 2); 1 -> (3, 4); 2 -> (5, 6)
    "binary_tree": ([-1, 0, 0, 1, 1, 2, 2], None, [[0], [0, 1], [0, 2], [0, 1, 3], [0, 1, 4], [0, 2, 5], [0, 2, 6]],
                    [[0, 1, 1, 2, 2, 2, 2]]),
    # padding entries are not validated (-9 and 99: parents no real node may have)
    "padding_rows_hold_only_their_own_bit": ([[-1, 0, 1, -9, 99], [-1, 0, 0, 1, 2]], [3, 5],
                                             [[0], [0, 1], [0, 1, 2], [3], [4]], [[0, 1, 2, 0, 0], [0, 1, 1, 2, 2]]),
    "single_node": ([-1], None, [[0]], [[0]]),
    # a chain of 33; bit 31 is set in every word: int32 wraps
    "t33_crosses_a_word_boundary": (list(range(-1, 32)), None, lambda m: bits(m[0, 32]) == list(range(33))
                                    and m[0, 31, 0] == -1 and m[0, 31, 1] == 0, [list(range(33))]),
    # a star of 49, then a chain hanging off node 49
    "t100_deep_and_wide": ([-1] + [0] * 49 + list(range(49, 99)), None,
                           lambda m: bits(m[0, 99]) == [0] + list(range(49, 100)), [[0] + [1] * 49 + list(range(2, 52))]),
}


@pytest.mark.parametrize("name", list(GOLDEN))
def test_golden(backend, device, name):
    parents, num_nodes, rows, depths = GOLDEN[name]
    p = i32(parents, device).view(len(depths), -1)  # [B, T]
    nn = None if num_nodes is None else i32(num_nodes, device)
    mask, depth = (t.cpu() for t in specops.build_tree_mask(p, nn, backend=backend))
    T = len(depths[0])
    assert mask.shape == (len(depths), T, (T + 31) // 32) and depth.tolist() == depths
    assert rows(mask) if callable(rows) else [bits(mask[0, i]) for i in range(T)] == rows


# ---- every backend vs the reference ----------------------------------------------------------

@pytest.mark.parametrize("B", [1, 3, 17])
@pytest.mark.parametrize("T", [1, 5, 31, 33, 97, 257])
def test_matches_reference_on_random_trees(fast_backend, device, B, T):
    g = torch.Generator().manual_seed(B * 1000 + T)
    nn = random_num_nodes(B, T, generator=g, device=device)
    parents = random_parents(B, T, num_nodes=nn, generator=g, device=device)
    want = specops.build_tree_mask(parents, nn, backend="torch")
    got = specops.build_tree_mask(parents, nn, backend=fast_backend)
    for w, o in zip(want, got):
        assert o.dtype == torch.int32 and torch.equal(o.cpu(), w.cpu())


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(B=st.integers(1, 5), T=st.integers(1, 70), seed=st.integers(0, 2**31 - 1), chain=st.booleans())
def test_property_all_backends_agree_and_masks_are_ancestor_closures(B, T, seed, chain, device):
    g = torch.Generator().manual_seed(seed)
    nn = random_num_nodes(B, T, generator=g, device=device)
    parents = random_parents(B, T, num_nodes=nn, generator=g, device=device, max_children=1 if chain else None)
    want_mask, want_depth = specops.build_tree_mask(parents, nn, backend="torch")
    vis = specops.unpack_mask(want_mask, T).cpu()
    p, n = parents.cpu(), nn.cpu()
    for b in range(B):
        for i in range(T):
            # closure property: row i = row parent(i) + {i}; depth = depth(parent) + 1
            if 0 < i < n[b]:
                assert torch.equal(vis[b, i], vis[b, p[b, i]] | (torch.arange(T) == i))
                assert want_depth[b, i] == want_depth[b, p[b, i]] + 1
            else:
                assert vis[b, i].nonzero().flatten().tolist() == [i] and want_depth[b, i] == 0
    for name in _backend.BACKENDS[1:]:
        if _backend.available(name, device)[0]:
            got = specops.build_tree_mask(parents, nn, backend=name)
            assert torch.equal(got[0], want_mask) and torch.equal(got[1], want_depth), name


def test_pack_unpack_round_trip():
    vis = torch.rand(3, 7, 70) < 0.5
    packed = specops.pack_mask(vis)
    assert packed.shape == (3, 7, 3) and packed.dtype == torch.int32
    assert torch.equal(specops.unpack_mask(packed, 70), vis)


# ---- dispatch ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name, exc, match", [
    ("tpu", ValueError, "backend= must name one of"),
    ("cuda", specops.BackendUnavailable, "backend 'cuda' .*unavailable on cpu: ")])
def test_unknown_or_unavailable_backend_raises_saying_why(name, exc, match):
    with pytest.raises(exc, match=match):
        specops.build_tree_mask(i32([[-1]]), backend=name)


def test_precedence_argument_then_context_then_env(monkeypatch):
    calls = []
    impls = _backend._IMPLS["build_tree_mask"]
    for name in ("torch", "cpp"):
        fn = impls[name]
        monkeypatch.setitem(impls, name, lambda *a, _n=name, _f=fn: calls.append(_n) or _f(*a))
    parents = i32([[-1, 0]])
    monkeypatch.setenv("SPECOPS_BACKEND", "torch")
    specops.build_tree_mask(parents)
    if _backend.available("cpp")[0]:
        with specops.use_backend("cpp"):
            specops.build_tree_mask(parents)
            specops.build_tree_mask(parents, backend="torch")
        monkeypatch.delenv("SPECOPS_BACKEND")
        specops.build_tree_mask(parents)  # CPU preference: cpp first
        assert calls == ["torch", "cpp", "torch", "cpp"]
    else:
        assert calls == ["torch"]


# ---- registration -----------------------------------------------------------------------------

@needs_cpp
@pytest.mark.parametrize("B,T", [(1, 1), (3, 33), (2, 70)])
def test_opcheck(B, T):
    g = torch.Generator().manual_seed(T)
    nn = random_num_nodes(B, T, generator=g)
    torch.library.opcheck(torch.ops.specops.build_tree_mask.default, (random_parents(B, T, num_nodes=nn, generator=g), nn))


@needs_cpp
def test_torch_compile_fullgraph():
    parents = random_parents(3, 40, generator=torch.Generator().manual_seed(1))
    nn = torch.tensor([40, 7, 1], dtype=torch.int32)

    def f(p, n):
        mask, depth = specops.build_tree_mask(p, n, check=False, backend="cpp")
        return mask, depth + 1

    got = torch.compile(f, fullgraph=True)(parents, nn)
    want = specops.build_tree_mask(parents, nn, backend="torch")
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1] + 1)
