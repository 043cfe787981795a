"""AttnRL's one-step off-policy pipeline (Sec. 3.3) as pure bookkeeping: which batch each generation call
samples, and with the weights after how many updates."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GenerationCall:
    """What one sampling call carries and which weights sample it.

    ``policy_version`` = number of policy updates applied before the call. ``initial_batch``: batch whose
    initial responses are sampled; ``continuation_batch``: batch whose branch continuations are sampled, and which
    is trained right after the call.
    """

    policy_version: int
    initial_batch: int | None
    continuation_batch: int | None


class OffPolicyScheduler:
    """Order of generation calls and updates.

    Off-policy: call m (weights after m updates) samples the initial responses of batch m + 1 *and* the
    continuations of batch m; update m follows. So batch m's originals come from theta_{m-1} and its
    continuations from theta_m (batch 0: both theta_0, after a warm-up call with only its initial samples).
    On-policy: initial samples and continuations of batch m are separate calls, both with theta_m.
    """

    def __init__(self, off_policy: bool = True) -> None:
        self.off_policy = off_policy
        self.version = 0
        self._awaiting_continuation: int | None = None
        self._next_batch = 0

    @property
    def pending_batch(self) -> int | None:
        """Batch whose initial responses exist but whose continuations are not sampled yet."""
        return self._awaiting_continuation

    def next_call(self, start_new_batch: bool = True) -> GenerationCall | None:
        """The next call; ``start_new_batch=False`` lets the pipeline drain. None when nothing is left to do."""
        pending = self._awaiting_continuation
        may_start = start_new_batch and (self.off_policy or pending is None)
        new = self._next_batch if may_start else None
        if pending is None and new is None:
            return None
        if new is not None:
            self._next_batch += 1
        self._awaiting_continuation = new
        return GenerationCall(self.version, new, pending)

    def record_update(self) -> None:
        self.version += 1
