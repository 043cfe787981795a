"""LIFT on the cluster: MuJoCo transitions (collect), SAC pretraining, world model and finetuning."""

EXPERIMENTS = {"collect": "experiments.lift.collect", "lift_pretrain": "experiments.lift.pretrain",
               "lift_finetune": "experiments.lift.finetune"}
SAMPLERS = {"env": "experiments.lift.sampler:EnvSampler"}
