"""Generic MLP builder shared by all algorithms.

Initialisation follows Flax/Brax (what LIFT uses): LeCun-uniform kernels, i.e. U(-sqrt(3/fan_in), sqrt(3/fan_in)),
and zero biases.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

ACTIVATIONS: dict[str, type[nn.Module]] = {
    "swish": nn.SiLU,
    "silu": nn.SiLU,
    "relu": nn.ReLU,
    "tanh": nn.Tanh,
    "elu": nn.ELU,
    "gelu": nn.GELU,
}


class FP32Linear(nn.Linear):
    """Linear layer that always computes in float32, even inside an autocast region.

    LIFT computes hidden layers in bf16 but keeps the output layer in fp32: Q-values and the
    Gaussian parameters feed log-probabilities and TD targets, where bf16's 8-bit mantissa hurts.
    Outside autocast this is exactly ``nn.Linear``.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device_type=x.device.type, enabled=False):
            return F.linear(x.float(), self.weight, self.bias)


def lecun_uniform_(layer: nn.Linear) -> nn.Linear:
    """LeCun-uniform kernel (variance 1/fan_in), zero bias; in place."""
    bound = math.sqrt(3.0 / layer.in_features)
    with torch.no_grad():
        layer.weight.uniform_(-bound, bound)
        if layer.bias is not None:
            layer.bias.zero_()
    return layer


def mlp(
    in_dim: int,
    hidden: Sequence[int],
    out_dim: int,
    activation: str = "swish",
    *,
    activate_final: bool = False,
    layer_norm: bool = False,
    fp32_output: bool = False,
) -> nn.Sequential:
    """Build ``Linear -> act (-> LayerNorm)`` blocks for each hidden size, then a final ``Linear`` to ``out_dim``.

    Args:
        activation: key of ``ACTIVATIONS`` (``"swish"`` is SiLU, as in Brax/LIFT).
        activate_final: also apply the activation after the output layer.
        layer_norm: LayerNorm after each hidden activation (Brax placement; LIFT does not use it).
        fp32_output: make the output layer an ``FP32Linear`` (keeps it in fp32 under bf16 autocast).
    """
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
    if in_dim <= 0 or out_dim <= 0 or any(h <= 0 for h in hidden):
        raise ValueError(f"layer sizes must be positive, got in={in_dim}, hidden={list(hidden)}, out={out_dim}")
    layers: list[nn.Module] = []
    width = in_dim
    for size in hidden:
        layers += [lecun_uniform_(nn.Linear(width, size)), ACTIVATIONS[activation]()]
        if layer_norm:
            layers.append(nn.LayerNorm(size))
        width = size
    head_cls = FP32Linear if fp32_output else nn.Linear
    layers.append(lecun_uniform_(head_cls(width, out_dim)))
    if activate_final:
        layers.append(ACTIVATIONS[activation]())
    return nn.Sequential(*layers)
