"""LIFT on the cluster: MuJoCo transitions (collect), SAC pretraining, world model and finetuning."""

EXPERIMENTS = {"collect": "experiments.lift.collect", "lift_pretrain": "experiments.lift.pretrain",
               "lift_finetune": "experiments.lift.finetune"}
SAMPLERS = {"env": "experiments.lift.sampler:EnvSampler"}
TOUR = "experiments.lift.tour:TOUR"  # its stages and report section in the main job (experiments/tour.py)
