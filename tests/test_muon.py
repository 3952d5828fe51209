"""Muon's batched step (seq2seq/training/muon.py): in fp32 it is a plain float64 reference of
torch.optim.Muon's documented algorithm, one matrix at a time, for each coefficient schedule and
iteration count; a state torch's Muon saved carries on; its settings are bounded and checked;
auto precision follows the hardware. (Against torch's Muon itself: tests/test_optim.py.)"""

from __future__ import annotations

import io
import math

import pytest
import torch

from seq2seq.hparams import TrainingConfig
from seq2seq.training import muon as muon_module
from seq2seq.training.muon import JORDAN, POLAR_EXPRESS, Muon, orthogonalise

# Square, wide and tall matrices, several of a shape (one batched product) and a tall one whose
# transpose joins the wide ones' batch.
SHAPES = [(16, 16), (16, 16), (16, 16), (16, 48), (48, 16), (16, 48), (24, 8)]


def reference_step(params, grads, buffers, lr, decay, coefficients, norm_factor) -> None:
    """torch.optim.Muon's algorithm (its docstring) in float64, one matrix at a time:
    B <- mu B + (1 - mu) g (as lerp); Nesterov g + mu (B - g); Newton-Schulz on the wide
    orientation with the norm scaled by norm_factor; decoupled decay; lr 0.2 sqrt(max dim)."""
    for p, g, b in zip(params, grads, buffers, strict=True):
        b.mul_(0.95).add_(g, alpha=0.05)
        x = g + 0.95 * (b - g)
        tall = x.shape[0] > x.shape[1]
        x = x.T if tall else x
        x = x / max(x.norm().item() * norm_factor, 1e-7)
        for a, b_, c in coefficients:
            gram = x @ x.T
            x = a * x + (b_ * gram + c * gram @ gram) @ x
        x = x.T if tall else x
        p.mul_(1 - lr * decay)
        p.sub_(lr * 0.2 * math.sqrt(max(p.shape)) * x)


@pytest.mark.parametrize(
    "coefficients,steps", [("jordan", 5), ("jordan", 3), ("polar_express", 5), ("polar_express", 3)]
)
def test_the_batched_fp32_step_is_the_reference_one_matrix_at_a_time(
    coefficients: str, steps: int
) -> None:
    torch.manual_seed(0)
    start = [torch.randn(s) * 0.1 for s in SHAPES]
    params = [torch.nn.Parameter(t.clone()) for t in start]
    optimizer = Muon(params, lr=0.02, weight_decay=0.1, steps=steps,
                     coefficients=coefficients, precision="fp32")  # fmt: skip
    reference = [t.double() for t in start]
    buffers = [torch.zeros_like(t) for t in reference]
    table = [JORDAN] * steps if coefficients == "jordan" else POLAR_EXPRESS[:steps]
    factor = 1.02 if coefficients == "polar_express" else 1.0
    for _ in range(3):  # momentum builds up over the steps
        grads = [torch.randn(s) for s in SHAPES]
        for p, g in zip(params, grads, strict=True):
            p.grad = g.clone()
        optimizer.step()
        reference_step(reference, [g.double() for g in grads], buffers, 0.02, 0.1, table, factor)
    for p, r, s in zip(params, reference, start, strict=True):
        moved, expected = p.detach().double() - s.double(), r - s.double()
        assert (moved - expected).norm() / expected.norm() < 1e-4, tuple(p.shape)


def test_the_orthogonalisation_brings_singular_values_towards_one() -> None:
    """Its purpose, on a gradient-like spectrum (1 down to 1e-3): five of Jordan's iterations
    leave every singular value within (0, 1.25) (his "about Uniform(0.5, 1.5)" where the spectrum
    allows), Polar Express's five put the median within 5% of 1, closer than Jordan's."""
    torch.manual_seed(0)
    u, _, v = torch.linalg.svd(torch.randn(4, 32, 96), full_matrices=False)
    stack = u @ torch.diag_embed(torch.logspace(0, -3, 32).expand(4, 32)) @ v
    jordan = torch.linalg.svdvals(orthogonalise(stack, [JORDAN] * 5, 1.0, torch.float32))
    polar = torch.linalg.svdvals(orthogonalise(stack, POLAR_EXPRESS, 1.02, torch.float32))
    assert jordan.min() > 0 and jordan.max() < 1.25
    assert abs(polar.median() - 1) < 0.05 and abs(polar.median() - 1) < abs(jordan.median() - 1)
    assert polar.max() < 1.2


def test_a_state_torchs_muon_saved_carries_on_as_torchs_muon() -> None:
    """A run saved with optimizer=muon before this optimizer (torch.optim.Muon's state): it
    loads, reads as torch computed (5 of Jordan's iterations in bf16), and steps on as torch's
    Muon would, within bf16's rounding."""
    torch.manual_seed(0)
    theirs = [torch.nn.Parameter(torch.randn(s) * 0.1) for s in SHAPES]
    ours = [torch.nn.Parameter(p.detach().clone()) for p in theirs]
    torch_muon = torch.optim.Muon(theirs, lr=0.02, weight_decay=0.1, adjust_lr_fn="match_rms_adamw")
    grads = [[torch.randn(s) for s in SHAPES] for _ in range(3)]
    for step in grads[:2]:
        for p, g in zip(theirs, step, strict=True):
            p.grad = g
        torch_muon.step()
    for p, q in zip(ours, theirs, strict=True):
        p.data.copy_(q.data)
    loaded = Muon(ours, lr=0.02, weight_decay=0.1, precision="fp32", steps=3)
    saved = io.BytesIO()  # through a file, as a checkpoint holds it (not torch's live buffers)
    torch.save(torch_muon.state_dict(), saved)
    saved.seek(0)
    loaded.load_state_dict(torch.load(saved))
    group = loaded.param_groups[0]
    assert (group["steps"], group["coefficients"], group["precision"]) == (5, "jordan", "bf16")
    before = [q.detach().clone() for q in theirs]
    for p, q, g in zip(ours, theirs, grads[2], strict=True):
        p.grad, q.grad = g.clone(), g.clone()
    loaded.step()
    torch_muon.step()
    for p, q, b in zip(ours, theirs, before, strict=True):
        assert ((p - b) - (q - b)).norm() / (q - b).norm() < 1e-2


def test_the_muon_settings_are_bounded_and_checked_before_the_run() -> None:
    for bad, named in [
        (
            {"muon_steps": 6, "muon_coefficients": "polar_express"},
            "muon_steps=6 is more than the 5",
        ),
        ({"muon_steps": 11}, "muon_steps=11 is more than the 10"),
        ({"muon_steps": 0}, "muon_steps must be a positive integer, got 0"),
        ({"muon_precision": "fp16"}, "muon_precision must be one of"),
        ({"muon_coefficients": "newton"}, "muon_coefficients must be one of"),
    ]:
        with pytest.raises(ValueError, match=named) as refused:
            TrainingConfig(**bad)
        assert "\n" not in str(refused.value)
    with pytest.raises(ValueError, match="steps with polar_express must be 1 to 5"):
        Muon([torch.nn.Parameter(torch.zeros(2, 2))], lr=0.1, weight_decay=0, steps=6,
             coefficients="polar_express")  # fmt: skip


def test_auto_precision_is_bf16_only_where_the_hardware_multiplies_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cpu = torch.device("cpu")
    assert muon_module.dtype_for("fp32", cpu) == torch.float32
    assert muon_module.dtype_for("bf16", cpu) == torch.bfloat16
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    assert muon_module.dtype_for("auto", cpu) == torch.bfloat16
    # The same machine with torch's kernels held at AVX2 (ATEN_CPU_CAPABILITY=avx2), or an AVX2
    # CPU: bf16 products are emulated there, several times slower than fp32.
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    assert muon_module.dtype_for("auto", cpu) == torch.float32
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    assert muon_module.dtype_for("auto", cpu) == torch.float32  # AVX-512 without BF16
