"""Pure-PyTorch algorithms (no Ray): networks, replay, normalization, SAC, world models, diffusion, RL for LLMs."""
