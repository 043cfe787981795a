"""The numbers of an ``mjModel`` that the batched rigid-body prior reads, as plain numpy arrays (no MuJoCo needed).

``ModelTables.from_mujoco(model)`` reads them (and refuses a model with anything the prior does not model);
``save``/``load`` keep them in one ``.npz``, so ``envs.control.rigid_body.RigidBodyDynamics`` runs where MuJoCo is not
installed (a lent GPU machine: ``benchmarks/gpu/physics.py``). Field names are MjModel's; the few derived entries
are MuJoCo's own results where the prior needs them: body frames as rotation matrices (``mju_quat2Mat``) and the
disable flags resolved for this MuJoCo version (mujoco >= 3.3 split ``mjDSBL_PASSIVE`` into SPRING and DAMPER).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

# mjtJoint, mjtTrn, mjtDyn, mjtGain and mjtBias values (MuJoCo's mjmodel.h; stable since 2.x)
FREE, BALL, SLIDE, HINGE = 0, 1, 2, 3
TRN_JOINT, DYN_NONE, GAIN_FIXED, BIAS_NONE, BIAS_AFFINE = 0, 0, 0, 0, 1

MODEL_FIELDS = (
    "nq", "nv", "nu", "nbody", "njnt",
    "body_parentid", "body_jntadr", "body_jntnum", "body_dofadr", "body_dofnum", "body_mass", "body_inertia",
    "body_pos", "body_ipos",
    "jnt_type", "jnt_qposadr", "jnt_dofadr", "jnt_axis", "jnt_pos", "jnt_stiffness",
    "dof_bodyid", "dof_armature", "dof_damping", "qpos0", "qpos_spring",
    "actuator_trnid", "actuator_gear", "actuator_gainprm", "actuator_biasprm", "actuator_biastype",
    "actuator_ctrlrange", "actuator_ctrllimited", "actuator_forcelimited", "actuator_forcerange",
)
DERIVED_FIELDS = ("gravity", "body_rot", "body_irot", "springs_on", "dampers_on", "gravity_on", "clamp_ctrl")


class ModelTables:
    """An ``mjModel``'s tables for ``RigidBodyDynamics``, read like the model (``tables.body_mass``)."""

    def __init__(self, arrays: dict[str, np.ndarray]) -> None:
        lacking = sorted(set(MODEL_FIELDS + DERIVED_FIELDS) - arrays.keys())
        if lacking:
            raise ValueError(f"model tables lack {lacking}: export them again with ModelTables.from_mujoco")
        self._arrays = {k: np.asarray(arrays[k]) for k in MODEL_FIELDS + DERIVED_FIELDS}

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["_arrays"][name]
        except KeyError:
            raise AttributeError(name) from None

    def arrays(self, prefix: str = "") -> dict[str, np.ndarray]:
        return {prefix + k: v for k, v in self._arrays.items()}

    @classmethod
    def from_mujoco(cls, model) -> "ModelTables":
        """Read ``model``'s tables (MuJoCo must be importable here); refuses what the prior does not model."""
        import mujoco
        check_supported(model)
        arrays = {k: np.array(getattr(model, k)) for k in MODEL_FIELDS}

        def frames(quats: np.ndarray) -> np.ndarray:
            out = np.zeros((len(quats), 9))
            for i, q in enumerate(quats):
                mujoco.mju_quat2Mat(out[i], np.asarray(q, dtype=np.float64) / np.linalg.norm(q))
            return out.reshape(-1, 3, 3)
        disabled = int(model.opt.disableflags)
        bits = mujoco.mjtDisableBit
        spring_bit = getattr(bits, "mjDSBL_SPRING", None) or getattr(bits, "mjDSBL_PASSIVE")
        damper_bit = getattr(bits, "mjDSBL_DAMPER", None) or getattr(bits, "mjDSBL_PASSIVE")
        arrays.update(gravity=np.array(model.opt.gravity), body_rot=frames(model.body_quat),
                      body_irot=frames(model.body_iquat), springs_on=np.array(not disabled & int(spring_bit)),
                      dampers_on=np.array(not disabled & int(damper_bit)),
                      gravity_on=np.array(not disabled & int(bits.mjDSBL_GRAVITY)),
                      clamp_ctrl=np.array(not disabled & int(bits.mjDSBL_CLAMPCTRL)))
        return cls(arrays)

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], prefix: str = "") -> "ModelTables":
        """The tables saved under ``prefix`` in a mapping (an opened ``.npz`` holding several models)."""
        return cls({k[len(prefix):]: arrays[k] for k in arrays.keys() if k.startswith(prefix)})

    def save(self, path: Path) -> None:
        np.savez_compressed(path, **self._arrays)

    @classmethod
    def load(cls, path: Path) -> "ModelTables":
        with np.load(path) as data:
            return cls({k: data[k] for k in data.files})


def check_supported(model) -> None:
    """Raise ``NotImplementedError`` naming every feature of ``model`` that the prior would silently leave out."""
    problems = []
    if model.ntendon and (np.any(model.tendon_stiffness) or np.any(model.tendon_damping)):
        problems.append("tendon stiffness/damping")
    if model.opt.density or model.opt.viscosity:
        problems.append("fluid forces (density/viscosity)")
    if np.any(model.body_gravcomp):
        problems.append("gravity compensation")
    if np.any(model.body_mocapid[1:] >= 0):
        problems.append("mocap bodies")
    if np.any(model.jnt_actfrclimited):
        problems.append("joint actuator force limits")
    for b in range(1, model.nbody):
        jnt = range(model.body_jntadr[b], model.body_jntadr[b] + model.body_jntnum[b])
        if any(model.jnt_type[j] == FREE for j in jnt) and (model.body_parentid[b] != 0 or len(jnt) > 1):
            problems.append("free joint not alone in a child of the world")
    for a in range(model.nu):
        if int(model.actuator_trntype[a]) != TRN_JOINT:
            problems.append(f"actuator {a}: transmission other than a joint")
        elif model.jnt_type[model.actuator_trnid[a, 0]] not in (HINGE, SLIDE):
            problems.append(f"actuator {a}: on a free or ball joint")
        if int(model.actuator_dyntype[a]) != DYN_NONE:
            problems.append(f"actuator {a}: activation dynamics")
        if int(model.actuator_gaintype[a]) != GAIN_FIXED:
            problems.append(f"actuator {a}: gain other than fixed")
        if int(model.actuator_biastype[a]) not in (BIAS_NONE, BIAS_AFFINE):
            problems.append(f"actuator {a}: bias other than none/affine")
    if problems:
        raise NotImplementedError("RigidBodyDynamics does not model: " + ", ".join(sorted(set(problems))))
