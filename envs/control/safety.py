"""Safety figures of what a robot did in the real env, from its recorded physics states (LIFT's claim is "safer"
finetuning: a walker that falls less and never drives its joints to their stops or flails them).

``JointSafety.from_env(env).measure(qpos, qvel)`` over a batch of recorded states gives:
  joint_excursion   max over limited hinge/slide joints of how far q went past its stop (rad or m; 0 inside the
                    range): MuJoCo limits are soft constraints, so a joint driven hard into its stop goes past it
                    (a walker's straight knee sits at its stop, so distance to the stop would say nothing)
  joint_speed       max |q̇| of the actuated joints (rad/s)
  torso_tilt        max |pitch| of a planar walker's root (``rooty``; rad), NaN for tasks without one
Falls (terminations) are counted by the env sampler; per 1000 real steps they are the headline figure.
"""
from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym
import mujoco
import numpy as np


@dataclass(frozen=True)
class JointSafety:
    limited_qpos: np.ndarray  # qpos addresses of limited hinge/slide joints
    low: np.ndarray
    high: np.ndarray
    actuated_qvel: np.ndarray  # qvel addresses of the actuated joints
    tilt_qpos: int | None  # qpos address of a planar root's pitch (``rooty``)

    @classmethod
    def from_env(cls, env: gym.Env) -> "JointSafety":
        model = env.unwrapped.model
        limited, low, high = [], [], []
        for j in range(model.njnt):
            kind = int(model.jnt_type[j])
            if model.jnt_limited[j] and kind in (int(mujoco.mjtJoint.mjJNT_HINGE), int(mujoco.mjtJoint.mjJNT_SLIDE)):
                limited.append(model.jnt_qposadr[j])
                low.append(model.jnt_range[j, 0])
                high.append(model.jnt_range[j, 1])
        actuated = sorted({int(model.jnt_dofadr[j]) for j, kind in zip(model.actuator_trnid[:, 0], model.actuator_trntype)
                           if int(kind) == int(mujoco.mjtTrn.mjTRN_JOINT)})
        tilt = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_JOINT, "rooty")
        return cls(np.asarray(limited, dtype=np.int64), np.asarray(low), np.asarray(high),
                   np.asarray(actuated, dtype=np.int64), int(model.jnt_qposadr[tilt]) if tilt >= 0 else None)

    def measure(self, qpos: np.ndarray, qvel: np.ndarray) -> dict[str, float]:
        """The batch's worst excursion, joint speed and torso tilt (NaN where the task has none or no rows)."""
        qpos, qvel = np.asarray(qpos, dtype=np.float64), np.asarray(qvel, dtype=np.float64)
        out = {"joint_excursion": float("nan"), "joint_speed": float("nan"), "torso_tilt": float("nan")}
        if len(qpos) == 0:
            return out
        if len(self.limited_qpos):
            q = qpos[:, self.limited_qpos]
            out["joint_excursion"] = float(np.maximum(np.maximum(q - self.high, self.low - q), 0.0).max())
        if len(self.actuated_qvel):
            out["joint_speed"] = float(np.abs(qvel[:, self.actuated_qvel]).max())
        if self.tilt_qpos is not None:
            out["torso_tilt"] = float(np.abs(qpos[:, self.tilt_qpos]).max())
        return out
