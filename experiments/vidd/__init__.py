"""VIDD on the cluster: reward-guided fine-tuning of masked diffusion models (molecules, DNA, proteins)."""

EXPERIMENTS = {"vidd_molecule": "experiments.vidd.driver", "vidd_dna": "experiments.vidd.driver",
               "vidd_protein": "experiments.vidd.driver"}
# the diffusion sampler holds denoisers: it runs in the pool's "gpu" worker group where the pool defines one
SAMPLERS = {"diffusion": ("experiments.vidd.sampler:DiffusionSampler", "gpu")}
TOUR = "experiments.vidd.tour:TOUR"  # its stages and report section in the main job (experiments/tour.py)
