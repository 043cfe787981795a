"""Forward kinematics of a MuJoCo model in torch (batched, differentiable), for rewards that need body positions.

A transcription of ``mj_kinematics`` for free, ball, hinge and slide joints (no mocap bodies): each body's frame is
its parent's frame moved by ``body_pos``/``body_quat``, then by its joints in order; hinge and ball joints rotate
about their anchor ``jnt_pos``. Quaternions are (w, x, y, z), as in MuJoCo.
"""
from __future__ import annotations

import mujoco
import numpy as np
import torch

_FREE, _BALL, _SLIDE, _HINGE = (int(mujoco.mjtJoint.mjJNT_FREE), int(mujoco.mjtJoint.mjJNT_BALL),
                                int(mujoco.mjtJoint.mjJNT_SLIDE), int(mujoco.mjtJoint.mjJNT_HINGE))


def quat_multiply(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Hamilton product a ⊗ b of (..., 4) quaternions."""
    aw, ax, ay, az = a.unbind(-1)
    bw, bx, by, bz = b.unbind(-1)
    return torch.stack((aw * bw - ax * bx - ay * by - az * bz,
                        aw * bx + ax * bw + ay * bz - az * by,
                        aw * by - ax * bz + ay * bw + az * bx,
                        aw * bz + ax * by - ay * bx + az * bw), dim=-1)


def quat_rotate(q: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Rotate (..., 3) vectors by unit (..., 4) quaternions: v + 2w(u×v) + 2u×(u×v)."""
    w, u = q[..., :1], q[..., 1:]
    uv = torch.linalg.cross(u, v, dim=-1)
    return v + 2.0 * (w * uv + torch.linalg.cross(u, uv, dim=-1))


def axis_angle_quat(axis: torch.Tensor, angle: torch.Tensor) -> torch.Tensor:
    """Unit quaternion of a rotation by ``angle`` (...,) about the unit ``axis`` (3,)."""
    half = 0.5 * angle.unsqueeze(-1)
    return torch.cat((torch.cos(half), torch.sin(half) * axis), dim=-1)


class TorchKinematics:
    """Body inertial-frame positions ``xipos`` and the centre of mass for a batch of ``qpos``."""

    def __init__(self, model: mujoco.MjModel) -> None:
        if model.nmocap:
            raise ValueError("TorchKinematics does not support mocap bodies")
        as64 = lambda a: torch.as_tensor(np.array(a), dtype=torch.float64)  # noqa: E731
        self.nbody = model.nbody
        self.parent = [int(p) for p in model.body_parentid]
        self.body_pos, self.body_quat = as64(model.body_pos), as64(model.body_quat)
        self.body_ipos = as64(model.body_ipos)
        self.body_mass = as64(model.body_mass)
        self.qpos0 = as64(model.qpos0)
        self.joints = [
            [(int(model.jnt_type[j]), int(model.jnt_qposadr[j]), as64(model.jnt_pos[j]), as64(model.jnt_axis[j]))
             for j in range(model.body_jntadr[b], model.body_jntadr[b] + model.body_jntnum[b])]
            for b in range(model.nbody)
        ]

    def xipos(self, qpos: torch.Tensor) -> torch.Tensor:
        """(..., nq) → (..., nbody, 3) world positions of the bodies' centres of mass."""
        dtype, device = qpos.dtype, qpos.device
        cast = lambda t: t.to(dtype=dtype, device=device)  # noqa: E731
        batch = qpos.shape[:-1]
        world_pos = torch.zeros(*batch, 3, dtype=dtype, device=device)
        world_quat = cast(torch.tensor([1.0, 0.0, 0.0, 0.0])).expand(*batch, 4)
        positions, quaternions = [world_pos], [world_quat]
        for body in range(1, self.nbody):
            joints = self.joints[body]
            if len(joints) == 1 and joints[0][0] == _FREE:
                adr = joints[0][1]
                pos = qpos[..., adr:adr + 3]
                quat = qpos[..., adr + 3:adr + 7]
                quat = quat / quat.norm(dim=-1, keepdim=True)
            else:
                parent_pos, parent_quat = positions[self.parent[body]], quaternions[self.parent[body]]
                pos = parent_pos + quat_rotate(parent_quat, cast(self.body_pos[body]).expand_as(parent_pos))
                quat = quat_multiply(parent_quat, cast(self.body_quat[body]).expand_as(parent_quat))
                for kind, adr, jnt_pos, jnt_axis in joints:
                    jnt_pos, jnt_axis = cast(jnt_pos).expand_as(pos), cast(jnt_axis)
                    if kind == _SLIDE:
                        shift = (qpos[..., adr] - self.qpos0[adr].item()).unsqueeze(-1)
                        pos = pos + quat_rotate(quat, jnt_axis.expand_as(pos)) * shift
                        continue
                    anchor = pos + quat_rotate(quat, jnt_pos)
                    if kind == _HINGE:
                        local = axis_angle_quat(jnt_axis, qpos[..., adr] - self.qpos0[adr].item())
                    elif kind == _BALL:
                        local = qpos[..., adr:adr + 4] / qpos[..., adr:adr + 4].norm(dim=-1, keepdim=True)
                    else:
                        raise ValueError(f"free joint must be the only joint of its body (body {body})")
                    quat = quat_multiply(quat, local)
                    pos = anchor - quat_rotate(quat, jnt_pos)
                quat = quat / quat.norm(dim=-1, keepdim=True)
            positions.append(pos)
            quaternions.append(quat)
        pos, quat = torch.stack(positions, dim=-2), torch.stack(quaternions, dim=-2)
        return pos + quat_rotate(quat, cast(self.body_ipos).expand_as(pos))

    def center_of_mass(self, qpos: torch.Tensor) -> torch.Tensor:
        """(..., nq) → (..., 3) mass-weighted mean of ``xipos`` (gymnasium's ``mass_center``)."""
        mass = self.body_mass.to(dtype=qpos.dtype, device=qpos.device)
        return torch.einsum("b,...bj->...j", mass, self.xipos(qpos)) / mass.sum()
