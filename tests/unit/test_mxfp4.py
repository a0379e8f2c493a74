"""MXFP4 quantize-dequantize (rlonce.model.mxfp4): blocks worked by hand against the OCP MX v1.0
conversion (scale 2^(floor(log2 amax) - 2), E2M1 round to nearest even, saturation at 6), and
alignment of a tiny Qwen3-MoE's experts with a copy whose experts were quantized in place."""

import copy
import math

import torch
import transformers

from rlonce.model import mxfp4
from rlonce.model.mxfp4 import align, expert_weights, qdq, quantize_experts_, ste_qdq, unalign

E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def test_block_worked_by_hand_scale_one():
    # amax = 5.0 (|-5.0|): floor(log2 5) = 2, shared_exp = 2 - 2 = 0, X = 1, so each x rounds to
    # the nearest of 0, 0.5, 1, 1.5, 2, 3, 4, 6; a tie goes to the value whose mantissa bit is 0
    # (0, 1, 2, 4 have it 0; 0.5, 1.5, 3, 6 have it 1).
    pairs = [
        (0.2, 0.0),  # 0.2 from 0, 0.3 from 0.5
        (0.25, 0.0),  # tie 0 / 0.5 -> 0
        (0.3, 0.5),  # 0.3 from 0, 0.2 from 0.5
        (0.75, 1.0),  # tie 0.5 / 1 -> 1
        (1.25, 1.0),  # tie 1 / 1.5 -> 1
        (1.3, 1.5),  # 0.3 from 1, 0.2 from 1.5
        (1.75, 2.0),  # tie 1.5 / 2 -> 2
        (2.4, 2.0),
        (2.5, 2.0),  # tie 2 / 3 -> 2
        (2.6, 3.0),
        (3.5, 4.0),  # tie 3 / 4 -> 4
        (4.9, 4.0),  # 0.9 from 4, 1.1 from 6
        (5.0, 4.0),  # tie 4 / 6 -> 4
        (5.1, 6.0),
        (-0.75, -1.0),  # the sign is kept, the magnitude rounds as above
        (-2.5, -2.0),
        (-5.0, -4.0),
        (1.5, 1.5),  # representable values are kept
        (3.0, 3.0),
        (0.0, 0.0),
    ]
    pairs += [(0.0, 0.0)] * (32 - len(pairs))
    x = torch.tensor([a for a, _ in pairs])
    assert torch.equal(qdq(x), torch.tensor([b for _, b in pairs]))


def test_block_with_small_amax():
    # amax = 0.3: 0.25 <= 0.3 < 0.5, floor(log2 0.3) = -2, shared_exp = -2 - 2 = -4, X = 1/16.
    x = torch.tensor([0.3, 0.1, 0.2, 0.15625, 0.01, -0.15])
    expected = torch.tensor([
        4 / 16,  # 0.3 · 16 = 4.8 -> 4 (0.8 from 4, 1.2 from 6) -> 0.25
        1.5 / 16,  # 1.6 -> 1.5 -> 0.09375
        3 / 16,  # 3.2 -> 3 -> 0.1875
        2 / 16,  # 2.5: tie 2 / 3 -> 2 -> 0.125
        0.0,  # 0.16 -> 0
        -2 / 16,  # -2.4 -> -2 -> -0.125
    ])
    assert torch.equal(qdq(x), expected)


def test_saturation_beyond_six():
    # amax = 7: floor(log2 7) = 2, shared_exp = 0, X = 1; 7 (a tie 6 / 8, and 8 is past E2M1's
    # range), 6.9 and 6.5 all saturate to 6.
    assert torch.equal(qdq(torch.tensor([7.0, 6.9, 6.5, -7.0])), torch.tensor([6.0, 6.0, 6.0, -6.0]))
    # amax = 100: floor(log2 100) = 6, shared_exp = 4, X = 16. 100/16 = 6.25 -> 6 -> 96 (the block
    # maximum itself is clipped); 90/16 = 5.625 -> 6 -> 96; 80/16 = 5: tie 4 / 6 -> 4 -> 64;
    # 70/16 = 4.375 -> 4 -> 64; 7/16 = 0.4375 -> 0.5 -> 8.
    x = torch.tensor([100.0, 90.0, 80.0, 70.0, 7.0])
    assert torch.equal(qdq(x), torch.tensor([96.0, 96.0, 64.0, 64.0, 8.0]))


def test_negative_values_mirror_positive_ones():
    w = torch.randn(3, 96, generator=torch.Generator().manual_seed(0))
    assert torch.equal(qdq(-w), -qdq(w))


def test_all_zero_block_and_nan_block():
    assert torch.equal(qdq(torch.zeros(2, 64)), torch.zeros(2, 64))
    # An infinity makes its block's scale NaN (0xFF), hence the whole block; the next block is
    # amax 5, X = 1: 5 -> 4 and 0.75 -> 1 (tie 0.5 / 1).
    x = torch.cat([torch.full((32,), 1.0), torch.tensor([5.0]), torch.full((31,), 0.75)])
    x[3] = math.inf
    out = qdq(x)
    assert out[:32].isnan().all()
    assert torch.equal(out[32:], torch.cat([torch.tensor([4.0]), torch.full((31,), 1.0)]))


def test_blocks_are_32_consecutive_elements_of_the_last_dim():
    # Row: 32 × 0.3, then 5.0 and 31 × 0.3. First block: amax 0.3, X = 1/16, 0.3 -> 0.25 (see
    # above). Second block: amax 5, X = 1, 0.3 -> 0.5.
    row = torch.full((64,), 0.3)
    row[32] = 5.0
    out = qdq(torch.stack([row, -row]))
    expected = torch.cat([torch.full((32,), 0.25), torch.tensor([4.0]), torch.full((31,), 0.5)])
    assert torch.equal(out, torch.stack([expected, -expected]))


def test_last_block_shorter_than_32():
    # 40 elements: a block of 32 with amax 5 (X = 1: 0.3 -> 0.5) and a block of the last 8 with
    # amax 0.3 (X = 1/16: 0.3 -> 0.25, 0.1 -> 1.6 -> 1.5 -> 0.09375). The shape is kept.
    x = torch.full((2, 40), 0.3)
    x[:, 0] = 5.0
    x[:, 39] = 0.1
    out = qdq(x)
    assert out.shape == (2, 40)
    expected = torch.cat([torch.tensor([4.0]), torch.full((31,), 0.5), torch.full((7,), 0.25), torch.tensor([0.09375])])
    assert torch.equal(out, expected.expand(2, 40))


def test_bfloat16_in_bfloat16_out():
    x = torch.tensor([5.0, 0.75, 2.5, 0.3] + [0.0] * 28, dtype=torch.bfloat16)
    out = qdq(x)
    assert out.dtype == torch.bfloat16
    # bf16(0.3) = 0.30078125 -> 0.5 at X = 1; the others as in the worked block.
    assert torch.equal(out[:4].float(), torch.tensor([4.0, 1.0, 2.0, 0.5]))
    assert torch.equal(out.float(), qdq(x.float()))


def test_qdq_is_idempotent_and_lands_on_the_grid():
    g = torch.Generator().manual_seed(1)
    w = torch.randn(4, 8, 100, generator=g) * torch.logspace(-6, 3, 8)[None, :, None]
    q = qdq(w)
    assert torch.equal(qdq(q), q)
    # Every value is an E2M1 magnitude times its block's power of two: x / X in the grid, with
    # X recomputed from the original block by hand's rule.
    blocks = torch.nn.functional.pad(w, (0, 28)).reshape(4, 8, 4, 32)
    X = 2.0 ** (torch.floor(torch.log2(blocks.abs().amax(-1, keepdim=True))) - 2)
    scaled = torch.nn.functional.pad(q, (0, 28)).reshape(4, 8, 4, 32) / X
    assert torch.isin(scaled.abs(), E2M1).all()


def test_qdq_survives_a_round_up_scale_rule():
    # Engines that quantize themselves (triton_kernels' downcast_to_mxfp, NVIDIA's RCEIL) use
    # X' = 2^ceil(log2(amax / 6)). On qdq's output amax is 4X or 6X, so X' = X and every element
    # is already on the grid: re-quantizing changes nothing.
    w = torch.randn(16, 64, generator=torch.Generator().manual_seed(2))
    blocks = qdq(w).reshape(16, 2, 32)
    X_up = 2.0 ** torch.ceil(torch.log2(blocks.abs().amax(-1, keepdim=True) / 6))
    assert torch.isin((blocks / X_up).abs(), E2M1).all()


def test_axis_minus_two_blocks_along_columns():
    w = torch.randn(3, 40, 8, generator=torch.Generator().manual_seed(3))
    assert torch.equal(qdq(w, axis=-2), qdq(w.mT).mT)


def test_ste_forward_is_qdq_and_gradient_is_upstream():
    g = torch.Generator().manual_seed(4)
    for dtype in (torch.float32, torch.bfloat16):
        w = torch.randn(5, 64, generator=g).to(dtype).requires_grad_()
        upstream = torch.randn(5, 64, generator=g).to(dtype)
        y = ste_qdq(w)
        assert torch.equal(y, qdq(w))
        (y * upstream).sum().backward()
        assert w.grad.dtype == dtype
        assert torch.equal(w.grad, upstream)


def _tiny_qwen3_moe():
    torch.manual_seed(0)
    # moe_intermediate_size 48: down_proj's rows (48) end in a 16-element block.
    config = transformers.AutoConfig.for_model(
        "qwen3_moe", vocab_size=64, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=32, intermediate_size=64, moe_intermediate_size=48,
        num_experts=4, num_experts_per_tok=2)
    return transformers.AutoModelForCausalLM.from_config(config).float().eval()


def test_expert_weights_of_qwen3_moe():
    model = _tiny_qwen3_moe()
    names = {m: n for n, m in model.named_modules()}
    found = [f"{names[m]}.{p}" for m, p in expert_weights(model)]
    assert found == [f"model.layers.{i}.mlp.experts.{p}" for i in range(2) for p in ("gate_up_proj", "down_proj")]
    shapes = [tuple(getattr(m, p).shape) for m, p in expert_weights(model)]
    assert shapes == [(4, 96, 64), (4, 64, 48)] * 2
    assert not any(".gate." in f for f in found)


def test_align_matches_quantized_copy_and_unalign_restores():
    model = _tiny_qwen3_moe()
    reference = copy.deepcopy(model)
    assert quantize_experts_(reference) == 4
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(5))
    upstream = torch.randn(2, 12, 64, generator=torch.Generator().manual_seed(6))
    original = model(ids).logits.detach()
    keys = list(model.state_dict())
    full = {n: p.detach().clone() for n, p in model.named_parameters()}

    assert align(model) == 2
    assert align(model) == 2  # wraps once: one unalign below restores the original forward
    aligned = model(ids).logits
    quantized = reference(ids).logits
    assert not torch.allclose(original, quantized, atol=1e-4)  # the quantization is visible
    torch.testing.assert_close(aligned, quantized, rtol=0, atol=1e-6)
    assert list(model.state_dict()) == keys

    (aligned * upstream).sum().backward()
    (quantized * upstream).sum().backward()
    grads = dict(reference.named_parameters())
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, grads[name].grad, rtol=0, atol=1e-6)
        assert torch.equal(p.detach(), full[name])  # the optimizer's weights stay full precision

    assert unalign(model) == 2
    assert unalign(model) == 0
    assert torch.equal(model(ids).logits, original)


class _MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.gate_proj = torch.nn.Linear(32, 40, bias=False)
        self.up_proj = torch.nn.Linear(32, 40, bias=False)
        self.down_proj = torch.nn.Linear(40, 32, bias=False)

    def forward(self, x):
        return self.down_proj(torch.nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class _SparseBlock(torch.nn.Module):
    """The older layout: a router ``gate`` beside an ``experts`` ModuleList of MLPs (dense mixture
    here: every expert runs, weighted by the router's softmax)."""

    def __init__(self):
        super().__init__()
        self.gate = torch.nn.Linear(32, 3, bias=False)
        self.experts = torch.nn.ModuleList(_MLP() for _ in range(3))

    def forward(self, x):
        weights = self.gate(x).softmax(-1)
        return sum(weights[..., e, None] * expert(x) for e, expert in enumerate(self.experts))


def test_module_list_layout():
    torch.manual_seed(7)
    block = _SparseBlock()
    names = {m: n for n, m in block.named_modules()}
    found = [f"{names[m]}.{p}" for m, p in expert_weights(block)]
    assert found == [f"experts.{e}.{p}.weight" for e in range(3) for p in ("gate_proj", "up_proj", "down_proj")]
    reference = copy.deepcopy(block)
    assert quantize_experts_(reference) == 9
    x = torch.randn(4, 32)
    assert align(block) == 9
    out = block(x)
    torch.testing.assert_close(out, reference(x), rtol=0, atol=1e-6)
    out.sum().backward()
    reference(x).sum().backward()
    torch.testing.assert_close(block.experts[1].up_proj.weight.grad, reference.experts[1].up_proj.weight.grad,
                               rtol=0, atol=1e-6)
    assert unalign(block) == 9


def test_dense_model_has_no_expert_weights():
    config = transformers.AutoConfig.for_model(
        "qwen3", vocab_size=64, hidden_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, head_dim=32, intermediate_size=64)
    model = transformers.AutoModelForCausalLM.from_config(config)
    assert expert_weights(model) == []
    assert quantize_experts_(model) == 0
    assert align(model) == 0


def test_transposed_experts_block_along_dim_minus_two():
    # transformers marks gpt-oss-style experts (E, in, out) with is_transposed; their blocks run
    # along the input dimension, dim -2.
    class TransposedExperts(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.is_transposed = True
            self.gate_up_proj = torch.nn.Parameter(torch.randn(2, 40, 6))

    experts = TransposedExperts()
    w = experts.gate_up_proj.detach().clone()
    assert mxfp4._axis(experts) == -2
    assert quantize_experts_(experts) == 1
    assert torch.equal(experts.gate_up_proj.detach(), qdq(w.mT).mT)
