"""VIDD on the cluster: reward-guided fine-tuning of masked diffusion models (molecules, DNA, proteins)."""

EXPERIMENTS = {"vidd_molecule": "experiments.vidd.driver", "vidd_dna": "experiments.vidd.driver",
               "vidd_protein": "experiments.vidd.driver"}
SAMPLERS = {"diffusion": "experiments.vidd.sampler:DiffusionSampler"}
