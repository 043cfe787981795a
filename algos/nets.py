"""Generic MLP builders shared by all algorithms: a plain ``nn.Sequential`` MLP and an ensemble MLP that runs
E independent members as one batched matmul per layer (twin critics, world-model ensembles); ``unwrap`` reaches
through a DDP wrapper.

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
        if not torch.is_autocast_enabled(x.device.type):
            return F.linear(x, self.weight, self.bias)
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


class EnsembleLinear(nn.Module):
    """E independent linear layers in one batched matmul: ``(B, in)`` (shared input) or ``(E, B, in)`` -> ``(E, B, out)``.

    ``detach_params=True`` uses detached weights: gradients still flow to the input but never to the parameters.
    ``fp32=True`` computes in float32 even under autocast (see ``FP32Linear``).
    """

    def __init__(self, n_members: int, in_features: int, out_features: int, fp32: bool = False):
        super().__init__()
        self.n_members, self.in_features, self.out_features, self.fp32 = n_members, in_features, out_features, fp32
        bound = math.sqrt(3.0 / in_features)  # LeCun-uniform per member
        self.weight = nn.Parameter(torch.empty(n_members, in_features, out_features).uniform_(-bound, bound))
        self.bias = nn.Parameter(torch.zeros(n_members, 1, out_features))

    def forward(self, x: torch.Tensor, detach_params: bool = False) -> torch.Tensor:
        weight, bias = (self.weight.detach(), self.bias.detach()) if detach_params else (self.weight, self.bias)
        if not (self.fp32 and torch.is_autocast_enabled(x.device.type)):
            return self._affine(x, weight, bias)
        with torch.autocast(device_type=x.device.type, enabled=False):
            return self._affine(x.float(), weight, bias)

    @staticmethod
    def _affine(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        # A shared (B, in) input broadcasts against the (E, in, out) weights.
        return torch.matmul(x, weight) + bias if x.dim() == 2 else torch.baddbmm(bias, x, weight)

    def extra_repr(self) -> str:
        return f"n_members={self.n_members}, in_features={self.in_features}, out_features={self.out_features}, fp32={self.fp32}"


class EnsembleMLP(nn.Module):
    """``n_members`` MLPs of identical shape evaluated together; ``(B, in)`` or ``(E, B, in)`` -> ``(E, B, out)``.

    Same layer layout, activation and init as ``mlp`` (no LayerNorm); one batched matmul per layer instead of
    one matmul per layer and member, which matters when per-op overhead dominates (small nets, CPU).
    """

    def __init__(
        self,
        n_members: int,
        in_dim: int,
        hidden: Sequence[int],
        out_dim: int,
        activation: str = "swish",
        *,
        fp32_output: bool = False,
    ):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
        if n_members <= 0 or in_dim <= 0 or out_dim <= 0 or any(h <= 0 for h in hidden):
            raise ValueError(f"sizes must be positive, got members={n_members}, in={in_dim}, hidden={list(hidden)}, out={out_dim}")
        widths = [in_dim, *hidden, out_dim]
        self.layers = nn.ModuleList(
            EnsembleLinear(n_members, a, b, fp32=fp32_output and i == len(widths) - 2)
            for i, (a, b) in enumerate(zip(widths[:-1], widths[1:]))
        )
        self.activation = ACTIVATIONS[activation]()

    def forward(self, x: torch.Tensor, detach_params: bool = False) -> torch.Tensor:
        for layer in self.layers[:-1]:
            x = self.activation(layer(x, detach_params))
        return self.layers[-1](x, detach_params)


def unwrap(module: nn.Module) -> nn.Module:
    """The module inside a DDP/FSDP-style wrapper (``.module``), or the module itself."""
    return getattr(module, "module", module)
