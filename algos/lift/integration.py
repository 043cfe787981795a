"""Integrating generalised positions with MuJoCo's conventions in torch (differentiable): hinge, slide and free-joint
translation coordinates add h q̇; free-joint and ball quaternions take the exponential map of the angular velocity."""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

import torch

Tensor = torch.Tensor


class RigidBodyPrior(Protocol):
    """What the physics model needs from a simulator (implemented by ``envs.control.mujoco_prior.MujocoPrior``)."""

    nq: int
    nv: int
    timestep: float  # h, the simulator's step
    n_substeps: int  # K, simulator steps per control step
    linear_qpos: tuple[int, ...]  # qpos that integrate as q += h q̇ (hinge, slide, free translation) ...
    linear_qvel: tuple[int, ...]  # ... with these velocities
    quaternion_qpos: tuple[int, ...]  # starts of (w, x, y, z) blocks, integrated by the exponential map ...
    quaternion_qvel: tuple[int, ...]  # ... of these local angular velocities
    translation_qpos: tuple[int, ...]  # qpos the networks do not see (dynamics are invariant to them)

    def terms(self, qpos: Tensor, qvel: Tensor, action: Tensor) -> tuple[Tensor, Tensor]:
        """(minv_h (B, nv, nv), force (B, nv)) at a batch of states; no gradient."""
        ...


def quaternion_integrate(quat: Tensor, omega: Tensor, h: float) -> Tensor:
    """q ⊗ exp(h ω / 2) for local angular velocity ω (MuJoCo's ``mju_quatIntegrate``), renormalized."""
    norm = omega.norm(dim=-1, keepdim=True)
    half = 0.5 * h * norm
    # sin(half)/|ω| = (h/2)·sinc(half/π): smooth at ω = 0
    vec = omega * (0.5 * h) * torch.sinc(half / math.pi)
    step = torch.cat((torch.cos(half), vec), dim=-1)
    w1, x1, y1, z1 = quat.unbind(-1)
    w2, x2, y2, z2 = step.unbind(-1)
    product = torch.stack((w1 * w2 - x1 * x2 - y1 * y2 - z1 * z2,
                           w1 * x2 + x1 * w2 + y1 * z2 - z1 * y2,
                           w1 * y2 - x1 * z2 + y1 * w2 + z1 * x2,
                           w1 * z2 + x1 * y2 - y1 * x2 + z1 * w2), dim=-1)
    return product / product.norm(dim=-1, keepdim=True)


def integrate_positions(qpos: Tensor, qvel: Tensor, h: float, prior: RigidBodyPrior) -> Tensor:
    """q ⊕ h q̇ (MuJoCo's ``mj_integratePos``) for the joint layout of ``prior``; differentiable."""
    out = qpos.clone()
    out[..., list(prior.linear_qpos)] = qpos[..., list(prior.linear_qpos)] + h * qvel[..., list(prior.linear_qvel)]
    for qadr, vadr in zip(prior.quaternion_qpos, prior.quaternion_qvel):
        out[..., qadr:qadr + 4] = quaternion_integrate(qpos[..., qadr:qadr + 4], qvel[..., vadr:vadr + 3], h)
    return out


def normalize_quaternions(qpos: Tensor, quaternion_qpos: Sequence[int]) -> Tensor:
    if not quaternion_qpos:
        return qpos
    out = qpos.clone()
    for adr in quaternion_qpos:
        block = qpos[..., adr:adr + 4]
        out[..., adr:adr + 4] = block / block.norm(dim=-1, keepdim=True).clamp_min(1e-8)
    return out
