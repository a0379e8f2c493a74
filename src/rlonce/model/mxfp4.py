"""MXFP4 quantize-dequantize of mixture-of-experts weights, so the trainer computes what an MXFP4
rollout computes.

MiMo-V2.6 sends its experts through quantize-dequantize after every parameter update to match the
MXFP4 kernels its rollouts run. Here the rollout engine replaces each expert weight by its
quantize-dequantize after every weight load (``quantize_experts_``), and the trainer, with
alignment on, runs every experts module's forward on the quantize-dequantize of its weights with a
straight-through gradient (``align``): the forward is the rollout's function, the optimizer keeps
updating the full-precision weights, and parameter names and state_dict keys do not change.

**The format** (OCP Microscaling Formats (MX) v1.0, MXFP4). Blocks of 32 consecutive elements along
the contraction dimension share one E8M0 scale X = 2^e, e an integer in [-127, 127]; each element
is FP4 E2M1, magnitudes {0, 0.5, 1, 1.5, 2, 3, 4, 6}. Conversion (spec section 6.3):
e = floor(log2(max |x| in the block)) - 2 (2: the exponent of 4, the largest power of two E2M1
holds), clamped to [-127, 127]; each x/X is rounded to the nearest E2M1 value, ties to even (the
value whose mantissa bit is 0), and anything beyond 6 saturates to ±6; the dequantized value is
that E2M1 value times X. A block of zeros stays zeros (its scale is 2^-127); a block holding a NaN
or an infinity becomes all NaN (the spec's NaN scale, 0xFF). A dimension that is not a multiple of
32 ends in a shorter block, as if zero-padded.

What was checked against: torchao's ``to_mx`` (``ScaleCalculationMode.FLOOR``, which cites
section 6.3: the float32 exponent of amax minus 2, clamped to the E8M0 range) and its float32 to
E2M1 cast ``f32_to_f4_unpacked`` (round to nearest even, values beyond the largest clamped); the
same cast is PTX's ``cvt.rn.satfinite.e2m1x2.f32``. microsoft/microxcaling's ``_quantize_mx``
computes the same scale (``floor(log2(amax)) - emax``) but its default ``round="nearest"`` breaks
ties away from zero (0.25 -> 0.5, 2.5 -> 3, 5 -> 6); its ``round="even"`` is what this module does.

**Scale rule of rollout kernels.** Kernels that quantize bf16 weights themselves may pick the
scale differently: triton_kernels' ``downcast_to_mxfp`` (vLLM's MXFP4 MoE path) and NVIDIA's
RCEIL both round amax/6 up to a power of two, which on full-precision weights can pick a scale
twice the one above. The output of ``qdq`` is a fixed point of that rule too: its block maximum is
4·X or 6·X, and 2^ceil(log2(4X/6)) = 2^ceil(log2(6X/6)) = X, so an engine that re-quantizes the
weights it was sent reproduces them exactly.

**Which tensors.** Expert weights are the 3-D parameters of a module whose class name ends in
``Experts`` (transformers 5's fused experts: ``gate_up_proj`` (E, 2I, H), ``down_proj`` (E, H, I))
and the ``nn.Linear`` weights inside an ``experts`` ``nn.ModuleList`` (the older layout). Routers,
shared experts, attention, norms, embeddings and biases stay full precision, as in MXFP4 MoE
checkpoints and kernels. Blocks run along the last dimension, the input (contraction) dimension of
a weight stored (out, in); experts modules that transformers marks ``is_transposed`` (gpt-oss's
(E, H, 2I) ``gate_up_proj``) store (in, out), and their blocks run along dimension -2, as in the
gpt-oss MXFP4 checkpoints.
"""

from __future__ import annotations

import types

import torch

BLOCK = 32
"""Elements sharing one scale (the spec's k for MXFP4)."""

E2M1_EMAX = 2
"""Exponent of the largest power of two E2M1 holds (4): the spec's emax_elem."""

E2M1_MAX = 6.0
"""Largest E2M1 magnitude; anything beyond saturates to it."""

SCALE_EMAX = 127
"""E8M0 exponents run over [-127, 127] (0xFF is NaN)."""

_ALIGNED = "_rlonce_mxfp4_aligned"
"""Instance attribute of an aligned module: (parameter names, block axis, the forward it replaced
if that was an instance attribute, else None)."""


def _pow2(e: torch.Tensor) -> torch.Tensor:
    """2^e in float32 for integer e in [-127, 127], built from its bits (what decoding an E8M0
    byte is): exact, including 2^-127, which is a float32 subnormal."""
    e = e.to(torch.int32)
    bits = torch.where(e > -127, (e + 127) << 23, torch.full_like(e, 1 << 22))
    return bits.view(torch.float32)


def _round_e2m1(y: torch.Tensor) -> torch.Tensor:
    """Round float32 values to E2M1, to nearest with ties to even, saturating at ±6. E2M1's spacing
    is 0.5 below 2, 1 in [2, 4) and 2 from 4 on; within each range the multiple of the spacing is
    even exactly when the mantissa bit is 0, so ``torch.round`` (half to even) of y/spacing is the
    cast's rounding, boundary ties included (1.75 -> 2, 3.5 -> 4, 7 -> 8 -> 6)."""
    a = y.abs()
    step = torch.where(a < 2, 0.5, torch.where(a < 4, 1.0, 2.0))
    q = (torch.round(a / step) * step).clamp(max=E2M1_MAX)
    return torch.copysign(q, y)


def qdq(w: torch.Tensor, axis: int = -1) -> torch.Tensor:
    """MXFP4 quantize-dequantize of ``w`` (float32 or bfloat16), blocks of 32 along ``axis``: a new
    tensor of ``w``'s shape and dtype, computed in float32, detached from autograd (``ste_qdq`` is
    the differentiable one). Every step is exact in float32 (power-of-two scalings of values with
    at most two significant bits), and the result is exact in bfloat16 too."""
    if w.dtype not in (torch.float32, torch.bfloat16):
        raise TypeError(f"MXFP4 quantize-dequantize takes float32 or bfloat16, got {w.dtype}")
    x = w.detach().to(torch.float32).movedim(axis, -1)
    n = x.shape[-1]
    pad = -n % BLOCK
    if pad:
        x = torch.nn.functional.pad(x, (0, pad))
    x = x.reshape(*x.shape[:-1], -1, BLOCK)
    amax = x.abs().amax(dim=-1, keepdim=True)
    # frexp: amax = m · 2^p with m in [0.5, 1), so floor(log2 amax) = p - 1, exactly (a float32
    # log2 can round 4 - ulp up to 2.0).
    _, p = torch.frexp(amax)
    e = torch.where(amax > 0, p - 1 - E2M1_EMAX, -SCALE_EMAX).clamp(-SCALE_EMAX, SCALE_EMAX)
    out = _round_e2m1(x * _pow2(-e)) * _pow2(e)
    out = torch.where(torch.isfinite(amax), out, torch.nan)
    out = out.reshape(*out.shape[:-2], -1)[..., :n].movedim(-1, axis)
    return out.to(w.dtype).contiguous()


class STEQdq(torch.autograd.Function):
    """Forward ``qdq``, backward the identity: the gradient a weight's quantize-dequantize receives
    goes unchanged to the full-precision weight. A Function rather than ``w + (qdq(w) - w).detach()``
    because that sum is not exactly ``qdq(w)`` in floating point."""

    @staticmethod
    def forward(ctx, w: torch.Tensor, axis: int) -> torch.Tensor:
        return qdq(w, axis)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None


def ste_qdq(w: torch.Tensor, axis: int = -1) -> torch.Tensor:
    """``qdq(w, axis)`` with a straight-through gradient."""
    return STEQdq.apply(w, axis)


def _axis(module: torch.nn.Module) -> int:
    """The contraction dimension of ``module``'s expert weights (see the module docstring)."""
    return -2 if getattr(module, "is_transposed", False) else -1


def expert_weights(model: torch.nn.Module) -> list[tuple[torch.nn.Module, str]]:
    """The expert weights of ``model`` as (owning module, parameter name) pairs, in module order:
    the 3-D parameters of ``*Experts`` modules and the ``nn.Linear`` weights inside an ``experts``
    ``nn.ModuleList`` (peft's ``lora_*`` factors in there excepted). Empty for a dense model."""
    found: list[tuple[torch.nn.Module, str]] = []
    seen: set[int] = set()

    def add(module: torch.nn.Module, name: str) -> None:
        p = module._parameters[name]
        if id(p) not in seen:
            seen.add(id(p))
            found.append((module, name))

    for qualified, module in model.named_modules():
        if type(module).__name__.endswith("Experts"):
            for name, p in module.named_parameters(recurse=False):
                if p.dim() == 3:
                    add(module, name)
        if isinstance(module, torch.nn.ModuleList) and (
            qualified.rpartition(".")[2] == "experts" or type(module).__name__.endswith("Experts")
        ):
            for sub_name, sub in module.named_modules():
                lora = any(part.startswith("lora_") for part in sub_name.split("."))
                if isinstance(sub, torch.nn.Linear) and not lora:
                    add(sub, "weight")
    return found


def quantize_experts_(model: torch.nn.Module) -> int:
    """Replace every expert weight of ``model`` in place by its quantize-dequantize (the engine,
    after each weight load); how many tensors. Idempotent: ``qdq`` of its output is itself."""
    pairs = expert_weights(model)
    with torch.no_grad():
        for module, name in pairs:
            p = module._parameters[name]
            p.copy_(qdq(p, _axis(module)))
    return len(pairs)


def _aligned_forward(self: torch.nn.Module, *args, **kwargs):
    """An aligned module's forward: its original forward with each expert parameter swapped for
    ``ste_qdq`` of it for the duration of the call. The swap is what ``torch.func.functional_call``
    does (``_parameters[name] = tensor``, restored afterwards), done here around the original
    forward directly so that the module is called once and its hooks run once."""
    names, axis, replaced = self.__dict__[_ALIGNED]
    inner = replaced if replaced is not None else type(self).forward.__get__(self, type(self))
    params = self._parameters
    full = {name: params[name] for name in names}
    try:
        for name, p in full.items():
            params[name] = ste_qdq(p, axis)
        return inner(*args, **kwargs)
    finally:
        params.update(full)


def align(model: torch.nn.Module) -> int:
    """Make the forward of every module owning expert weights (an ``*Experts`` module, or each
    expert ``nn.Linear`` in the older layout) run on ``ste_qdq`` of those weights. Parameters,
    their names and the state_dict are untouched. Idempotent; ``unalign`` undoes it. Returns how
    many modules are aligned afterwards. A ``copy.deepcopy`` of an aligned model is aligned to its
    own parameters (the forward is a method bound to its module)."""
    owners: dict[int, tuple[torch.nn.Module, list[str]]] = {}
    for module, name in expert_weights(model):
        owners.setdefault(id(module), (module, []))[1].append(name)
    for module, names in owners.values():
        if _ALIGNED in module.__dict__:
            continue
        module.__dict__[_ALIGNED] = (tuple(names), _axis(module), module.__dict__.get("forward"))
        module.forward = types.MethodType(_aligned_forward, module)
    return len(owners)


def unalign(model: torch.nn.Module) -> int:
    """Undo ``align``: every aligned module of ``model`` gets back the forward it had. Returns how
    many modules were unaligned."""
    n = 0
    for module in model.modules():
        state = module.__dict__.pop(_ALIGNED, None)
        if state is None:
            continue
        replaced = state[2]
        if replaced is None:
            del module.__dict__["forward"]
        else:
            module.__dict__["forward"] = replaced
        n += 1
    return n
