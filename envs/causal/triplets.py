"""One conditional independence question with known answer, a post-nonlinear design *in the style of* the E-CIT
paper's (not its generator):

    Z ~ N(0, I_dz),  X = f1(Z a + e_x),  Y = f2(Z b + e_y + c X)

with f1, f2 drawn from {x, tanh, sin, x^3 / 3 (cubic, on the standardised argument)}, a, b ~ U(0, 1) normalised to sum
1, noise e from ``noise``. Null (X _||_ Y | Z): c = 0; alternative: c = ``effect``.

The released generator (GuanZhengkang/ECIT ``ecit/utils.py:4-13,130-154``) draws f from {x^2, x^3, tanh, cos} on the
raw (unstandardised) argument, uses X -> Y coefficient 1 on raw X and raw t noise (t2 by default); orrery's
standardised arguments, effect 0.5 on standardised X and unit-variance t3 keep every draw on one scale. Type-I error
and power here are this design's, not comparable number for number with the paper's (``algos/ecit/README.md``).

The determinism dial (``rho`` in [0, 1], issue 51): how much of X is set by Z,

    X = f1(rho * s(Z a) + sqrt(1 - rho^2) * s(e_x)),   Y = f2(s(Z b + e_y + c * s(e_x)))      (s: standardise)

rho = 0: X independent of Z; rho -> 1: X a function of Z (R^2 of X's argument on Z is rho^2). At rho = sqrt(1/2) the
null is the design above (X = f1(s(Z a + e_x)) for dz = 1). The alternative feeds Y X's own noise e_x, not X: with
c * X the dependence given Z would vanish as rho -> 1 for every test (given Z, X would be fixed), and the dial would
measure the signal leaving, not the tests; with e_x it stays one fixed dependence, however little X varies given Z.
"""
from __future__ import annotations

import numpy as np

from envs.causal.sem import draw_noise

FUNCS = (lambda v: v, np.tanh, np.sin, lambda v: v ** 3 / 3.0)


def ci_triplet(n: int, dependent: bool, rng: np.random.Generator, dz: int = 1, noise: str = "t3",
               effect: float = 0.5, nonlinear: bool = True,
               rho: float | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(x [n, 1], y [n, 1], z [n, dz])``; X _||_ Y | Z holds exactly when ``dependent`` is False. ``rho``: the
    determinism dial of the module docstring (None: the design without it, draw for draw as before)."""
    if n < 1 or dz < 1:
        raise ValueError(f"ci_triplet: need n >= 1 and dz >= 1, got n={n}, dz={dz}")
    if rho is not None and not 0.0 <= rho <= 1.0:
        raise ValueError(f"ci_triplet: rho must be in [0, 1], got {rho}")
    z = rng.normal(size=(n, dz))
    a, b = rng.uniform(size=dz), rng.uniform(size=dz)
    a, b = a / a.sum(), b / b.sum()
    f1, f2 = (FUNCS[i] if nonlinear else FUNCS[0] for i in rng.integers(0, len(FUNCS), size=2))

    def standard(v: np.ndarray) -> np.ndarray:
        return (v - v.mean()) / (v.std() + 1e-12)

    if rho is None:
        x = f1(standard(z @ a + draw_noise(noise, (n,), rng)))
        y = f2(standard(z @ b + draw_noise(noise, (n,), rng) + (effect * standard(x) if dependent else 0.0)))
        return x[:, None], y[:, None], z
    e_x = standard(draw_noise(noise, (n,), rng))
    x = f1(standard(rho * standard(z @ a) + np.sqrt(1.0 - rho * rho) * e_x))
    y = f2(standard(z @ b + draw_noise(noise, (n,), rng) + (effect * e_x if dependent else 0.0)))
    return x[:, None], y[:, None], z
