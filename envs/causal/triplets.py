"""One conditional independence question with known answer, a post-nonlinear design *in the style of* the E-CIT
paper's (not its generator):

    Z ~ N(0, I_dz),  X = f1(Z a + e_x),  Y = f2(Z b + e_y + c X)

with f1, f2 drawn from {x, tanh, sin, x^3 / 3 (cubic, on the standardised argument)}, a, b ~ U(0, 1) normalised to sum
1, noise e from ``noise``. Null (X _||_ Y | Z): c = 0; alternative: c = ``effect``.

The released generator (GuanZhengkang/ECIT ``ecit/utils.py:4-13,130-154``) draws f from {x^2, x^3, tanh, cos} on the
raw (unstandardised) argument, uses X -> Y coefficient 1 on raw X and raw t noise (t2 by default); orrery's
standardised arguments, effect 0.5 on standardised X and unit-variance t3 keep every draw on one scale. Type-I error
and power here are this design's, not comparable number for number with the paper's (``algos/ecit/README.md``).
"""
from __future__ import annotations

import numpy as np

from envs.causal.sem import draw_noise

FUNCS = (lambda v: v, np.tanh, np.sin, lambda v: v ** 3 / 3.0)


def ci_triplet(n: int, dependent: bool, rng: np.random.Generator, dz: int = 1, noise: str = "t3",
               effect: float = 0.5, nonlinear: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(x [n, 1], y [n, 1], z [n, dz])``; X _||_ Y | Z holds exactly when ``dependent`` is False."""
    if n < 1 or dz < 1:
        raise ValueError(f"ci_triplet: need n >= 1 and dz >= 1, got n={n}, dz={dz}")
    z = rng.normal(size=(n, dz))
    a, b = rng.uniform(size=dz), rng.uniform(size=dz)
    a, b = a / a.sum(), b / b.sum()
    f1, f2 = (FUNCS[i] if nonlinear else FUNCS[0] for i in rng.integers(0, len(FUNCS), size=2))

    def standard(v: np.ndarray) -> np.ndarray:
        return (v - v.mean()) / (v.std() + 1e-12)

    x = f1(standard(z @ a + draw_noise(noise, (n,), rng)))
    y = f2(standard(z @ b + draw_noise(noise, (n,), rng) + (effect * standard(x) if dependent else 0.0)))
    return x[:, None], y[:, None], z
