"""The exact rigid-body prior of LIFT's physics-informed world model, taken from MuJoCo's own model of the robot.

MuJoCo's equation of motion (https://mujoco.readthedocs.io/en/stable/computation):

    M(q) q̈ + c(q, q̇) = τ_actuator + τ_passive + τ_constraint (+ τ_applied)                       (1)

with ``c = qfrc_bias`` (Coriolis, centrifugal, gravity). The world model keeps M, c, τ_actuator and τ_passive exact and
learns only a residual generalised force standing in for τ_constraint (contacts, joint limits) and whatever the prior
gets wrong. Integration is MuJoCo's semi-implicit Euler with implicit joint damping (Brax ``matrix_inv_iterations=0``):

    (M + h·diag(dof_damping)) q̈ = τ_actuator + τ_passive − c + τ_residual,  q̇' = q̇ + h q̈,  q' = q ⊕ h q̇'     (2)

Humanoid-v5, Walker2d-v5 and InvertedPendulum-v5 are RK4 in gymnasium, HalfCheetah-v5 is Euler. The world model always
integrates with (2); on RK4 data the residual absorbs the integrator difference. ``set_euler`` switches an env to
Euler so that (2) is exact up to τ_constraint (``euler_velocity_update`` reproduces MuJoCo's next q̇ to ~1e-15).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import mujoco
import numpy as np
import torch

from envs.control.rigid_body import RigidBodyDynamics

_FREE, _BALL = int(mujoco.mjtJoint.mjJNT_FREE), int(mujoco.mjtJoint.mjJNT_BALL)
BACKENDS = ("torch", "mujoco")  # the batched torch prior (default) or MuJoCo's per-state loop (the reference)


def full_mass_matrix(model: mujoco.MjModel, data: mujoco.MjData) -> np.ndarray:
    """Dense joint-space inertia M(q) (armature included) from ``data``; needs ``mj_crb`` (e.g. ``mj_forward``) first.

    mujoco 4.0 changed ``mj_fullM(m, dst, d.qM)`` to ``mj_fullM(m, d, dst)`` (and renamed ``d.qM`` to ``d.M``).
    """
    dense = np.zeros((model.nv, model.nv))
    _fill_mass_matrix(model, data, dense)
    return dense


def _fill_mass_matrix_v4(model: mujoco.MjModel, data: mujoco.MjData, out: np.ndarray) -> None:
    mujoco.mj_fullM(model, data, out)


def _fill_mass_matrix_v3(model: mujoco.MjModel, data: mujoco.MjData, out: np.ndarray) -> None:
    mujoco.mj_fullM(model, out, data.qM)


def _pick_mass_matrix_filler():
    """Probe the ``mj_fullM`` signature once on a one-joint model (a per-state try/except would cost in the loop)."""
    model = mujoco.MjModel.from_xml_string(
        "<mujoco><worldbody><body><joint/><geom size='.1'/></body></worldbody></mujoco>")
    data = mujoco.MjData(model)
    mujoco.mj_forward(model, data)
    try:
        _fill_mass_matrix_v4(model, data, np.zeros((1, 1)))
        return _fill_mass_matrix_v4
    except TypeError:
        return _fill_mass_matrix_v3


_fill_mass_matrix = _pick_mass_matrix_filler()


@dataclass(frozen=True)
class PriorTerms:
    """The generalised forces of equation (1) at one state, each of shape (nv,) (``mass_matrix``: (nv, nv))."""

    mass_matrix: np.ndarray
    bias: np.ndarray
    actuator: np.ndarray
    passive: np.ndarray
    constraint: np.ndarray


def prior_terms(model: mujoco.MjModel, data: mujoco.MjData, ctrl: np.ndarray | None = None) -> PriorTerms:
    """``mj_forward`` at ``data``'s (qpos, qvel) with ``ctrl`` (default: ``data.ctrl``); equation (1)'s terms.

    ``constraint`` is MuJoCo's own solution, which the world model does not get; it is returned for checks.
    """
    if ctrl is not None:
        data.ctrl[:] = ctrl
    mujoco.mj_forward(model, data)
    return PriorTerms(
        mass_matrix=full_mass_matrix(model, data),
        bias=data.qfrc_bias.copy(),
        actuator=data.qfrc_actuator.copy(),
        passive=data.qfrc_passive.copy(),
        constraint=data.qfrc_constraint.copy(),
    )


def applied_force(model: mujoco.MjModel, data: mujoco.MjData) -> np.ndarray:
    """qfrc_applied plus the joint-space image of the Cartesian ``xfrc_applied`` (both zero in the gym tasks)."""
    total = data.qfrc_applied.copy()
    for body in np.flatnonzero(np.any(data.xfrc_applied != 0.0, axis=1)):
        mujoco.mj_applyFT(model, data, data.xfrc_applied[body, :3], data.xfrc_applied[body, 3:],
                          data.xipos[body], int(body), total)
    return total


def identity_residual(model: mujoco.MjModel, data: mujoco.MjData) -> float:
    """max |M q̈ + c − (τ_actuator + τ_passive + τ_constraint + τ_applied)| at ``data``'s state after ``mj_forward``.

    Zero up to round-off when the prior terms are the ones MuJoCo integrates (equation (1)).
    """
    terms = prior_terms(model, data)
    lhs = terms.mass_matrix @ data.qacc + terms.bias
    rhs = terms.actuator + terms.passive + terms.constraint + applied_force(model, data)
    return float(np.max(np.abs(lhs - rhs)))


def set_euler(model: mujoco.MjModel) -> int:
    """Switch ``model`` to semi-implicit Euler (the integrator of equation (2)); returns the previous integrator."""
    previous = int(model.opt.integrator)
    model.opt.integrator = mujoco.mjtIntegrator.mjINT_EULER
    return previous


def implicit_damping(model: mujoco.MjModel) -> np.ndarray:
    """h·dof_damping: the diagonal MuJoCo's Euler adds to M, unless ``mjDSBL_EULERDAMP`` is set."""
    if model.opt.disableflags & int(mujoco.mjtDisableBit.mjDSBL_EULERDAMP):
        return np.zeros(model.nv)
    return model.opt.timestep * model.dof_damping.copy()


def euler_velocity_update(model: mujoco.MjModel, terms: PriorTerms, qvel: np.ndarray,
                          residual: np.ndarray | None = None) -> np.ndarray:
    """One substep of equation (2): q̇' = q̇ + h (M + h D)^-1 (τ_act + τ_passive − c + residual).

    ``residual=terms.constraint`` reproduces MuJoCo's Euler step exactly.
    """
    force = terms.actuator + terms.passive - terms.bias
    if residual is not None:
        force = force + residual
    lhs = terms.mass_matrix + np.diag(implicit_damping(model))
    return qvel + model.opt.timestep * np.linalg.solve(lhs, force)


@dataclass(frozen=True)
class PositionLayout:
    """How qvel integrates into qpos: linear coordinates (hinge, slide, free translation), quaternions (free, ball)."""

    linear_qpos: tuple[int, ...]
    linear_qvel: tuple[int, ...]
    quaternion_qpos: tuple[int, ...]  # start of each 4-vector (w, x, y, z)
    quaternion_qvel: tuple[int, ...]  # start of its 3-vector angular velocity, in the body's local frame


def position_layout(model: mujoco.MjModel) -> PositionLayout:
    """The ``PositionLayout`` of ``model``'s joints (mirrors ``mj_integratePos``)."""
    linear_qpos: list[int] = []
    linear_qvel: list[int] = []
    quat_qpos: list[int] = []
    quat_qvel: list[int] = []
    for joint in range(model.njnt):
        kind, qadr, vadr = int(model.jnt_type[joint]), int(model.jnt_qposadr[joint]), int(model.jnt_dofadr[joint])
        if kind == _FREE:
            linear_qpos += [qadr, qadr + 1, qadr + 2]
            linear_qvel += [vadr, vadr + 1, vadr + 2]
            quat_qpos.append(qadr + 3)
            quat_qvel.append(vadr + 3)
        elif kind == _BALL:
            quat_qpos.append(qadr)
            quat_qvel.append(vadr)
        else:
            linear_qpos.append(qadr)
            linear_qvel.append(vadr)
    return PositionLayout(tuple(linear_qpos), tuple(linear_qvel), tuple(quat_qpos), tuple(quat_qvel))


def _chunk_rows(nv: int, itemsize: int, budget: int = 8 << 20) -> int:
    """States per chunk of the batched prior: a power of two >= 1024 whose M takes about ``budget`` bytes."""
    rows = max(1, budget // (nv * nv * itemsize))
    return max(1024, 1 << (rows.bit_length() - 1))


class MujocoPrior:
    """Batched prior of equation (2) for a fixed (nominal) MuJoCo model; the world model's ``RigidBodyPrior``.

    Holds a private copy of the model, so later edits of the env's model (stage-3 changes) leave the prior nominal,
    as in LIFT (the residual has to absorb the change). ``terms`` returns, per state,

        minv_h = (M + h D)^-1   (B, nv, nv)      and      force = τ_actuator + τ_passive − c   (B, nv),

    without gradients. ``backend="torch"`` (default) computes them batched on the states' device and dtype with
    ``envs.control.rigid_body`` (equal to MuJoCo within 1e-6 in float64, tests/test_rigid_body.py); ``"mujoco"`` keeps
    MuJoCo's own pipeline stages per state in float64 on the CPU (skipping the constraint solve) as the reference.
    """

    def __init__(self, model: mujoco.MjModel, frame_skip: int, translation_qpos: tuple[int, ...] = (),
                 backend: str = "torch", compute_dtype: torch.dtype | None = torch.float64) -> None:
        if frame_skip < 1:
            raise ValueError(f"frame_skip must be >= 1, got {frame_skip}")
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        self.backend = backend
        # float64 by default, as MuJoCo computes: (M + hD) of a humanoid spans light feet and a heavy torso, and a
        # float32 Cholesky of it loses ~1e-5 relative (and can fail where M is nearly singular). None: the states' dtype.
        self.compute_dtype = compute_dtype
        self.model = copy.deepcopy(model)
        self.data = mujoco.MjData(self.model)
        self.nq, self.nv, self.nu = self.model.nq, self.model.nv, self.model.nu
        self.timestep = float(self.model.opt.timestep)
        self.n_substeps = int(frame_skip)
        layout = position_layout(self.model)
        self.linear_qpos, self.linear_qvel = layout.linear_qpos, layout.linear_qvel
        self.quaternion_qpos, self.quaternion_qvel = layout.quaternion_qpos, layout.quaternion_qvel
        self.translation_qpos = tuple(translation_qpos)
        self._damping = np.diag(implicit_damping(self.model))
        self._damping_diag = implicit_damping(self.model)
        self.dynamics = RigidBodyDynamics(self.model) if backend == "torch" else None

    @classmethod
    def from_env(cls, env, backend: str = "torch", compute_dtype: torch.dtype | None = torch.float64
                 ) -> "MujocoPrior":
        """Prior of a gymnasium MuJoCo env; translation coordinates are the qpos gymnasium leaves out of the obs."""
        base = env.unwrapped
        skipped = int(getattr(base, "observation_structure", {}).get("skipped_qpos", 0))
        return cls(base.model, base.frame_skip, translation_qpos=tuple(range(skipped)), backend=backend,
                   compute_dtype=compute_dtype)

    def numpy_terms(self, qpos: np.ndarray, qvel: np.ndarray,
                    ctrl: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """M (B, nv, nv), bias c, τ_actuator, τ_passive (B, nv) for a batch of states and controls."""
        qpos, qvel, ctrl = np.atleast_2d(qpos), np.atleast_2d(qvel), np.atleast_2d(ctrl)
        batch = qpos.shape[0]
        mass = np.empty((batch, self.nv, self.nv))
        bias, actuator, passive = (np.empty((batch, self.nv)) for _ in range(3))
        model, data = self.model, self.data
        for i in range(batch):
            data.qpos[:], data.qvel[:], data.ctrl[:] = qpos[i], qvel[i], ctrl[i]
            mujoco.mj_fwdPosition(model, data)
            mujoco.mj_fwdVelocity(model, data)
            mujoco.mj_fwdActuation(model, data)
            _fill_mass_matrix(model, data, mass[i])
            bias[i], actuator[i], passive[i] = data.qfrc_bias, data.qfrc_actuator, data.qfrc_passive
        return mass, bias, actuator, passive

    def terms(self, qpos: torch.Tensor, qvel: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(minv_h, force) of equation (2) for a batch, as tensors of ``qpos``'s dtype and device (no gradient).

        ``backend="torch"``: batched on ``qpos``'s device in ``compute_dtype`` (default float64), (M + hD)^-1 from a
        batched Cholesky factorisation; ``"mujoco"``: the per-state MuJoCo loop in float64 on the CPU (the reference).
        """
        if self.backend == "torch":
            dtype = self.compute_dtype or qpos.dtype
            with torch.no_grad():
                q, v, a = (t.detach().to(dtype) for t in (qpos, qvel, action))
                damping = torch.as_tensor(self._damping_diag, dtype=dtype, device=qpos.device)
                minv_h = q.new_empty(q.shape[0], self.nv, self.nv)
                force = q.new_empty(q.shape[0], self.nv)
                # on a CPU in chunks of ~8 MB of M: the temporaries of a whole large batch (~100 MB for a humanoid at
                # 4096 in fp64) would be returned to the OS after each call and page-faulted in again on the next,
                # which cost more than the extra calls (benchmarks/RESULTS.md "Physics prior"); an accelerator takes
                # the whole batch (its caching allocator keeps memory, and it wants few large kernels)
                step = _chunk_rows(self.nv, q.element_size()) if q.device.type == "cpu" else max(1, q.shape[0])
                for start in range(0, q.shape[0], step):
                    rows = slice(start, start + step)
                    mass, bias, passive, actuator = self.dynamics.terms(q[rows], v[rows], a[rows])
                    mass.diagonal(dim1=-2, dim2=-1).add_(damping)
                    torch.cholesky_inverse(torch.linalg.cholesky(mass), out=minv_h[rows])
                    torch.sub(actuator + passive, bias, out=force[rows])
                return minv_h.to(qpos.dtype), force.to(qpos.dtype)
        mass, bias, actuator, passive = self.numpy_terms(
            qpos.detach().cpu().double().numpy(), qvel.detach().cpu().double().numpy(),
            action.detach().cpu().double().numpy())
        minv_h = np.linalg.inv(mass + self._damping)
        force = actuator + passive - bias
        return (torch.as_tensor(minv_h, dtype=qpos.dtype, device=qpos.device),
                torch.as_tensor(force, dtype=qpos.dtype, device=qpos.device))



class PendulumPrior:
    """The same ``RigidBodyPrior`` interface for Pendulum-v1 (not MuJoCo), from its closed-form dynamics.

    A uniform rod about its end: M = m l²/3, bias c = −(m g l/2) sin θ, actuator = clip(u, ±max_torque), one Euler
    step of ``dt``; state qpos = [θ], qvel = [θ̇]. gymnasium also clips θ̇' to ±max_speed, which the residual absorbs.
    Parameters are copied at construction, so the prior stays nominal when the env is changed later.
    """

    nq = nv = nu = 1
    n_substeps = 1
    linear_qpos = linear_qvel = (0,)
    quaternion_qpos = quaternion_qvel = translation_qpos = ()

    def __init__(self, env) -> None:
        base = env.unwrapped
        self.mass, self.length, self.gravity = float(base.m), float(base.l), float(base.g)
        self.max_torque, self.timestep = float(base.max_torque), float(base.dt)

    def terms(self, qpos: torch.Tensor, qvel: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        inertia = self.mass * self.length ** 2 / 3.0
        torque = action[..., :1].detach().clamp(-self.max_torque, self.max_torque)
        force = torque + 0.5 * self.mass * self.gravity * self.length * torch.sin(qpos[..., :1].detach())
        minv_h = torch.full((*qpos.shape[:-1], 1, 1), 1.0 / inertia, dtype=qpos.dtype, device=qpos.device)
        return minv_h, force.to(qpos.dtype)
