"""AttnRL (Liu et al., 2025, arXiv:2509.26628): attention-guided exploration for process-supervised RL.

The modules, in the order of the paper:

* ``fci``: Forward Context Influence (Eq. 5-6).
* ``branching``: Attention-based Tree Branching, ATB (Eq. 7), the entropy branching it replaces, and the controls
  (earliest steps, random steps, the answer's dependency cone).
* ``tree``: prompt trees, TreeRL process advantages and training paths (Eq. 2-3).
* ``adaptive``: Adaptive Sampling, ADS (Eq. 8-10 and the zero-advantage filter).
* ``offpolicy``: the one-step off-policy pipeline (Sec. 3.3).
* ``ppo``: the PPO-clip update (Eq. 1) on training sequences.
* ``config``: ``METHODS``, ``RLConfig``, ``AdaptiveSamplingConfig``.
* ``train``: the reference driver; ``grpo`` and ``tree_rl`` are its loops, ``training_run`` what they share.

Around them: ``gpt`` (the tiny model), ``lm`` (KV-cached sampling, teacher forcing, step attention), ``sft``
(supervised pretraining), ``diagnostics`` (FCI against the true step influence and against the outcome-flip rate of
branching at each step: analysis, not the algorithm).
"""
