"""LIFT stage (ii): a physics-informed world model (SSRL-style) and the black-box MBPO ensemble it is compared with.

Physics-informed model (LIFT §2.1–2.2, Levy et al. 2024). For state s = (q, q̇) and action a, with the exact rigid-body
prior of a ``RigidBodyPrior`` (``minv_h = (M + hD)^-1``, ``force = τ_act + τ_passive − c``, frozen over the control
step) and a learned residual generalised force τ_θ(s, a) with a state-space log-variance:

    q̈ = minv_h (force + τ_θ(s, a));   K substeps:  q̇ ← q̇ + h q̈,  q ← q ⊕ h q̇          (semi-implicit Euler)

The mean goes through the integrator (gradients flow through it); the variance is predicted directly in state space.
``prior_mode="substep"`` recomputes the prior at every substep (on detached states, τ_θ held fixed), for coarse
control steps such as HalfCheetah's.

Black-box model (MBPO; LIFT's ``ssrl_dynamics_fn='mbpo'``): s' = s + Δ_θ(s, a) from an ensemble of MLPs.

Both share the loss (Gaussian NLL of the next state, H-step open-loop with the recorded actions, masked after the first
termination; LIFT's ``model_loss_horizon``), ``predict`` and ``rollout``; ``algos.lift.world_model_training`` fits
them. The state is the concatenation [qpos, qvel]; translation coordinates (gymnasium's ``exclude_current_positions``)
are predicted but not fed to the networks. This module makes no MuJoCo calls: the prior comes in through the
``RigidBodyPrior`` protocol (``envs.control.mujoco_prior.MujocoPrior``).

Integrator: the model always integrates with semi-implicit Euler at the simulator's step h, K = frame_skip substeps;
on gymnasium's RK4 tasks (Walker2d, Humanoid, InvertedPendulum) the residual absorbs the difference (the best
constant residual leaves a normalized 1-step floor of 1.5e-4 on Walker2d, vs 3e-5 with ``set_euler``, against learned
errors of ~2e-2).

Measured on 2 loaded CPU cores (3 × 200 swish, batch 200, Adam 1e-3, H = 1, 1000 steps, random-action data; errors
are ``world_model_training.multistep_errors``, i.e. MSE in units of the state's std, translation coordinates excluded):
  Walker2d, 3000 transitions, seeds 0/1/2, physics vs black box
    held-out episodes, same action process: 1-step 0.021/0.025/0.019 vs 0.021/0.024/0.022,
                                            10-step 0.227/0.259/0.203 vs 0.215/0.248/0.237   (a tie)
    held-out episodes, smoother actions:    10-step 0.289/0.231/0.274 vs 0.375/0.355/0.462  (physics 23–41% lower)
    with a 4-step loss (600 steps, 2 seeds), same action process 10-step: 0.196/0.173 vs 0.214/0.224
  HalfCheetah (h = 0.01 × 5), 5000 transitions: frozen prior loses (1-step 0.096 vs 0.056, 10-step 0.42 vs 0.20);
    ``prior_mode="substep"`` wins at 1 step (0.046 vs 0.056), ties at 10 (0.205 vs 0.203), and wins on smoother
    actions (10-step 0.107 vs 0.148).
  Cost per Adam step (Walker2d, batch 200): physics ≈ 7 ms (≈ 2–3 ms of it MuJoCo prior terms), black box ≈ 3.3 ms.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from algos.lift.integration import RigidBodyPrior, integrate_positions, normalize_quaternions
from algos.nets import EnsembleMLP

Tensor = torch.Tensor


@dataclass
class WorldModelConfig:
    """Model and training settings; defaults are LIFT's (§2.2–2.3) with smaller networks for CPU."""

    hidden_sizes: tuple[int, ...] = (200, 200, 200)  # LIFT: 4 × 400
    ensemble_size: int = 1  # LIFT physics model: 1; MBPO: 5–7
    weight_decay: tuple[float, ...] = (2.5e-5, 5e-5, 7.5e-5, 7.5e-5, 1e-4)  # L2 per layer (last value repeats)
    min_logvar: float = -10.0
    max_logvar: float = 0.5
    prior_mode: str = "frozen"  # "frozen" (LIFT) or "substep"
    autocast_bf16: bool = False  # bf16 for the network only; the integration stays in the state dtype
    lr: float = 1e-3
    batch_size: int = 200
    train_steps: int = 3000  # maximum number of gradient steps per ``train_world_model`` call
    loss_horizon: int = 1  # H of the multi-step loss (LIFT: 1 pretraining, 4 finetuning)
    holdout_fraction: float = 0.2  # share held out for early stopping and the reported errors
    # "episodes": whole episodes held out (unseen states); "transitions": a random share of the rows (LIFT's
    # ``process_data``: a permutation of the env buffer, 20 % test)
    holdout_split: str = "episodes"
    eval_horizon: int = 10  # the "10-step" error
    eval_every: int = 250  # gradient steps between hold-out evaluations; 0: one pass over the training windows
    max_eval_windows: int = 1000
    normalizer_rows: int = 5000  # transitions used to fit the input/output scalers
    seed: int = 0

    def __post_init__(self) -> None:
        self.hidden_sizes = tuple(int(h) for h in self.hidden_sizes)
        self.weight_decay = tuple(float(w) for w in self.weight_decay)
        if not self.hidden_sizes or min(self.hidden_sizes) <= 0:
            raise ValueError(f"hidden_sizes must be non-empty and positive, got {self.hidden_sizes}")
        if not self.weight_decay or min(self.weight_decay) < 0:
            raise ValueError(f"weight_decay must be non-empty and non-negative, got {self.weight_decay}")
        if self.ensemble_size < 1:
            raise ValueError(f"ensemble_size must be >= 1, got {self.ensemble_size}")
        if not self.min_logvar < self.max_logvar:
            raise ValueError(f"min_logvar must be < max_logvar, got {self.min_logvar}, {self.max_logvar}")
        if self.prior_mode not in ("frozen", "substep"):
            raise ValueError(f"prior_mode must be 'frozen' or 'substep', got {self.prior_mode!r}")
        for name in ("lr",):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.holdout_split not in ("episodes", "transitions"):
            raise ValueError(f"holdout_split must be 'episodes' or 'transitions', got {self.holdout_split!r}")
        if self.eval_every < 0:
            raise ValueError(f"eval_every must be >= 0 (0: once per pass over the data), got {self.eval_every}")
        for name in ("batch_size", "train_steps", "loss_horizon", "eval_horizon", "max_eval_windows",
                     "normalizer_rows"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0.0 < self.holdout_fraction < 1.0:
            raise ValueError(f"holdout_fraction must be in (0, 1), got {self.holdout_fraction}")


# ----------------------------------------------------------------------------------------------------------- networks

def ensemble_l2_penalty(net: EnsembleMLP, coefficients: Sequence[float]) -> Tensor:
    """Σ_l c_l · ½‖W_l‖² (MBPO's per-layer decay of LIFT's ``EnsembleDense``; the last coefficient repeats for deeper
    nets). Biases are not decayed."""
    total = net.layers[0].weight.new_zeros(())
    for i, layer in enumerate(net.layers):
        total = total + coefficients[min(i, len(coefficients) - 1)] * 0.5 * layer.weight.square().sum()
    return total


def soft_clamp(x: Tensor, low: float, high: float) -> Tensor:
    """Smooth clamp of the log-variance to [low, high] (PETS/MBPO, LIFT's [−10, 0.5])."""
    x = high - F.softplus(high - x)
    return low + F.softplus(x - low)


# -------------------------------------------------------------------------------------------------------------- models

class WorldModel(nn.Module):
    """Shared machinery: scalers, ensemble network, NLL loss, prediction and rollouts.

    Subclasses implement ``_members(state, action, shared_state)`` → (next-state mean, normalized log-variance), both
    (E, B, D); the log-variance is of the error in units of the one-step change's std (``delta_std``).
    """

    def __init__(self, nq: int, nv: int, action_dim: int, head_dim: int, cfg: WorldModelConfig,
                 translation_qpos: Sequence[int] = ()) -> None:
        super().__init__()
        self.cfg, self.nq, self.nv, self.action_dim = cfg, nq, nv, action_dim
        self.state_dim = nq + nv
        observed = [i for i in range(self.state_dim) if i not in set(translation_qpos)]
        self.register_buffer("observed", torch.tensor(observed, dtype=torch.long))
        metric_mask = torch.ones(self.state_dim)
        metric_mask[list(translation_qpos)] = 0.0
        self.register_buffer("metric_mask", metric_mask)
        in_dim = len(observed) + action_dim
        for name, size in (("input_mean", in_dim), ("delta_mean", self.state_dim), ("state_mean", self.state_dim)):
            self.register_buffer(name, torch.zeros(size))
        for name, size in (("input_std", in_dim), ("delta_std", self.state_dim), ("state_std", self.state_dim)):
            self.register_buffer(name, torch.ones(size))
        # LIFT's EnsembleDense: swish, per-member LeCun-uniform weights, zero biases; the head stays in fp32 under bf16.
        self.net = EnsembleMLP(cfg.ensemble_size, in_dim, cfg.hidden_sizes, head_dim, "swish", fp32_output=True)

    # --- scalers
    @torch.no_grad()
    def fit_normalizers(self, batch: Mapping[str, Tensor]) -> None:
        """Per-dimension mean/std of the network input, the state and the one-step change (LIFT refits per dataset)."""
        state = torch.cat((batch["qpos"], batch["qvel"]), -1)
        next_state = torch.cat((batch["next_qpos"], batch["next_qvel"]), -1)
        inputs = torch.cat((state.index_select(-1, self.observed), batch["action"]), -1)
        for prefix, values in (("input", inputs), ("state", state), ("delta", next_state - state)):
            getattr(self, f"{prefix}_mean").copy_(values.mean(0))
            getattr(self, f"{prefix}_std").copy_(values.std(0).clamp_min(1e-6))

    @torch.no_grad()
    def refit_normalizers(self, batch: Mapping[str, Tensor], inputs: bool = True) -> None:
        """``fit_normalizers`` on ``batch``, then rewrite the network's first and last layers so that every predicted
        mean is unchanged (and the predicted variance, up to the log-variance's soft clamp).

        LIFT refits its scalers on the new environment's data at every retraining. Refitting alone would change what
        the warm-started network predicts; this keeps the function and changes only the units it learns in: an output
        that must grow to many of its old standard deviations (a residual force under a changed contact or mass) is a
        few of the new ones. ``inputs=False`` refits the output scalers only and keeps the input (and state) units."""
        in_mean, in_std = self.input_mean.clone(), self.input_std.clone()
        state_mean, state_std = self.state_mean.clone(), self.state_std.clone()
        head, old_mean, old_std = self._scaled_head()
        old_mean, old_std, old_delta_std = old_mean.clone(), old_std.clone(), self.delta_std.clone()
        self.fit_normalizers(batch)
        if not inputs:
            for name, value in (("input_mean", in_mean), ("input_std", in_std), ("state_mean", state_mean),
                                ("state_std", state_std)):
                getattr(self, name).copy_(value)
        first, last = self.net.layers[0], self.net.layers[-1]
        # x_old = (x - m0)/s0 = x_new s1/s0 + (m1 - m0)/s0 for x_new = (x - m1)/s1
        shift = ((self.input_mean - in_mean) / in_std).to(first.weight.dtype)
        first.bias += (shift @ first.weight).unsqueeze(-2)
        first.weight *= (self.input_std / in_std).to(first.weight.dtype)[:, None]
        # y_new = (m0 + s0 y_old - m1)/s1 on the scaled head dims
        _, new_mean, new_std = self._scaled_head()
        last.weight[..., head] *= (old_std / new_std).to(last.weight.dtype)
        last.bias[..., head] = ((last.bias[..., head] * old_std + old_mean - new_mean) / new_std).to(last.bias.dtype)
        # variance in state units = exp(logvar) delta_std^2
        last.bias[..., self._logvar_head()] += (2.0 * torch.log(old_delta_std / self.delta_std)).to(last.bias.dtype)

    def _scaled_head(self) -> tuple[slice, Tensor, Tensor]:
        """The head dims that are scaled, and their (mean, std) scalers."""
        raise NotImplementedError

    def _logvar_head(self) -> slice:
        return slice(self.net.layers[-1].out_features - self.state_dim, None)

    def _net(self, state: Tensor, action: Tensor) -> Tensor:
        # index_select, not state[..., observed]: a state on another device than the model fails here, on
        # every device, naming both (plain indexing moves a CPU state's index silently on some builds)
        x = (torch.cat((state.index_select(-1, self.observed), action), -1) - self.input_mean) / self.input_std
        # bf16 for the hidden layers only (CPU AMX); a float64 model ignores the flag (its head cannot run in fp32).
        bf16 = self.cfg.autocast_bf16 and self.net.layers[0].weight.dtype == torch.float32
        with torch.autocast(device_type=x.device.type, dtype=torch.bfloat16, enabled=bf16):
            out = self.net(x)
        return out.to(state.dtype)

    def _logvar(self, raw: Tensor) -> Tensor:
        return soft_clamp(raw, self.cfg.min_logvar, self.cfg.max_logvar)

    def _members(self, state: Tensor, action: Tensor, shared_state: bool) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    # --- prediction
    def predict(self, state: Tensor, action: Tensor, member: str = "mean") -> tuple[Tensor, Tensor]:
        """Next-state mean and log-variance (state units), both (B, D), for states [qpos, qvel] (B, D).

        ``member="mean"``: ensemble mean with the total variance (mean of variances + variance of means);
        ``member="random"``: one member per sample (MBPO rollouts).
        """
        ensemble = self.cfg.ensemble_size
        mean, logvar = self._members(state.expand(ensemble, *state.shape), action.expand(ensemble, *action.shape),
                                     shared_state=True)
        var = logvar.exp() * self.delta_std.square()
        if ensemble == 1:
            return mean[0], var[0].log()
        if member == "random":
            pick = torch.randint(ensemble, state.shape[:1], device=state.device)
            rows = torch.arange(state.shape[0], device=state.device)
            return mean[pick, rows], var[pick, rows].log()
        if member != "mean":
            raise ValueError(f"member must be 'mean' or 'random', got {member!r}")
        return mean.mean(0), (var.mean(0) + mean.var(0, unbiased=False)).log()

    # --- loss
    def loss(self, batch: Mapping[str, Tensor], horizon: int | None = None) -> tuple[Tensor, dict[str, float]]:
        """H-step Gaussian NLL with the recorded actions, masked after the first termination (LIFT §2.2).

        ``batch``: qpos (B, nq), qvel (B, nv) at the window start; action (B, H, A); next_qpos (B, H, nq);
        next_qvel (B, H, nv); terminated (B, H); optional ``valid`` (B, H) for windows cut by the episode end.
        Single-step tensors without the H axis are accepted. Gradients flow through the integration and, for H > 1,
        through the predicted states.
        """
        seq = dict(batch)
        for key, step_dim in (("action", 2), ("next_qpos", 2), ("next_qvel", 2), ("terminated", 1), ("valid", 1)):
            if key in seq and seq[key].dim() == step_dim:
                seq[key] = seq[key].unsqueeze(1)
        steps = seq["action"].shape[1] if horizon is None else horizon
        if steps > seq["action"].shape[1]:
            raise ValueError(f"horizon {steps} exceeds the batch's {seq['action'].shape[1]} steps")
        ensemble = self.cfg.ensemble_size
        state = torch.cat((seq["qpos"], seq["qvel"]), -1).expand(ensemble, -1, -1)
        alive = seq["valid"][:, 0].to(state.dtype) if "valid" in seq else torch.ones_like(state[0, :, 0])
        nll_sum = mse_sum = weight_sum = state.new_zeros(())
        for k in range(steps):
            action = seq["action"][:, k].expand(ensemble, -1, -1)
            mean, logvar = self._members(state, action, shared_state=k == 0)
            target = torch.cat((seq["next_qpos"][:, k], seq["next_qvel"][:, k]), -1)
            err = (mean - target) / self.delta_std
            nll = (torch.exp(-logvar) * err.square() + logvar).mean(-1)  # (E, B)
            nll_sum = nll_sum + (nll * alive).sum()
            mse_sum = mse_sum + (err.detach().square().mean(-1) * alive).sum()
            weight_sum = weight_sum + alive.sum() * ensemble
            alive = alive * (1.0 - seq["terminated"][:, k].to(state.dtype))
            if "valid" in seq and k + 1 < steps:
                alive = alive * seq["valid"][:, k + 1].to(state.dtype)
            state = mean
        nll = nll_sum / weight_sum.clamp_min(1.0)
        total = nll + ensemble_l2_penalty(self.net, self.cfg.weight_decay)
        return total, {"nll": nll.item(), "normalized_mse": (mse_sum / weight_sum.clamp_min(1.0)).item()}

    # --- rollouts
    @torch.no_grad()
    def rollout(self, state: Tensor, policy_fn: Callable[[Tensor], Tensor], horizon: int,
                reward_fn: Callable[..., tuple[Tensor, Tensor]] | None = None,
                member: str = "mean") -> dict[str, Tensor]:
        """H-step model rollout from states (B, D), propagating the mean (LIFT §2.4; the policy supplies the noise).

        ``policy_fn(state) -> action``; ``reward_fn(qpos, qvel, next_qpos, next_qvel, action) -> (reward,
        terminated)`` (``envs.control.task_rewards``; close over a command if the task has one). Returns (H, B, ·) tensors:
        state, action, next_state, logvar (state units) and, with a reward_fn, reward, terminated and ``alive``
        (1 up to and including the first termination: the transitions to keep).
        """
        out: dict[str, list[Tensor]] = {k: [] for k in ("state", "action", "next_state", "logvar")}
        if reward_fn is not None:
            out.update(reward=[], terminated=[], alive=[])
            alive = torch.ones(state.shape[0], dtype=torch.bool, device=state.device)
        for _ in range(horizon):
            action = policy_fn(state)
            next_state, logvar = self.predict(state, action, member=member)
            for key, value in (("state", state), ("action", action), ("next_state", next_state), ("logvar", logvar)):
                out[key].append(value)
            if reward_fn is not None:
                reward, terminated = reward_fn(state[..., :self.nq], state[..., self.nq:], next_state[..., :self.nq],
                                               next_state[..., self.nq:], action)
                out["reward"].append(reward)
                out["terminated"].append(terminated)
                out["alive"].append(alive)
                alive = alive & ~terminated
            state = next_state
        return {k: torch.stack(v) for k, v in out.items()}


class PhysicsWorldModel(WorldModel):
    """Exact rigid-body prior + learned residual generalised force and state-space log-variance (LIFT §2.1)."""

    def __init__(self, prior: RigidBodyPrior, action_dim: int, cfg: WorldModelConfig | None = None,
                 residual: bool = True) -> None:
        cfg = cfg or WorldModelConfig()
        super().__init__(prior.nq, prior.nv, action_dim, prior.nv + prior.nq + prior.nv, cfg, prior.translation_qpos)
        self.prior = prior
        self.residual = residual  # False: the "prior only" ablation (τ_θ = 0; only the variance head learns)
        self.register_buffer("tau_mean", torch.zeros(prior.nv))
        self.register_buffer("tau_std", torch.ones(prior.nv))

    def _scaled_head(self) -> tuple[slice, Tensor, Tensor]:
        return slice(0, self.nv), self.tau_mean, self.tau_std

    @torch.no_grad()
    def fit_normalizers(self, batch: Mapping[str, Tensor]) -> None:
        """Also scale the residual head by the statistics of the force that would close the one-step gap:
        τ* = (M + hD)(q̇' − q̇)/(K h) − force (frozen prior)."""
        super().fit_normalizers(batch)
        minv_h, force = self.prior.terms(batch["qpos"].double(), batch["qvel"].double(), batch["action"].double())
        span = self.prior.n_substeps * self.prior.timestep
        accel = (batch["next_qvel"].double() - batch["qvel"].double()) / span
        ideal = torch.linalg.solve(minv_h, accel.unsqueeze(-1)).squeeze(-1) - force
        self.tau_mean.copy_(ideal.mean(0))
        self.tau_std.copy_(ideal.std(0).clamp_min(1e-6))

    def residual_force(self, state: Tensor, action: Tensor) -> tuple[Tensor, Tensor]:
        """τ_θ(s, a) (E, B, nv) and the raw log-variance head (E, B, D)."""
        head = self._net(state, action)
        if not self.residual:
            return torch.zeros_like(head[..., :self.nv]), head[..., self.nv:]
        return self.tau_mean + self.tau_std * head[..., :self.nv], head[..., self.nv:]

    def _prior_terms(self, qpos: Tensor, qvel: Tensor, action: Tensor, shared_state: bool) -> tuple[Tensor, Tensor]:
        if shared_state:  # every member starts from the same state: one MuJoCo pass, broadcast
            minv_h, force = self.prior.terms(qpos[0], qvel[0], action[0])
            return minv_h.expand(qpos.shape[0], -1, -1, -1), force.expand(qpos.shape[0], -1, -1)
        flat = lambda t: t.reshape(-1, t.shape[-1])  # noqa: E731
        minv_h, force = self.prior.terms(flat(qpos), flat(qvel), flat(action))
        return minv_h.reshape(*qpos.shape[:-1], self.nv, self.nv), force.reshape(*qpos.shape[:-1], self.nv)

    def _members(self, state: Tensor, action: Tensor, shared_state: bool) -> tuple[Tensor, Tensor]:
        qpos, qvel = state[..., :self.nq], state[..., self.nq:]
        tau, raw_logvar = self.residual_force(state, action)
        minv_h, force = self._prior_terms(qpos, qvel, action, shared_state)
        h = self.prior.timestep
        accel = (minv_h @ (force + tau).unsqueeze(-1)).squeeze(-1)
        for substep in range(self.prior.n_substeps):
            if substep > 0 and self.cfg.prior_mode == "substep":
                minv_h, force = self._prior_terms(qpos.detach(), qvel.detach(), action, shared_state=False)
                accel = (minv_h @ (force + tau).unsqueeze(-1)).squeeze(-1)
            qvel = qvel + h * accel
            qpos = integrate_positions(qpos, qvel, h, self.prior)
        return torch.cat((qpos, qvel), -1), self._logvar(raw_logvar)


class BlackBoxEnsemble(WorldModel):
    """MBPO's probabilistic ensemble: s' = s + Δ_θ(s, a), Gaussian in state space (the LIFT ``mbpo`` ablation)."""

    def __init__(self, nq: int, nv: int, action_dim: int, cfg: WorldModelConfig | None = None,
                 translation_qpos: Sequence[int] = (), quaternion_qpos: Sequence[int] = ()) -> None:
        cfg = cfg or WorldModelConfig()
        super().__init__(nq, nv, action_dim, 2 * (nq + nv), cfg, translation_qpos)
        self.quaternion_qpos = tuple(quaternion_qpos)

    def _scaled_head(self) -> tuple[slice, Tensor, Tensor]:
        return slice(0, self.state_dim), self.delta_mean, self.delta_std

    @classmethod
    def like(cls, prior: RigidBodyPrior, action_dim: int, cfg: WorldModelConfig | None = None) -> "BlackBoxEnsemble":
        """A black-box model over the same state layout as a physics model with ``prior``."""
        return cls(prior.nq, prior.nv, action_dim, cfg, prior.translation_qpos, prior.quaternion_qpos)

    def _members(self, state: Tensor, action: Tensor, shared_state: bool) -> tuple[Tensor, Tensor]:
        head = self._net(state, action)
        mean = state + self.delta_mean + self.delta_std * head[..., :self.state_dim]
        qpos = normalize_quaternions(mean[..., :self.nq], self.quaternion_qpos)
        return torch.cat((qpos, mean[..., self.nq:]), -1), self._logvar(head[..., self.state_dim:])


class NoPrior:
    """A prior that knows no physics: minv_h = I and force = 0, so τ_θ is the acceleration itself. The "residual only"
    ablation: the physics model's network, integrator and state layout without M(q) and the bias forces."""

    def __init__(self, prior: RigidBodyPrior) -> None:
        for name in ("nq", "nv", "timestep", "n_substeps", "linear_qpos", "linear_qvel", "quaternion_qpos",
                     "quaternion_qvel", "translation_qpos"):
            setattr(self, name, getattr(prior, name))

    def terms(self, qpos: Tensor, qvel: Tensor, action: Tensor) -> tuple[Tensor, Tensor]:
        eye = torch.eye(self.nv, dtype=qpos.dtype, device=qpos.device)
        return eye.expand(qpos.shape[0], self.nv, self.nv), qvel.new_zeros(qpos.shape[0], self.nv)
