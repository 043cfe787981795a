"""Fitting a LIFT world model (stage ii, and its retraining in stage iii) on recorded transitions.

The data are flat transitions (``TRANSITION_COLUMNS``) in any row order, e.g. interleaved vector-env rows: episodes are
rebuilt by matching each transition's next state to another's state (``successor_index``). Whole episodes are held
out, so hold-out states are unseen; training draws windows of ``loss_horizon`` consecutive steps, in shuffled epochs
(MBPO/LIFT), Adam on the model's H-step NLL, with optional early stopping on the hold-out loss (LIFT finetuning).
Reported errors are ``multistep_errors``: open-loop MSE with the recorded actions, in units of the state's std.
"""
from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from algos.lift.world_model import WorldModel, WorldModelConfig

Tensor = torch.Tensor
log = logging.getLogger(__name__)

# Columns the world model trains on; stage-1 replay must store them (float64 qpos/qvel keep successor matching exact).
TRANSITION_COLUMNS: tuple[str, ...] = ("qpos", "qvel", "action", "next_qpos", "next_qvel", "terminated", "truncated")
REQUIRED_COLUMNS: tuple[str, ...] = ("qpos", "qvel", "action", "next_qpos", "next_qvel", "terminated")


@dataclass
class EarlyStopping:
    """Stop after ``patience`` evaluations without a ``min_improvement`` relative gain of the hold-out loss
    (LIFT finetuning: 1%, 6 epochs); the best weights are restored. ``metric``: the hold-out loss compared, "nll"
    (the training loss) or "mse" (the mean prediction's squared error, LIFT's ``test_mean_loss``: a Gaussian head can
    lower its NLL by its variance alone while its mean gets worse)."""

    patience: int = 6
    min_improvement: float = 0.01
    metric: str = "nll"

    def __post_init__(self) -> None:
        if self.metric not in ("nll", "mse"):
            raise ValueError(f"metric must be 'nll' or 'mse', got {self.metric!r}")
        if self.patience < 1:
            raise ValueError(f"patience must be >= 1, got {self.patience}")
        if self.min_improvement < 0:
            raise ValueError(f"min_improvement must be >= 0, got {self.min_improvement}")

    def converged(self, losses: Sequence[float]) -> bool:
        """Whether the checks so far end with ``patience`` in a row that brought no gain. A gain is measured from
        LIFT's ``best``, which moves only on a gain (from +inf before the first check), so slow gains add up until
        one counts; a non-finite loss is never a gain (else a diverged fit would run to its step cap)."""
        reference, stale = math.inf, 0
        for loss in losses:
            gain = math.isfinite(loss) and (not math.isfinite(reference)
                                            or reference - loss > self.min_improvement * abs(reference))
            reference, stale = (loss, 0) if gain else (reference, stale + 1)
        return stale >= self.patience


# ---------------------------------------------------------------------------------------------------------------- data

def as_tensors(data: Mapping[str, np.ndarray | Tensor], dtype: torch.dtype = torch.float32,
               device: torch.device | str | None = None) -> dict[str, Tensor]:
    """The ``REQUIRED_COLUMNS`` (plus ``truncated`` if present) as tensors on ``device`` (default the CPU); flags
    become 0/1 of ``dtype``."""
    missing = [c for c in REQUIRED_COLUMNS if c not in data]
    if missing:
        raise ValueError(f"transition data lacks columns {missing}; need {REQUIRED_COLUMNS}")
    return {c: torch.as_tensor(np.asarray(data[c]), dtype=dtype).to(device) for c in TRANSITION_COLUMNS if c in data}


def model_device(model: WorldModel) -> torch.device:
    """Where ``model`` computes (its scalers live with its weights): every batch fed to it goes there first."""
    return model.delta_std.device


def successor_index(data: Mapping[str, np.ndarray]) -> np.ndarray:
    """For each transition, the row whose (qpos, qvel) equals its (next_qpos, next_qvel), or −1 after a termination,
    truncation or missing row. Independent of row order, so interleaved vector-env data works as is."""
    qpos, qvel = np.asarray(data["qpos"]), np.asarray(data["qvel"])
    start = {qpos[i].tobytes() + qvel[i].tobytes(): i for i in range(len(qpos))}
    next_qpos, next_qvel = np.asarray(data["next_qpos"]), np.asarray(data["next_qvel"])
    ended = np.asarray(data["terminated"]).astype(bool)
    if "truncated" in data:
        ended |= np.asarray(data["truncated"]).astype(bool)
    return np.array([-1 if ended[i] else start.get(next_qpos[i].tobytes() + next_qvel[i].tobytes(), -1)
                     for i in range(len(qpos))], dtype=np.int64)


def episode_ids(successor: np.ndarray) -> np.ndarray:
    """Label the chains of ``successor`` (episodes, or episode fragments) 0, 1, ..."""
    has_predecessor = np.zeros(len(successor), dtype=bool)
    has_predecessor[successor[successor >= 0]] = True
    labels = np.full(len(successor), -1, dtype=np.int64)
    for label, root in enumerate(np.flatnonzero(~has_predecessor)):
        row = root
        while row >= 0 and labels[row] < 0:
            labels[row] = label
            row = successor[row]
    unlabeled = labels < 0  # cycles cannot occur in real data; label any leftovers individually
    labels[unlabeled] = labels.max(initial=-1) + 1 + np.arange(unlabeled.sum())
    return labels


def windows(successor: np.ndarray, rows: np.ndarray, horizon: int) -> tuple[np.ndarray, np.ndarray]:
    """(index (S, H), valid (S, H)): row chains of length ``horizon`` starting at ``rows``; invalid past an end."""
    index = np.zeros((len(rows), horizon), dtype=np.int64)
    valid = np.zeros((len(rows), horizon), dtype=bool)
    current, ok = rows.astype(np.int64), np.ones(len(rows), dtype=bool)
    for k in range(horizon):
        index[:, k], valid[:, k] = np.where(ok, current, 0), ok
        nxt = successor[np.where(ok, current, 0)]
        ok = ok & (nxt >= 0)
        current = np.where(ok, nxt, 0)
    return index, valid


def take(t: Tensor, index: Tensor) -> Tensor:
    """``t[index]`` for an integer ``index`` of any shape, by ``index_select``: an index on another device than ``t``
    is an error here on every device (and under the fake-CUDA tests), not a silent host round trip."""
    return t.index_select(0, index.reshape(-1)).reshape(*index.shape, *t.shape[1:])


def gather_windows(tensors: Mapping[str, Tensor], index: np.ndarray, valid: np.ndarray) -> dict[str, Tensor]:
    """The ``loss`` batch for window ``index`` (S, H), on the device of ``tensors``."""
    device = tensors["qpos"].device
    idx = torch.as_tensor(index).to(device)
    return {"qpos": take(tensors["qpos"], idx[:, 0]), "qvel": take(tensors["qvel"], idx[:, 0]),
            **{k: take(tensors[k], idx) for k in ("action", "next_qpos", "next_qvel", "terminated")},
            "valid": torch.as_tensor(valid).to(device)}


def split_rows(successor: np.ndarray, holdout_fraction: float, rng: np.random.Generator,
               by: str = "episodes") -> tuple[np.ndarray, np.ndarray]:
    """Training and hold-out rows: whole episodes (``split_episodes``) or a random share of the rows (LIFT's finetuning
    refit: windows may run from a training row into a hold-out row, as its buffer slices do)."""
    if by == "episodes":
        return split_episodes(successor, holdout_fraction, rng)
    order = rng.permutation(len(successor))
    n_holdout = max(1, int(holdout_fraction * len(order)))
    return np.sort(order[n_holdout:]), np.sort(order[:n_holdout])


def split_episodes(successor: np.ndarray, holdout_fraction: float,
                   rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Rows of the training and hold-out episodes (whole episodes, so hold-out states are unseen)."""
    labels = episode_ids(successor)
    episodes = rng.permutation(labels.max() + 1)
    n_holdout = max(1, int(round(holdout_fraction * len(episodes))))
    holdout = np.isin(labels, episodes[:n_holdout])
    return np.flatnonzero(~holdout), np.flatnonzero(holdout)


# ------------------------------------------------------------------------------------------------------------- metrics

def usable_windows(successor: np.ndarray, rows: np.ndarray, horizon: int) -> np.ndarray:
    """Row chains (S, horizon) from ``rows`` that stay in one episode with no termination before their last step.
    ``successor_index`` ends every chain at a termination (−1), so a chain valid over all its steps has none before
    its last: the host-side index alone decides, whatever device the tensors are on."""
    index, valid = windows(successor, rows, horizon)
    return index[valid.all(1)]


def longest_usable_horizon(successor: np.ndarray, rows: np.ndarray, horizon: int) -> int:
    """The largest k <= ``horizon`` with at least one usable window of k steps (0 if there is none)."""
    for k in range(horizon, 0, -1):
        if len(usable_windows(successor, rows, k)):
            return k
    return 0


@torch.no_grad()
def multistep_errors(model: WorldModel, tensors: Mapping[str, Tensor], successor: np.ndarray, rows: np.ndarray,
                     horizon: int, max_windows: int, rng: np.random.Generator,
                     state_std: Tensor | None = None) -> np.ndarray:
    """Open-loop error with the recorded actions: e_k = mean over windows and non-translation dims of
    ((ŝ_k − s_k)/std(s))², k = 1..horizon. Windows must stay in one episode with no termination before their end.
    ``state_std``: fixed units (e.g. the stage-2 scalers) so that errors compare across refits; default the model's."""
    index = usable_windows(successor, rows, horizon)
    if len(index) == 0:
        raise ValueError(f"no hold-out window of {horizon} steps; collect longer episodes or lower eval_horizon")
    if len(index) > max_windows:
        index = index[rng.choice(len(index), max_windows, replace=False)]
    device = model_device(model)
    tensors = {k: tensors[k].to(device) for k in ("qpos", "qvel", "action", "next_qpos", "next_qvel")}
    idx = torch.as_tensor(index).to(device)
    state = torch.cat((take(tensors["qpos"], idx[:, 0]), take(tensors["qvel"], idx[:, 0])), -1)
    errors = np.zeros(horizon)
    weight = model.metric_mask / model.metric_mask.sum()
    units = model.state_std if state_std is None else state_std.to(model.state_std)
    for k in range(horizon):
        state, _ = model.predict(state, take(tensors["action"], idx[:, k]))
        target = torch.cat((take(tensors["next_qpos"], idx[:, k]), take(tensors["next_qvel"], idx[:, k])), -1)
        errors[k] = float((((state - target) / units).square() * weight).sum(-1).mean())
    return errors


def heldout_errors(model: WorldModel, data: Mapping[str, np.ndarray], horizon: int, max_windows: int = 1000,
                   seed: int = 0, state_std: Tensor | None = None) -> np.ndarray:
    """``multistep_errors`` on every row of transitions the model has not been trained on (e.g. a finetuning epoch's
    fresh real data), up to the longest horizon they allow (NaN beyond it; all NaN without a usable window)."""
    tensors = as_tensors(data, model.delta_std.dtype, model_device(model))
    successor = successor_index(data)
    rows = np.arange(len(successor))
    errors = np.full(horizon, np.nan)
    usable = longest_usable_horizon(successor, rows, horizon)
    if usable:
        errors[:usable] = multistep_errors(model, tensors, successor, rows, usable, max_windows,
                                           np.random.default_rng(seed), state_std)
    return errors


# ------------------------------------------------------------------------------------------------------------ training

SCALER_MODES = ("fit", "refit", "refit_output", "keep")


def snapshot(model: WorldModel) -> dict[str, Tensor]:
    """A copy of the model's weights and scalers, on its device (early stopping's best state)."""
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def train_world_model(model: WorldModel, data: Mapping[str, np.ndarray], cfg: WorldModelConfig | None = None,
                      early_stopping: EarlyStopping | None = None,
                      scalers: str = "fit", state_std: Tensor | None = None) -> dict[str, float | list[float]]:
    """Fit ``model`` on flat transitions (``TRANSITION_COLUMNS``): episode-level hold-out split, scalers, Adam
    on the ``cfg.loss_horizon``-step NLL (LIFT §2.3/§3.1). Returns the hold-out 1-step and ``eval_horizon``-step
    normalized errors (``multistep_errors``, in units of ``state_std`` if given), losses and wall time.

    ``scalers``: "fit" sets them from the training rows (a fresh model), "refit" does too but keeps what the network
    predicts (``WorldModel.refit_normalizers``: LIFT's per-retraining refit on a warm-started model), "refit_output"
    refits only the output (residual) scalers that way, "keep" leaves them. With early stopping the model as it
    came in is a candidate too: a retraining that never beats it on the hold-out returns it unchanged. A ValueError
    (no hold-out data) is raised before anything in the model changes. The global torch RNG is not touched (the
    caller's SAC noise draws from it)."""
    if scalers not in SCALER_MODES:
        raise ValueError(f"scalers must be one of {SCALER_MODES}, got {scalers!r}")
    cfg = cfg or model.cfg
    started = time.perf_counter()
    rng = np.random.default_rng(cfg.seed)
    dtype, device = model.delta_std.dtype, model_device(model)
    tensors = as_tensors(data, dtype, device)  # once on the model's device; batches are gathered there
    successor = successor_index(data)
    train_rows, holdout_rows = split_rows(successor, cfg.holdout_fraction, rng, cfg.holdout_split)
    # every check that can fail comes before the first change to the model
    if len(train_rows) == 0 or len(holdout_rows) == 0:
        raise ValueError(f"need training and hold-out episodes, got {len(train_rows)} and {len(holdout_rows)} rows")
    eval_horizon = longest_usable_horizon(successor, holdout_rows, cfg.eval_horizon)
    if eval_horizon == 0:
        raise ValueError("no usable hold-out window (every hold-out row ends its episode)")
    # drawn even when the scalers are kept, so that the rest of the fit sees the same random stream
    fit_rows = train_rows if len(train_rows) <= cfg.normalizer_rows else rng.choice(
        train_rows, cfg.normalizer_rows, replace=False)
    fit_batch = {k: take(v, torch.as_tensor(fit_rows).to(device)) for k, v in tensors.items()}
    if scalers == "fit":
        model.fit_normalizers(fit_batch)
    elif scalers in ("refit", "refit_output"):
        model.refit_normalizers(fit_batch, inputs=scalers == "refit")

    train_index, train_valid = windows(successor, train_rows, cfg.loss_horizon)
    hold_index, hold_valid = windows(successor, holdout_rows, cfg.loss_horizon)
    if len(hold_index) > cfg.max_eval_windows:
        keep = rng.choice(len(hold_index), cfg.max_eval_windows, replace=False)
        hold_index, hold_valid = hold_index[keep], hold_valid[keep]
    holdout_batch = gather_windows(tensors, hold_index, hold_valid)

    optimiser = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    best_loss, best_state, stopped_early = math.inf, None, False
    history: list[float] = []
    key = "normalized_mse" if early_stopping is not None and early_stopping.metric == "mse" else "nll"
    eval_every = cfg.eval_every or max(1, len(train_index) // cfg.batch_size)  # 0: once per pass (LIFT's epochs)
    with torch.no_grad():
        _, initial_metrics = model.loss(holdout_batch)
    # A warm start is a candidate too, but only at the end: the first steps of a refit can raise the error (its
    # variance head moves first) before they lower it, so the patience counts from the first check, as LIFT's
    # (best = 1e10 before its first epoch), and the incoming model is restored only if no check beat it.
    incoming = snapshot(model) if early_stopping is not None and scalers != "fit" else None
    kept_incoming = False
    order, cursor, running, steps = rng.permutation(len(train_index)), 0, 0.0, 0
    for steps in range(1, cfg.train_steps + 1):
        if cursor + cfg.batch_size > len(order):  # epochs over shuffled windows, as MBPO/LIFT
            order, cursor = rng.permutation(len(train_index)), 0
        pick = order[cursor:cursor + cfg.batch_size]
        cursor += cfg.batch_size
        loss, _ = model.loss(gather_windows(tensors, train_index[pick], train_valid[pick]))
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        optimiser.step()
        running += loss.item()
        if steps % eval_every == 0 or steps == cfg.train_steps:
            with torch.no_grad():
                _, holdout_metrics = model.loss(holdout_batch)
            holdout_loss = holdout_metrics[key]
            history.append(holdout_loss)
            log.debug("step %d train %.4f holdout %.4f", steps, running / eval_every, holdout_loss)
            running = 0.0
            if early_stopping is not None:
                if holdout_loss < best_loss:
                    best_loss, best_state = holdout_loss, snapshot(model)
                if early_stopping.converged(history):
                    stopped_early = True
                    break
    if incoming is not None and initial_metrics[key] <= best_loss:
        best_state, kept_incoming = incoming, True
    if best_state is not None:
        model.load_state_dict(best_state)
    train_seconds = time.perf_counter() - started
    errors = np.full(cfg.eval_horizon, np.nan)  # NaN beyond the longest hold-out window
    errors[:eval_horizon] = multistep_errors(model, tensors, successor, holdout_rows, eval_horizon,
                                             cfg.max_eval_windows, np.random.default_rng(cfg.seed), state_std)
    with torch.no_grad():
        _, final_metrics = model.loss(holdout_batch)
    return {
        "steps": steps,
        "stopped_early": stopped_early,
        "kept_incoming": kept_incoming,  # no evaluation beat the model as it came in: it is returned unchanged
        "train_seconds": train_seconds,
        "holdout_nll": final_metrics["nll"],
        "holdout_nll_initial": initial_metrics["nll"],
        "holdout_nll_history": history,
        "holdout_mse": final_metrics["normalized_mse"],
        "holdout_mse_initial": initial_metrics["normalized_mse"],
        "error_1step": float(errors[0]),
        f"error_{cfg.eval_horizon}step": float(errors[-1]),
        "error_curve": errors.tolist(),
        "train_transitions": len(train_rows),
        "holdout_transitions": len(holdout_rows),
    }
