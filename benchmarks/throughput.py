"""Work and peak: the FLOPs of one engine step or training step, and the bf16 peak of known GPUs, for TFLOP/s next to item-steps/s."""
from __future__ import annotations

import re

import torch
from torch.utils.flop_counter import FlopCounterMode

from invert.modules import evaluation, kept_training_flags

# Dense bf16 tensor-core peaks (TFLOP/s, no sparsity) from NVIDIA's data sheets, matched against
# torch.cuda.get_device_name() in this order (more specific names first).
BF16_PEAK_TFLOPS: tuple[tuple[str, float], ...] = (
    ("GH200", 989.0),
    ("H200 NVL", 835.0),
    ("H200", 989.0),  # SXM (reported as "NVIDIA H200")
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.0),
    ("H100", 989.0),  # SXM (reported as "NVIDIA H100 80GB HBM3")
    ("A100", 312.0),
    ("L40S", 362.0),
    ("L40", 181.0),
    ("L4", 121.0),
    ("A10", 125.0),
)


def bf16_peak_tflops(device: torch.device) -> float | None:
    """The dense bf16 peak of ``device``'s GPU, or None (a CPU, or a GPU missing from the table)."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    return peak_of_gpu(torch.cuda.get_device_name(device))


def peak_of_gpu(name: str) -> float | None:
    """The dense bf16 peak of the GPU that ``torch.cuda.get_device_name`` calls ``name``, or None if it is not in the table."""
    # whole words: "A10" in "NVIDIA RTX A1000" took the A100's peak by substring
    return next((peak for key, peak in BF16_PEAK_TFLOPS if re.search(rf"(?<![A-Za-z0-9]){re.escape(key)}(?![A-Za-z0-9])", name)), None)


def flops_per_item_step(objective: torch.nn.Module, images: torch.Tensor, items: torch.Tensor | None = None) -> float:
    """FLOPs of one engine step per item: the objective's forward and the backward to the input (weights frozen, as
    the engine runs it), counted by ``torch.utils.flop_counter.FlopCounterMode`` (matmuls and convolutions) on
    ``images`` (the objective's ``items``) and divided by their number. Elementwise work (the update, the clamp, the bookkeeping) is not counted."""
    with evaluation(objective, freeze_parameters=True), FlopCounterMode(display=False) as counter, torch.enable_grad():
        x = images.detach().clone().requires_grad_(True)
        objective(x, items).sum().backward()  # FlopCounterMode counts .backward() (not autograd.grad)
    return counter.get_total_flops() / images.shape[0]


def flops_per_training_image(model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor, attack_steps: int) -> float:
    """FLOPs of one adversarial-training step per image, counted by ``FlopCounterMode`` on ``images`` and ``labels``:
    ``attack_steps`` times the attack's forward and backward to the input (batch norm folded, as
    :func:`training.attacks.attack_mode` runs it; weights frozen, as ``torch.autograd.grad`` to the input computes no
    weight gradients), plus the training forward and its backward to the weights. ``attack_steps=0`` is standard
    training. The update (SGD, projection, clamp) is elementwise and not counted, as in :func:`flops_per_item_step`.

    One attack step is counted and multiplied: the counter cannot follow ``torch.autograd.grad``, which the attack
    uses. ``model`` comes back with its modes, gradients and batch-norm statistics as they were.
    """
    from training.attacks import attack_mode

    snapshot = {name: tensor.clone() for name, tensor in model.state_dict().items()}  # train-mode BN updates its statistics
    attack = 0.0
    if attack_steps:
        with attack_mode(model, "eval") as target, evaluation(target, freeze_parameters=True), FlopCounterMode(display=False) as counter, \
                torch.enable_grad():
            x = images.detach().clone().requires_grad_(True)
            torch.nn.functional.cross_entropy(target(x), labels).backward()
        attack = attack_steps * counter.get_total_flops()
    grads = {p: p.grad for p in model.parameters()}
    with kept_training_flags(model), FlopCounterMode(display=False) as counter, torch.enable_grad():
        model.train()
        torch.nn.functional.cross_entropy(model(images.detach()), labels).backward()
    for parameter, grad in grads.items():
        parameter.grad = grad
    model.load_state_dict(snapshot)
    return (attack + counter.get_total_flops()) / images.shape[0]


def throughput(item_steps: float, seconds: float, flops_per_step: float, peak_tflops: float | None) -> dict:
    """Item-steps/s, the achieved TFLOP/s and the share of the bf16 peak ("n.a." where the peak is unknown)."""
    tflops = item_steps * flops_per_step / seconds / 1e12
    return {
        "item_steps_per_s": item_steps / seconds,
        "tflops": tflops,
        "fraction_of_bf16_peak": tflops / peak_tflops if peak_tflops else "n.a.",
    }
