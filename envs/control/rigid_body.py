"""MuJoCo's joint-space dynamics terms for a batch of states, in torch: M(q), qfrc_bias, qfrc_passive, qfrc_actuator.

Built once from an ``mjModel`` (body tree, joint types and axes, inertias, armature, damping, stiffness/springref,
gear) or from those tables exported without MuJoCo in reach (``envs.control.rigid_body_tables``: this module never
imports MuJoCo, so a machine without it runs the prior from a saved ``.npz``), then evaluated for a batch of (qpos,
qvel, ctrl) on the states' own device and dtype, differentiably, with no Python loop over states (only over the few
bodies and dofs of the tree).

Why hand-written (issue 41): ``mujoco-torch`` (a PyTorch port of MJX) does not import with the installed MuJoCo 4.0,
and ``mujoco-warp`` runs on Warp's CPU device in float32 only, so it cannot meet the 1e-6 float64 equality with
MuJoCo. What is left are two textbook algorithms (Featherstone, *Rigid Body Dynamics Algorithms*, 2008):

- **CRBA** (composite rigid bodies, ch. 6.2) for M: every body's spatial inertia is expressed about one common point
  (the world origin, world axes), so composite inertias are plain subtree sums (a leaf-to-root pass), and
  ``M[i, j] = s_j · (I^c_{body(i)} s_i)`` only for the pairs where dof j is on the path from the root to dof i
  (MuJoCo's sparsity pattern: 185 of 529 entries for Humanoid); plus ``dof_armature`` on the diagonal (as ``mj_crb``).
- **RNEA** (recursive Newton-Euler, ch. 5.3) with q̈ = 0 for ``qfrc_bias``: the root accelerates by −g (MuJoCo's
  ``cacc[0] = -gravity``), v_b = v_parent + Σ s_k q̇_k and a_b = a_parent + Σ ṡ_k q̇_k (root-to-leaf passes),
  f_b = I_b a_b + v_b ×* I_b v_b, and bias_i = s_i · Σ_subtree f (a leaf-to-root pass).

Why the code has this shape (profiled at batch 4096 on one CPU thread; benchmarks/RESULTS.md "Physics prior"):

- **batch-last tensors** (a 3-vector is (3, B), a body stack (nbody, 3, 3, B)): every scalar of the algorithms is one
  contiguous length-B vector, so the sums over 3 or 6 components are adds of whole vectors, and products with model
  constants (joint axes, body frames) are one GEMM with B columns. The first version kept the batch in the middle
  ((nbody, B, 3)) and spent most of its time in reductions over size-3 trailing axes and in 23x6x23 batched GEMMs.
- **passes over bodies, not over states**: the frame chain (each child needs its parent's frame) and the tree sums
  are Python loops over the model's 7-13 bodies issuing ops on (k, B) slices (a dense 0/1 ancestor matrix times the
  stacked bodies, the previous form, spent a GEMM mostly on zeros). Anything that does not feed the chain (hinge
  sines, the axes' moments anchor × axis, centres of mass, inertia frames) is computed once for all joints/bodies.
- **static structure once per model**: parents, dof ranges, the pairs of M's pattern and the map that scatters them
  into the dense matrix, identity frames to skip, all built at construction; constants cached per (device, dtype).
- **no large temporaries**: M's pairs are formed per dof (an all-pairs gather would build a (185, 6, B) temporary,
  ~36 MB at B = 4096 in fp64, slower than the 23 small products because of the page faults of such allocations).
- M is returned batch-first (B, nv, nv), as LAPACK's batched Cholesky wants it: the pairs are scattered into the
  columns of a zero (B, nv²) matrix; (M + hD)^-1 stays LAPACK's (``MujocoPrior``: cholesky + cholesky_inverse): a
  batch-last sparse LDLᵀ and dense inverse in torch ops costs more than LAPACK's per-matrix calls at nv ≈ 20.

MuJoCo's conventions, matched here (``mj_kinematics``, ``mj_comPos``, ``mj_comVel``, ``mj_passive``,
``mj_fwdActuation`` in MuJoCo's engine_core_smooth.c / engine_passive.c / engine_forward.c):

- joints of a body act in order; a joint's axis and anchor are taken in the frame left by the joints before it;
- free joint: qpos = (world position, wxyz quaternion), qvel = (world linear velocity, angular velocity in the body
  frame); ball joint: angular velocity in the body frame. Their rotational dof axes are the body's final frame axes;
- ṡ_k = v_k × s_k with v_k the body velocity accumulated up to (not including) dof k's joint, except the free joint's
  translational dofs, whose axes are fixed in the world (ṡ = 0);
- passive: −damping·q̇, stiffness·(springref − q) on hinge/slide, stiffness·log(q⁻¹ q_spring) on ball/free rotation;
- actuators with joint transmission on hinge/slide, fixed gain and none/affine bias, no activation dynamics; ctrl and
  force clamped as ``ctrllimited``/``forcelimited`` say.

Speed (benchmarks/physics_prior.py, benchmarks/RESULTS.md "Physics prior (issue 41)", one loaded CPU thread):
``MujocoPrior.terms`` on this form is 1.3x (fp64) / 2.3x (fp32) MuJoCo's per-state loop for Humanoid and 2.0x / 3.3x for
Walker2d at batch 4096 (the first form: 0.6x / 1.2x and 0.9x / 1.3x), far from issue 41's 20x: LAPACK's per-matrix
Cholesky and inverse alone take ~5 µs of a Humanoid state's ~20 µs, and at the batches where dispatch stops
dominating, eager torch is bound by the memory traffic of dense (B, nv, nv) results. What it gives is an exact,
differentiable prior on the states' device with no host round trip.

Anything outside that (tendon springs or dampers, fluid forces, gravity compensation, other actuator kinds) raises
at construction rather than giving a silently different prior.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from envs.control.rigid_body_algebra import (cross, frame_compose, frame_times, normalized, point, quat_log,
                                             quat_mul, quat_to_frame)
from envs.control.rigid_body_tables import BALL, BIAS_AFFINE, FREE, HINGE, SLIDE, ModelTables

Tensor = torch.Tensor
_FREE, _BALL, _SLIDE, _HINGE = FREE, BALL, SLIDE, HINGE


# ---------------------------------------------------------------------------------------------- the model

@dataclass(frozen=True)
class _Joint:
    kind: int
    qadr: int
    vadr: int
    axis: np.ndarray
    pos: np.ndarray


class RigidBodyDynamics:
    """MuJoCo's M, qfrc_bias, qfrc_passive and qfrc_actuator for batches of states, from a fixed ``mjModel``.

    Model constants are cached per (device, dtype) on first use; call ``terms`` with tensors of shape (B, nq), (B, nv),
    (B, nu). Gradients flow to qpos, qvel and ctrl.
    """

    def __init__(self, model) -> None:
        """``model``: an ``mjModel`` (MuJoCo reads its tables here) or its exported :class:`ModelTables`."""
        model = model if isinstance(model, ModelTables) else ModelTables.from_mujoco(model)
        self.nq, self.nv, self.nu = int(model.nq), int(model.nv), int(model.nu)
        nbody = int(model.nbody) - 1  # world (body 0) carries no dofs or mass
        self.nbody = nbody
        self.parent = [int(p) - 1 for p in model.body_parentid[1:]]  # -1: world
        self.joints: list[list[_Joint]] = []
        for b in range(1, nbody + 1):
            adr, num = int(model.body_jntadr[b]), int(model.body_jntnum[b])
            self.joints.append([_Joint(int(model.jnt_type[j]), int(model.jnt_qposadr[j]), int(model.jnt_dofadr[j]),
                                       model.jnt_axis[j].copy(), model.jnt_pos[j].copy())
                                for j in range(adr, adr + num)])
        self.dof_body = np.asarray(model.dof_bodyid, dtype=np.int64) - 1
        self._dof_body_list = self.dof_body.tolist()
        # ancestor-or-self relation of bodies (anc[b, a] = 1: a is b or one of its ancestors), and of dofs
        anc = np.zeros((nbody, nbody))
        for b in range(nbody):
            a = b
            while a >= 0:
                anc[b, a] = 1.0
                a = self.parent[a]
        dof_anc = anc[self.dof_body][:, self.dof_body]  # (nv, nv): body(j) ancestor-or-self of body(i)
        same = (self.dof_body[:, None] == self.dof_body[None, :]).astype(float)
        # the body velocity a dof's ṡ sees: its parent body's plus the earlier joints' of its own body
        earlier = np.zeros((self.nv, self.nv))
        free_translation = np.zeros(self.nv)
        for joints in self.joints:
            seen: list[int] = []
            for joint in joints:
                width = {_FREE: 6, _BALL: 3}.get(joint.kind, 1)
                dofs = list(range(joint.vadr, joint.vadr + width))
                if joint.kind == _FREE:
                    free_translation[dofs[:3]] = 1.0
                    for i in dofs[3:]:
                        earlier[i, seen + dofs[:3]] = 1.0
                else:
                    for i in dofs:
                        earlier[i, seen] = 1.0
                seen += dofs
        # M's nonzero pattern: (i, j) with body(j) an ancestor-or-self of body(i), each pair once (i >= j on one body)
        pairs = [(i, j) for i in range(self.nv) for j in range(self.nv)
                 if dof_anc[i, j] and (not same[i, j] or i >= j)]
        pair_i, pair_j = (np.asarray(x, dtype=np.int64) for x in zip(*pairs))
        self.has_free = bool(free_translation.any())
        self._numpy = dict(
            mass=model.body_mass[1:], inertia=model.body_inertia[1:],
            composite_mass=(anc.T @ model.body_mass[1:])[self.dof_body],  # mass of dof i's body's subtree
            keep_dot=1.0 - free_translation,
            pair_i=pair_i, pair_j=pair_j, pair_lower=pair_i * self.nv + pair_j, pair_upper=pair_j * self.nv + pair_i,
            pair_armature=np.where(pair_i == pair_j, model.dof_armature[pair_i], 0.0),
            damping=model.dof_damping.copy(), gravity=np.concatenate([np.zeros(3), -model.gravity]),
            qpos0=model.qpos0.copy(), qpos_spring=model.qpos_spring.copy(),
        )
        self._bodies = [self._body_constants(model, b) for b in range(nbody)]
        self.hinge_qadr = [j.qadr for joints in self.joints for j in joints if j.kind == _HINGE]  # in tree order
        self.any_ishifted = any(body["ishifted"] for body in self._bodies)
        self.any_irotated = any(body["irotated"] for body in self._bodies)
        # per body: its dofs (contiguous in MuJoCo) and which of them each one's ṡ sees besides the parent's velocity
        self.body_dofs = [(int(model.body_dofadr[b + 1]), int(model.body_dofnum[b + 1])) for b in range(nbody)]
        self._earlier_blocks = [earlier[a:a + n, a:a + n].copy() for a, n in self.body_dofs]
        self._springs = self._spring_layout(model)
        self._actuators = self._actuator_layout(model)
        self._cache: dict[tuple[torch.device, torch.dtype], dict[str, Tensor]] = {}

    # ----------------------------------------------------------------------------------------- construction

    def _spring_layout(self, model: ModelTables) -> dict[str, np.ndarray]:
        """Which qpos/qvel carry linear springs (hinge, slide, free translation) and which quaternion springs."""
        self.springs_on, self.dampers_on = bool(model.springs_on), bool(model.dampers_on)
        self.gravity_on = bool(model.gravity_on)
        lin_q, lin_v, lin_k, quat_q, quat_v, quat_k = [], [], [], [], [], []
        for j in range(model.njnt):
            k = float(model.jnt_stiffness[j])
            if k == 0.0:
                continue
            kind, qa, va = int(model.jnt_type[j]), int(model.jnt_qposadr[j]), int(model.jnt_dofadr[j])
            if kind == _FREE:
                lin_q += [qa, qa + 1, qa + 2]
                lin_v += [va, va + 1, va + 2]
                lin_k += [k] * 3
                quat_q.append(qa + 3), quat_v.append(va + 3), quat_k.append(k)
            elif kind == _BALL:
                quat_q.append(qa), quat_v.append(va), quat_k.append(k)
            else:
                lin_q.append(qa), lin_v.append(va), lin_k.append(k)
        return dict(lin_q=np.asarray(lin_q, np.int64), lin_v=np.asarray(lin_v, np.int64), lin_k=np.asarray(lin_k),
                    quat_q=np.asarray(quat_q, np.int64), quat_v=np.asarray(quat_v, np.int64),
                    quat_k=np.asarray(quat_k))

    def _actuator_layout(self, model: ModelTables) -> dict[str, np.ndarray]:
        joint = model.actuator_trnid[:, 0]
        limited = model.actuator_ctrllimited.astype(bool) & bool(model.clamp_ctrl)
        force_limited = model.actuator_forcelimited.astype(bool)
        inf = np.inf
        return dict(
            qadr=model.jnt_qposadr[joint].astype(np.int64), vadr=model.jnt_dofadr[joint].astype(np.int64),
            gear=model.actuator_gear[:, 0].copy(), gain=model.actuator_gainprm[:, 0].copy(),
            bias=model.actuator_biasprm[:, :3] * (model.actuator_biastype == BIAS_AFFINE)[:, None],
            ctrl_lo=np.where(limited, model.actuator_ctrlrange[:, 0], -inf),
            ctrl_hi=np.where(limited, model.actuator_ctrlrange[:, 1], inf),
            force_lo=np.where(force_limited, model.actuator_forcerange[:, 0], -inf),
            force_hi=np.where(force_limited, model.actuator_forcerange[:, 1], inf),
        )

    def _body_constants(self, model: ModelTables, b: int) -> dict:
        """Body b's static frame data (numpy), with flags for the products that are identities and can be skipped."""
        rot, irot = model.body_rot[b + 1], model.body_irot[b + 1]
        joints = [(j.kind, j.qadr, j.vadr, j.axis, j.pos, bool(np.any(j.pos)), _skew(j.axis).T.copy(),
                   (_skew(j.axis) @ _skew(j.axis)).T.copy()) for j in self.joints[b]]
        return dict(pos=model.body_pos[b + 1].copy(), moved=bool(np.any(model.body_pos[b + 1])),
                    rot=rot, rotated=not np.allclose(rot, np.eye(3), rtol=0.0, atol=0.0),
                    ipos=model.body_ipos[b + 1].copy(), ishifted=bool(np.any(model.body_ipos[b + 1])),
                    irot=irot, irotated=not np.allclose(irot, np.eye(3), rtol=0.0, atol=0.0), joints=joints)

    def _constants(self, device: torch.device, dtype: torch.dtype) -> dict:
        """The model's constants as tensors on ``device`` in ``dtype``, built once per (device, dtype)."""
        key = (device, dtype)
        if key not in self._cache:
            as_t = lambda a: torch.as_tensor(np.asarray(a), device=device,  # noqa: E731
                                             dtype=torch.int64 if np.asarray(a).dtype == np.int64 else dtype)
            consts = {k: as_t(v) for k, v in self._numpy.items()}
            consts.update({f"spring_{k}": as_t(v) for k, v in self._springs.items()})
            consts.update({f"act_{k}": as_t(v) for k, v in self._actuators.items()})
            consts["eye"] = as_t(np.eye(3))
            consts["hinge_qadr"] = as_t(np.asarray(self.hinge_qadr, dtype=np.int64))
            consts["hinge_qpos0"] = as_t(self._numpy["qpos0"][self.hinge_qadr])
            consts["body_ipos"] = as_t(np.stack([body["ipos"] for body in self._bodies]))
            consts["body_irot_t"] = as_t(np.stack([body["irot"].T for body in self._bodies]))
            consts["earlier"] = [as_t(block) if block.any() else None for block in self._earlier_blocks]
            pair_i, pair_j = self._numpy["pair_i"], self._numpy["pair_j"]
            consts["pair_groups"] = [(int(i), as_t(pair_j[pair_i == i])) for i in np.unique(pair_i)]
            consts["bodies"] = [dict(body, pos=as_t(body["pos"]), rot_t=as_t(body["rot"].T), rot=as_t(body["rot"]),
                                     ipos=as_t(body["ipos"]), irot_t=as_t(body["irot"].T),
                                     joints=[(kind, qa, va, as_t(axis), as_t(jpos), offset,
                                              as_t(np.concatenate((skew_t, skew2_t))))
                                             for kind, qa, va, axis, jpos, offset, skew_t, skew2_t in body["joints"]])
                                for body in self._bodies]
            self._cache[key] = consts
        return self._cache[key]

    # ----------------------------------------------------------------------------------------- evaluation

    def _kinematics(self, q: Tensor, c: dict) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Body frames and motion subspaces, as ``mj_kinematics`` and ``mj_comPos`` compute them.

        ``q`` is batch-last (nq, B). Returns body centres of mass (nbody, 3, B), inertia frames Rᵀ (nbody, 3, 3, B) and
        each dof's spatial axis about the world origin as angular (nv, 3, B) and linear (nv, 3, B) parts. Only the
        chain of frames needs the loop over bodies (a child needs its parent's frame); everything per joint or per
        body that does not feed the chain (hinge sines, the axes' moments anchor × axis, centres of mass, inertia
        frames) is computed once for all joints or bodies, outside it.
        """
        batch = q.shape[-1]
        positions: list[Tensor] = []
        frames: list[Tensor] = []  # Rᵀ per body (see quat_to_frame)
        zeros = q.new_zeros(3, batch)
        ang: list[Tensor] = [zeros] * self.nv
        anchors: list[Tensor] = [zeros] * self.nv  # each dof's axis passes through its anchor: lin = anchor × ang
        direct: dict[int, Tensor] = {}  # translational dofs (slide, free): lin is the axis itself, ang = 0
        if self.hinge_qadr:
            angles = q[c["hinge_qadr"]] - c["hinge_qpos0"][:, None]
            sines, versines = torch.sin(angles).unbind(0), (1 - torch.cos(angles)).unbind(0)
        hinge = 0
        for b, body in enumerate(c["bodies"]):
            p = self.parent[b]
            if p < 0:
                pos = body["pos"][:, None].expand(3, batch)
                frame = body["rot_t"][..., None].expand(3, 3, batch).contiguous()
            else:
                pos = point(positions[p], frames[p], body["pos"]) if body["moved"] else positions[p]
                frame = frame_times(body["rot_t"], frames[p]) if body["rotated"] else frames[p]
            rotational: list[tuple[int, Tensor]] = []  # (first dof, anchor): axes are the body's final frame's
            for kind, qa, va, axis, jpos, offset, skews_t in body["joints"]:
                if kind == _FREE:
                    pos = q[qa:qa + 3]
                    frame = quat_to_frame(normalized(q[qa + 3:qa + 7]))
                    for k in range(3):
                        direct[va + k] = c["eye"][k][:, None].expand(3, batch)
                    rotational.append((va + 3, point(pos, frame, jpos) if offset else pos))
                    continue
                world_axis = point(None, frame, axis)
                anchor = point(pos, frame, jpos) if offset else pos
                if kind == _SLIDE:
                    pos = pos + world_axis * (q[qa] - c["qpos0"][qa])
                    direct[va] = world_axis
                elif kind == _HINGE:
                    # R·exp(θ[a]×) = R + sin θ·(R[a]×) + (1 − cos θ)·(R[a]×²), transposed: (R[a]×)ᵀ and (R[a]×²)ᵀ
                    # from one product with the stacked constants
                    both = frame_times(skews_t, frame)
                    frame = torch.addcmul(torch.addcmul(frame, sines[hinge], both[:3]), versines[hinge], both[3:])
                    hinge += 1
                    pos = point(anchor, frame, jpos, alpha=-1.0) if offset else anchor
                    ang[va], anchors[va] = world_axis, anchor
                else:  # ball
                    frame = frame_compose(frame, quat_to_frame(normalized(q[qa:qa + 4])))
                    pos = point(anchor, frame, jpos, alpha=-1.0) if offset else anchor
                    rotational.append((va, anchor))
            for va, anchor in rotational:
                axes = frame.unbind(0)  # the frame's rows are the body's axes
                for k in range(3):
                    ang[va + k], anchors[va + k] = axes[k], anchor
            positions.append(pos)
            frames.append(frame)
        position, frame_all = torch.stack(positions), torch.stack(frames)
        flat = frame_all.reshape(self.nbody, 3, 3 * batch)
        # com = p + R ipos and inertia frame (R R_i)ᵀ = R_iᵀ Rᵀ per body: one batched product each over all bodies
        com = torch.baddbmm(position.reshape(self.nbody, 1, -1), c["body_ipos"][:, None], flat).reshape(
            self.nbody, 3, batch) if self.any_ishifted else position
        inertia_frame = torch.bmm(c["body_irot_t"], flat).reshape(self.nbody, 3, 3, batch) if self.any_irotated \
            else frame_all
        ang_all = torch.stack(ang)
        lin = cross(torch.stack(anchors), ang_all)
        if direct:
            lin = lin + torch.stack([direct.get(k, zeros) for k in range(self.nv)])
        return com, inertia_frame, ang_all, lin

    def _body_inertia(self, com: Tensor, irot: Tensor, c: dict) -> tuple[Tensor, Tensor]:
        """Each body's first moment h = m·com (nbody, 3, B) and rotational inertia about the world origin
        I_O = R diag(I) Rᵀ + m(|c|² 1 − c cᵀ) (nbody, 3, 3, B); with the mass these are its spatial inertia
        [[I_O, [h]×], [−[h]×, m]] about the origin (Featherstone 2.62), so composites are plain sums."""
        mass = c["mass"][:, None, None]
        scaled = irot * c["inertia"][:, :, None, None]  # irot is the frame R_iᵀ: irot[l, j] = R_i[j, l]
        inertia_com = (scaled[:, :, :, None] * irot[:, :, None]).sum(1)  # Σ_l R_i[j, l] I_l R_i[k, l]
        outer = com[:, :, None] * com[:, None]
        parallel = (outer.diagonal(dim1=1, dim2=2).sum(-1)[:, None, None] * c["eye"][..., None] - outer)
        return mass * com, inertia_com + mass[..., None] * parallel

    @staticmethod
    def _apply_inertia(mass: Tensor, first: Tensor, rotational: Tensor, w: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Spatial inertia (m, h, I_O) times the motion (w, v): moment I_O w + h × v and force m v − h × w."""
        moment = (rotational * w[:, None]).sum(2) + cross(first, v)
        return moment, mass * v - cross(first, w)

    def _subtree_sums(self, x: Tensor) -> list[Tensor]:
        """Σ over each body's subtree of x (nbody, ...), as one leaf-to-root pass (Featherstone's backward pass):
        children come after their parents in MuJoCo's body order, so a reversed sweep adds each finished subtree
        into its parent. A few adds of (k, B) slices: cheaper than a dense 0/1 (nbody x nbody) GEMM."""
        totals = list(x.unbind(0))
        for b in range(self.nbody - 1, -1, -1):
            if self.parent[b] >= 0:
                totals[self.parent[b]] = totals[self.parent[b]] + totals[b]
        return totals

    def _per_dof(self, per_body: list[Tensor]) -> Tensor:
        """Stack body quantities (k, B) as one row per dof (nv, k, B), each dof taking its body's."""
        return torch.stack([per_body[b] for b in self._dof_body_list])

    def mass_matrix(self, qpos: Tensor) -> Tensor:
        """M(q) (B, nv, nv), armature included (``mj_fullM`` after ``mj_crb``)."""
        c = self._constants(qpos.device, qpos.dtype)
        com, irot, ang, lin = self._kinematics(qpos.t().contiguous(), c)
        return self._crba(*self._body_inertia(com, irot, c), ang, lin, c)

    def _crba(self, first: Tensor, rotational: Tensor, ang: Tensor, lin: Tensor, c: dict) -> Tensor:
        """Composite inertias are subtree sums (one common frame, one GEMM); M[i, j] = s_j · I^c_{body(i)} s_i on the
        tree's pairs only (MuJoCo's sparse pattern), then scattered into the dense (B, nv, nv) matrix."""
        nbody, batch = first.shape[0], first.shape[-1]
        composite = self._per_dof(self._subtree_sums(torch.cat((first, rotational.reshape(nbody, 9, batch)), 1)))
        moment, force = self._apply_inertia(c["composite_mass"][:, None, None], composite[:, :3],
                                            composite[:, 3:].reshape(-1, 3, 3, batch), ang, lin)
        applied = torch.cat((moment, force), 1)  # I^c s_i (nv, 6, B)
        axes = torch.cat((ang, lin), 1)  # s_j (nv, 6, B)
        # one product per dof i with the axes of its ancestors' dofs (a gather of all pairs at once would build a
        # (npairs, 6, B) temporary: ~40 MB for a humanoid at B = 4096 in fp64, slower than these nv small products)
        pairs = torch.cat([(applied[i] * axes[ancestors]).sum(1) for i, ancestors in c["pair_groups"]])
        pairs = pairs + c["pair_armature"][:, None]  # (npairs, B)
        # batch-first for the dense result: the pairs copied into the columns of their (i, j) and (j, i) entries
        # (a column scatter into zeros is several times cheaper than transposing the pairs and gathering columns)
        mass = pairs.new_zeros(batch, self.nv * self.nv)
        mass.index_copy_(1, c["pair_lower"], pairs.t())
        mass.index_copy_(1, c["pair_upper"], pairs.t())
        return mass.reshape(batch, self.nv, self.nv)

    def terms(self, qpos: Tensor, qvel: Tensor, ctrl: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """M (B, nv, nv), qfrc_bias, qfrc_passive, qfrc_actuator (B, nv) at a batch of states and controls."""
        c = self._constants(qpos.device, qpos.dtype)
        com, irot, ang, lin = self._kinematics(qpos.t().contiguous(), c)
        first, rotational = self._body_inertia(com, irot, c)
        mass = self._crba(first, rotational, ang, lin, c)
        bias = self._rnea(first, rotational, ang, lin, qvel.t().contiguous(), c)
        return mass, bias, self._passive(qpos, qvel, c), self._actuator(qpos, qvel, ctrl, c)

    def _rnea(self, first: Tensor, rotational: Tensor, ang: Tensor, lin: Tensor, rate: Tensor, c: dict) -> Tensor:
        """qfrc_bias = RNEA(q, q̇, q̈ = 0) with gravity as a root acceleration (``mj_rne`` with flg_acc = 0).

        Root-to-leaf passes give body velocities v_b = v_parent + Σ_{k on b} s_k q̇_k and accelerations
        a_b = a_parent + Σ_{k on b} ṡ_k q̇_k (root: −g); forces f_b = I_b a_b + v_b ×* I_b v_b for all bodies at once;
        a leaf-to-root pass sums them, and bias_i = s_i · Σ_{b in subtree(body(i))} f_b. ``rate`` is q̇ (nv, B)."""
        axes = torch.cat((ang, lin), 1)
        motion = axes * rate[:, None]  # s_k q̇_k (nv, 6, B)
        # forward pass, root to leaves: body velocities, and the velocity each dof's ṡ is taken with (its parent
        # body's plus the earlier joints' of its own body)
        velocity: list[Tensor] = []
        seen: list[Tensor] = []
        zero = motion.new_zeros(6, motion.shape[-1])
        for b, (start, count) in enumerate(self.body_dofs):
            inherited = velocity[self.parent[b]] if self.parent[b] >= 0 else zero
            own = motion[start:start + count]
            if count:
                block = c["earlier"][b]
                within = (block @ own.reshape(count, -1)).reshape(own.shape) if block is not None else None
                seen.append(inherited.expand_as(own) if within is None else inherited + within)
            velocity.append(inherited + own.sum(0) if count else inherited)
        seen_all = torch.cat(seen)
        w, v = seen_all[:, :3], seen_all[:, 3:]
        mw, mv = motion[:, :3], motion[:, 3:]
        dot = torch.cat((cross(w, mw), cross(w, mv) + cross(v, mw)), 1)  # ṡ_i q̇_i
        if self.has_free:  # a free joint's translation axes are fixed in the world: ṡ = 0
            dot = dot * c["keep_dot"][:, None, None]
        root = c["gravity"][:, None].expand(6, motion.shape[-1]) if self.gravity_on else zero
        accel: list[Tensor] = []
        for b, (start, count) in enumerate(self.body_dofs):
            inherited = accel[self.parent[b]] if self.parent[b] >= 0 else root
            accel.append(inherited + dot[start:start + count].sum(0) if count else inherited)
        velocity_all, accel_all = torch.stack(velocity), torch.stack(accel)
        mass = c["mass"][:, None, None]
        bw, bv = velocity_all[:, :3], velocity_all[:, 3:]
        hw, hv = self._apply_inertia(mass, first, rotational, bw, bv)  # momentum
        fw, fv = self._apply_inertia(mass, first, rotational, accel_all[:, :3], accel_all[:, 3:])
        body_force = torch.cat((fw + cross(bw, hw) + cross(bv, hv), fv + cross(bw, hv)), 1)
        subtree_force = self._per_dof(self._subtree_sums(body_force))  # (nv, 6, B)
        return (axes * subtree_force).sum(1).t()

    def _passive(self, qpos: Tensor, qvel: Tensor, c: dict) -> Tensor:
        passive = -c["damping"] * qvel if self.dampers_on else torch.zeros_like(qvel)
        if not self.springs_on:
            return passive
        if len(self._springs["lin_q"]):
            spring = c["spring_lin_k"] * (c["qpos_spring"][c["spring_lin_q"]] - qpos[:, c["spring_lin_q"]])
            passive = passive.index_add(1, c["spring_lin_v"], spring)
        for j, (qa, va) in enumerate(zip(self._springs["quat_q"], self._springs["quat_v"])):
            quat = qpos[:, qa:qa + 4]
            quat = quat / torch.linalg.vector_norm(quat, dim=-1, keepdim=True)
            inverse = quat * quat.new_tensor([1.0, -1.0, -1.0, -1.0])
            reference = c["qpos_spring"][qa:qa + 4]
            dif = quat_log(quat_mul(inverse, reference.expand_as(quat)))  # mju_subQuat(spring, q)
            passive = passive.index_add(1, c["spring_quat_v"][j] + torch.arange(3, device=qpos.device),
                                        c["spring_quat_k"][j] * dif)
        return passive

    def _actuator(self, qpos: Tensor, qvel: Tensor, ctrl: Tensor, c: dict) -> Tensor:
        if self.nu == 0:
            return torch.zeros_like(qvel)
        gear = c["act_gear"]
        ctrl = torch.maximum(torch.minimum(ctrl, c["act_ctrl_hi"]), c["act_ctrl_lo"])
        length = gear * (qpos[:, c["act_qadr"]])
        velocity = gear * qvel[:, c["act_vadr"]]
        bias = c["act_bias"]
        force = c["act_gain"] * ctrl + bias[:, 0] + bias[:, 1] * length + bias[:, 2] * velocity
        force = torch.maximum(torch.minimum(force, c["act_force_hi"]), c["act_force_lo"])
        return torch.zeros_like(qvel).index_add(1, c["act_vadr"], gear * force)


def _skew(v: np.ndarray) -> np.ndarray:
    return np.array([[0.0, -v[2], v[1]], [v[2], 0.0, -v[0]], [-v[1], v[0], 0.0]])
