"""AttnRL on the cluster: attention-guided tree RL for a reasoning LM against GRPO and entropy branching."""

EXPERIMENTS = {"attnrl": "experiments.attnrl.driver"}
SAMPLERS = {"lm": ("experiments.attnrl.sampler:LMSampler", "gpu")}  # the pool's gpu group where it has one
TOUR = "experiments.attnrl.tour:TOUR"  # its stages and report section in the main job (experiments/tour.py)
