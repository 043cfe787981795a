"""A hand-made MuJoCo model with every joint kind, and random states on any model: what the rigid-body prior is
checked against (``tests/test_rigid_body.py`` here, ``benchmarks/gpu/physics.py`` on a GPU, from tables exported
with both)."""
from __future__ import annotations

import mujoco
import numpy as np

# every joint kind, several joints on one body, springs on free/ball/hinge/slide, an off-centre joint anchor,
# tilted body and inertia frames, affine-biased (position) and force-limited actuators, and a second tree
HAND_XML = """
<mujoco>
  <option gravity="0.3 -0.2 -9.81"/>
  <worldbody>
    <body name="root" pos="0.1 0.2 1" quat="0.9 0.1 0.3 0.2">
      <joint name="free" type="free" stiffness="3" damping="0.4" armature="0.05"/>
      <geom type="box" size=".2 .1 .05" mass="2"/>
      <body name="ball" pos="0.3 0 0" euler="10 20 30">
        <joint name="ball" type="ball" pos="-0.05 0.02 0" stiffness="1.5" damping="0.2" armature="0.01"/>
        <geom type="capsule" fromto="0 0 0 0.3 0.1 0" size="0.04" mass="0.7"/>
        <body name="two" pos="0.3 0.1 0">
          <joint name="slide" type="slide" axis="0.3 1 0.2" stiffness="4" springref="0.1" damping="0.3"/>
          <joint name="hinge" type="hinge" axis="1 0.2 -0.4" pos="0.02 0 0.05" stiffness="2" springref="0.2"
                 damping="0.1" armature="0.02"/>
          <geom type="ellipsoid" size=".1 .05 .03" pos="0.05 0.02 0" euler="5 40 7" mass="0.5"/>
        </body>
      </body>
    </body>
    <body name="arm" pos="0 0 0.5">
      <joint name="h1" type="hinge" axis="0 1 0" pos="0 0 0.1"/>
      <geom type="capsule" fromto="0 0 0 0.4 0 0" size="0.05"/>
      <body name="forearm" pos="0.4 0 0">
        <joint name="h2" type="hinge" axis="0 0.6 0.8" damping="0.5"/>
        <joint name="s2" type="slide" axis="1 0 0"/>
        <geom type="capsule" fromto="0 0 0 0.3 0 0" size="0.04"/>
      </body>
    </body>
  </worldbody>
  <actuator>
    <motor joint="hinge" gear="2.5" ctrlrange="-1 1" ctrllimited="true"/>
    <motor joint="slide" gear="0.7" forcerange="-0.5 0.5" forcelimited="true"/>
    <position joint="h1" kp="3" ctrlrange="-1 1" ctrllimited="true"/>
    <velocity joint="h2" kv="0.8"/>
    <motor joint="s2" gear="1.3"/>
  </actuator>
</mujoco>
"""


def random_states(model: mujoco.MjModel, n: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """qpos around qpos0 with uniformly random unit quaternions, normal qvel, ctrl beyond the ranges (clamping)."""
    rng = np.random.default_rng(seed)
    qpos = model.qpos0 + rng.normal(scale=0.7, size=(n, model.nq))
    for j in range(model.njnt):
        kind = int(model.jnt_type[j])
        if kind in (int(mujoco.mjtJoint.mjJNT_FREE), int(mujoco.mjtJoint.mjJNT_BALL)):
            start = model.jnt_qposadr[j] + (3 if kind == int(mujoco.mjtJoint.mjJNT_FREE) else 0)
            quat = rng.normal(size=(n, 4))
            qpos[:, start:start + 4] = quat / np.linalg.norm(quat, axis=1, keepdims=True)
    qvel = rng.normal(scale=2.0, size=(n, model.nv))
    ctrl = rng.uniform(-1.5, 1.5, size=(n, model.nu))
    return qpos, qvel, ctrl
