"""Pure-PyTorch algorithms (no Ray): networks, replay, normalisation, SAC, world models, diffusion, RL for LLMs."""
