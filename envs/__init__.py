"""Tasks: gymnasium MuJoCo control, biomolecule reward oracles and sequence data, reasoning-task generators."""
