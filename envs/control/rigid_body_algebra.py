"""Small batched algebra for the rigid-body prior (``envs.control.rigid_body``), every quantity batch-last.

A 3-vector is (3, B), a 3x3 matrix (3, 3, B), a stack of bodies' (nbody, 3, 3, B): each "scalar" of Featherstone's
algorithms is then one contiguous length-B vector, so small sums (over 3 or 6 components) are adds of whole vectors and
products with model constants are single GEMMs with B columns.
"""
from __future__ import annotations

import torch

Tensor = torch.Tensor


def cross(a: Tensor, b: Tensor) -> Tensor:
    """Cross product of batch-last 3-vectors (..., 3, B)."""
    a0, a1, a2 = a.unbind(-2)
    b0, b1, b2 = b.unbind(-2)
    return torch.stack((a1 * b2 - a2 * b1, a2 * b0 - a0 * b2, a0 * b1 - a1 * b0), -2)


def quat_to_frame(q: Tensor) -> Tensor:
    """Transposed rotation matrix Rᵀ (3, 3, B) of unit wxyz quaternions (4, B) (MuJoCo's ``mju_quat2Mat``, transposed).

    Rotations are kept transposed, as frames: row k of Rᵀ is the body's k-th axis in the world (column k of R). Then
    the frame's axes are contiguous (3, B) rows, and every product of a frame with a model constant is one 2-D GEMM
    over a (3, 3B) view: (R C)ᵀ = Cᵀ Rᵀ and R v = vᵀ Rᵀ."""
    w, x, y, z = q.unbind(0)
    rows = (1 - 2 * (y * y + z * z), 2 * (x * y + w * z), 2 * (x * z - w * y),
            2 * (x * y - w * z), 1 - 2 * (x * x + z * z), 2 * (y * z + w * x),
            2 * (x * z + w * y), 2 * (y * z - w * x), 1 - 2 * (x * x + y * y))
    return torch.stack(rows, 0).reshape(3, 3, *q.shape[1:])


def normalized(q: Tensor) -> Tensor:
    return q / torch.linalg.vector_norm(q, dim=0, keepdim=True)


def frame_times(const_t: Tensor, frame: Tensor) -> Tensor:
    """The frame (R C)ᵀ = Cᵀ Rᵀ of a frame Rᵀ (3, 3, B) and a constant rotation C given as Cᵀ (k, 3: several constants
    stacked give (k, 3, B) results at once): one GEMM."""
    return torch.mm(const_t, frame.reshape(3, -1)).reshape(-1, 3, frame.shape[-1])


def point(origin: Tensor | None, frame: Tensor, vec: Tensor, alpha: float = 1.0) -> Tensor:
    """origin + alpha·R v (3, B) for a frame Rᵀ (3, 3, B) and a constant 3-vector v: one GEMV (origin None: 0)."""
    flat = frame.reshape(3, -1).t()
    if origin is None:
        return torch.mv(flat, vec).reshape(3, -1)
    return torch.addmv(origin.reshape(-1), flat, vec, alpha=alpha).reshape(3, -1)


def frame_compose(outer: Tensor, inner: Tensor) -> Tensor:
    """(R₁ R₂)ᵀ = R₂ᵀ R₁ᵀ for frames R₁ᵀ = ``outer`` and R₂ᵀ = ``inner`` (3, 3, B) that both vary (a ball joint)."""
    return (inner[:, :, None] * outer[None]).sum(1)


def quat_log(q: Tensor) -> Tensor:
    """Rotation vector of unit wxyz quaternions (MuJoCo's ``mju_quat2Vel`` with dt = 1), angle wrapped to (−π, π].

    Batch-first (..., 4) -> (..., 3): used by the passive springs, which work on the (B, nq) states directly."""
    w, v = q[..., 0], q[..., 1:]
    sin_half = torch.linalg.vector_norm(v, dim=-1)
    angle = 2 * torch.atan2(sin_half, w)
    angle = torch.where(angle > torch.pi, angle - 2 * torch.pi, angle)
    # angle / sin_half -> 2 / w as the rotation vanishes; the where keeps gradients finite there
    safe = torch.where(sin_half > 1e-12, sin_half, torch.ones_like(sin_half))
    scale = torch.where(sin_half > 1e-12, angle / safe, 2 / w)
    return v * scale[..., None]


def quat_mul(a: Tensor, b: Tensor) -> Tensor:
    aw, ax, ay, az = a.unbind(-1)
    bw, bx, by, bz = b.unbind(-1)
    return torch.stack((aw * bw - ax * bx - ay * by - az * bz, aw * bx + ax * bw + ay * bz - az * by,
                        aw * by - ax * bz + ay * bw + az * bx, aw * bz + ax * by - ay * bx + az * bw), -1)
