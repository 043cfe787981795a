"""Domain randomisation of a MuJoCo task's contacts and masses, redrawn every episode (the ``randomize`` change of
``envs.control.changes``; the LIFT-kind task that pretrains under it: ``envs.control.lift_kind``).

LIFT pretrains on a randomised simulator (bigai-ai/LIFT-humanoid@32fab57,
``mujoco_playground/_src/locomotion/t1_12dof_sim_finetune/randomize.py:30-61``): floor friction drawn from
U(0.2, 0.6) around the scene's 0.6 (``t1_12dof/xmls/scene_mjx_feetonly_flat_terrain.xml:23``), every link mass
x U(0.98, 1.02), and the torso (``Trunk``, 19.4304 kg, ``t1_mjx_feetonly.xml:127``) +U(-1, 1) kg on top. Written down
here as ratios of the nominal model, so they carry to another robot:

    friction     x U(1/3, 1)              (0.2 / 0.6 .. 0.6 / 0.6)
    link masses  x U(0.98, 1.02)          (each body its own draw)
    torso mass   + U(-0.0515, 0.0515) x its nominal mass   (1 kg / 19.4304 kg)

Only these two physical families are randomised (the issue's "friction and link masses"); LIFT's other draws (joint
friction loss, armature, qpos0, PD gains, damping) have no counterpart in a torque-driven gymnasium Walker2d or are
left out on purpose: a rigid-body change *outside* what pretraining randomised must exist for the study. As LIFT,
masses change without their inertia.
"""
from __future__ import annotations

import gymnasium as gym
import mujoco
import numpy as np
from gymnasium.utils import RecordConstructorArgs

# The official relative ranges (see the module docstring for where each comes from).
LIFT_FRICTION_SCALE = (0.2 / 0.6, 1.0)
LIFT_LINK_MASS_SCALE = (0.98, 1.02)
LIFT_TORSO_MASS_ADD = (-1.0 / 19.4304, 1.0 / 19.4304)  # x the torso's nominal mass


def lift_randomization() -> dict:
    """The ``randomize`` change's parameters with LIFT's relative ranges."""
    return {"friction_scale": list(LIFT_FRICTION_SCALE), "link_mass_scale": list(LIFT_LINK_MASS_SCALE),
            "torso_mass_add": list(LIFT_TORSO_MASS_ADD)}


def _interval(name: str, value) -> tuple[float, float]:
    low, high = (float(v) for v in value)
    if not low <= high:
        raise ValueError(f"randomize: {name} must be [low, high] with low <= high, got {value}")
    return low, high


class DomainRandomization(gym.Wrapper, RecordConstructorArgs):
    """At every reset: sliding friction of every geom x one draw of ``friction_scale`` (MuJoCo
    takes the larger of a contact pair's, so scaling all scales the pair's), each body's mass x its own draw of
    ``link_mass_scale``, and the torso's + a draw of ``torso_mass_add`` x its nominal mass. Draws come from the env's
    seeded generator; ``info["randomization"]`` says what this episode got."""

    def __init__(self, env: gym.Env, friction_scale=LIFT_FRICTION_SCALE, link_mass_scale=LIFT_LINK_MASS_SCALE,
                 torso_mass_add=LIFT_TORSO_MASS_ADD, torso: str = "torso") -> None:
        base = env.unwrapped
        if not hasattr(base, "model"):
            raise ValueError(f"change 'randomize' needs a MuJoCo env, got {base.spec.id if base.spec else base}")
        RecordConstructorArgs.__init__(self, friction_scale=tuple(friction_scale),
                                       link_mass_scale=tuple(link_mass_scale), torso_mass_add=tuple(torso_mass_add),
                                       torso=torso)
        gym.Wrapper.__init__(self, env)
        self.friction_scale = _interval("friction_scale", friction_scale)
        self.link_mass_scale = _interval("link_mass_scale", link_mass_scale)
        self.torso_mass_add = _interval("torso_mass_add", torso_mass_add)
        if self.friction_scale[0] <= 0 or self.link_mass_scale[0] <= 0:
            raise ValueError("randomize: friction and mass scales must stay positive")
        model = base.model
        self.torso_id = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, torso)
        if self.torso_id < 0:
            raise ValueError(f"randomize: body {torso!r} not found in {base.spec.id if base.spec else base}")
        # the nominal values every draw starts from (the wrappers below may have edited the model already)
        self.nominal_friction = np.array(model.geom_friction[:, 0])
        self.nominal_mass = np.array(model.body_mass)
        self.scratch = mujoco.MjData(model)

    def draw(self) -> dict:
        rng = self.env.unwrapped.np_random
        friction = float(rng.uniform(*self.friction_scale))
        masses = rng.uniform(*self.link_mass_scale, size=len(self.nominal_mass))
        torso_add = float(rng.uniform(*self.torso_mass_add))
        model = self.env.unwrapped.model
        model.geom_friction[:, 0] = self.nominal_friction * friction
        body_mass = self.nominal_mass * masses
        body_mass[self.torso_id] += torso_add * self.nominal_mass[self.torso_id]
        model.body_mass[:] = body_mass
        mujoco.mj_setConst(model, self.scratch)  # subtree masses and the like follow the new masses
        return {"friction_scale": friction, "torso_mass": float(body_mass[self.torso_id]),
                "mass_scale": masses.tolist()}

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        # the env's reset first (it seeds the stream the draw takes from); a Walker2d's first observation is its
        # qpos/qvel, which the new masses do not touch, and the next mj_step computes everything else with them
        obs, info = self.env.reset(seed=seed, options=options)
        info["randomization"] = self.draw()
        return obs, info
