"""E-CIT on the cluster: ensemble conditional independence tests (subset tests on the pool) and PC built on them."""

EXPERIMENTS = {"ecit": "experiments.ecit.calibration", "ecit_pc": "experiments.ecit.pc"}
SAMPLERS = {"cit": "experiments.ecit.sampler:SubsetTestSampler"}
TOUR = "experiments.ecit.tour:TOUR"  # its stages and report section in the main job (experiments/tour.py)
