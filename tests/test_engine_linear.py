"""The engine's use of specops.linear: a ModelRunner routes a bf16/fp16 CPU model's nn.Linear layers
through the op while it lives ("auto"), leaves fp32 models to torch unless asked, and close() (and
generate's end) restores the model's own forwards."""
import pytest
import torch
from _op_checks import needs_cpp
from test_transformers_integration import tiny_model

import specops
from specops.draft_models import SubsetLMHead
from specops.engine import ModelRunner
from specops.engine.linear import SpecopsLinear, packs, use_specops_linear
from specops.ops.linear import pack_weight, packing_pays

pytestmark = needs_cpp
IDS = torch.tensor([[5, 7, 11, 13]])


def tiny(dtype):
    return tiny_model("llama", dtype=dtype)


def routed(model):
    """Per nn.Linear of ``model``: whether its class is swapped for the routing subclass."""
    return [isinstance(m, SpecopsLinear) for m in model.modules() if isinstance(m, torch.nn.Linear)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_auto_routes_16_bit_models_and_close_restores(dtype):
    model = tiny(dtype)
    runner = ModelRunner(model, batch_size=1, max_len=32)
    assert routed(model) and all(routed(model))
    x = torch.randn(3, 5, 64).to(dtype)
    q = model.model.layers[0].self_attn.q_proj
    for rows in (x, x[:1, :1]):  # a block, and an AR step's one row: both through the op
        assert torch.equal(q(rows), specops.linear(rows, q.weight, q.bias, backend="cpp"))
    runner.close()
    assert not any(routed(model))
    assert torch.equal(q(x), torch.nn.functional.linear(x, q.weight, q.bias))


def test_fp32_stays_with_torch_unless_asked():
    model = tiny(torch.float32)
    ModelRunner(model, batch_size=1, max_len=32).close()
    assert not any(routed(model))
    runner = ModelRunner(model, batch_size=1, max_len=32, linear="specops")
    assert all(routed(model))
    q, one = model.model.layers[0].self_attn.q_proj, torch.randn(1, 1, 64)
    assert torch.equal(q(one), specops.linear(one, q.weight, q.bias, backend="cpp"))  # every row
    runner.close()
    off = ModelRunner(tiny(torch.bfloat16), batch_size=1, max_len=32, linear="torch")
    assert not any(routed(off.model))
    with pytest.raises(ValueError, match="linear must be one of"):
        ModelRunner(model, batch_size=1, max_len=32, linear="fast")


def test_generate_leaves_the_model_as_it_found_it():
    model = tiny(torch.bfloat16)
    out, _ = specops.generate(model, IDS, method="ngram", max_new_tokens=6)
    assert out.shape == (1, 6) and not any(routed(model))


def test_a_second_patch_of_a_routed_model_changes_nothing():
    model = tiny(torch.bfloat16)
    undo = use_specops_linear(model)
    undo_again = use_specops_linear(model)  # e.g. a draft runner sharing the target
    undo_again()
    assert all(routed(model))
    undo()
    assert not any(routed(model))


@pytest.mark.parametrize("pack", ["1", "0"])
def test_bf16_linears_read_packed_copies_where_the_machine_takes_them(pack, monkeypatch):
    """With AVX-512 (and SPECOPS_LINEAR_PACK not 0) a routed bf16 linear carries the packed copy of
    its weight, made once while the weight is unchanged; the tokens are the plain weights' tokens."""
    monkeypatch.setenv("SPECOPS_LINEAR_PACK", pack)
    model = tiny(torch.bfloat16)
    want = pack == "1" and torch.backends.cpu.get_cpu_capability() == "AVX512"
    assert packs(model) == want
    q = model.model.layers[0].self_attn.q_proj
    undo = use_specops_linear(model)
    first = q.specops_packed
    assert (first is not None) == want
    undo()
    assert not hasattr(q, "specops_packed")
    if want:
        assert torch.equal(first, pack_weight(q.weight))
        undo = use_specops_linear(model)
        assert q.specops_packed is first  # kept while the weight is unchanged
        undo()
        with torch.no_grad():
            q.weight.add_(1)
        undo = use_specops_linear(model)
        assert q.specops_packed is not first and torch.equal(q.specops_packed, pack_weight(q.weight))
        undo()
    a, _ = specops.generate(model, IDS, method="ar", max_new_tokens=6)
    monkeypatch.setenv("SPECOPS_LINEAR_PACK", "0")
    b, _ = specops.generate(model, IDS, method="ar", max_new_tokens=6)
    assert torch.equal(a, b)


def test_a_model_built_under_inference_mode_decodes_as_one_built_outside():
    # Its weights are inference tensors (no version counter): a draft path given to generate inside
    # torch.inference_mode() is loaded that way.
    want, _ = specops.generate(tiny(torch.bfloat16), IDS, method="ar", max_new_tokens=6)
    with torch.inference_mode():
        model = tiny(torch.bfloat16)
        assert model.model.layers[0].self_attn.q_proj.weight.is_inference()
        got, _ = specops.generate(model, IDS, method="ar", max_new_tokens=6)
    assert torch.equal(got, want)


def test_mixed_precision_input_falls_back_to_torch():
    model = tiny(torch.bfloat16)
    undo = use_specops_linear(model)
    q = model.model.layers[0].self_attn.q_proj
    x = torch.randn(2, 64)  # fp32 input into a bf16 layer: torch's rules (here an error, as without us)
    with pytest.raises(RuntimeError):
        torch.nn.functional.linear(x, q.weight)
    with pytest.raises(RuntimeError):
        q(x)
    undo()


def test_generate_takes_the_choice_and_checks_it():
    model = tiny(torch.bfloat16)
    a, _ = specops.generate(model, IDS, method="ar", max_new_tokens=5, linear="specops")
    b, _ = specops.generate(model, IDS, method="ar", max_new_tokens=5, linear="torch")
    assert a.shape == b.shape == (1, 5)
    with pytest.raises(ValueError, match="linear must be one of"):
        specops.generate(model, IDS, method="ar", max_new_tokens=5, linear="fast")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("pack", ["1", "0"])
def test_draft_head_reads_its_rows_through_the_op_at_inference(dtype, pack, monkeypatch):
    """A draft's subset-vocabulary head: 16-bit CPU inference goes through specops.linear (its own
    packed copy where packing pays, the same bits); training (grad) and fp32 keep torch's linear."""
    monkeypatch.setenv("SPECOPS_LINEAR_PACK", pack)
    torch.manual_seed(1)
    emb = torch.randn(97, 64).to(dtype)
    head = SubsetLMHead(emb, torch.tensor([3, 0, 41, 96, 7])).eval()
    h = torch.randn(2, 3, 64).to(dtype)
    sub = emb[[3, 0, 41, 96, 7]]
    with torch.no_grad():
        got = head(h)  # [2, 3, 97]: -inf outside keep
        want = (specops.linear(h, sub, backend="cpp") if dtype != torch.float32
                else torch.nn.functional.linear(h, sub))
        assert torch.equal(got[..., [3, 0, 41, 96, 7]], want)
        assert torch.isinf(got[..., 1]).all() and (got[..., 1] < 0).all()
        assert (head._packed is not None) == (dtype == torch.bfloat16 and pack == "1" and packing_pays())
    hg = h.clone().requires_grad_()  # training: torch's linear, so the gradient reaches the features
    head.sub_logits(hg).float().sum().backward()
    assert hg.grad is not None and hg.grad.shape == h.shape
