"""PSP's bounds on the update-order lag (Wang, Catterall, Mortier 2017, Theorem 1;
Owl book, "Convergence": eqs. bound_mean, bound_var, bound_s).

With ``a = F(r)^β``, T updates and staleness r:

    mean  <= S * (r(r+1)/2 + a(r+2)/(1-a)^2)
    var   <  S * (r(r+1)(2r+1)/6 + a(r^2+4)/(1-a)^3)
    S      = (1-a) / (F(r)(1-a) + a - a^(T-r+1))
"""
from __future__ import annotations

from dataclasses import dataclass

from actorpy.errors import ConfigError


@dataclass(frozen=True)
class PSPBounds:
    """Bounds on the average mean and variance of the lag γ_t, and the terms behind them."""

    mean: float
    variance: float
    s: float
    a: float


def psp_bounds(staleness: int, sample: int, lag_cdf: float, updates: int) -> PSPBounds:
    """The PSP paper's bounds for staleness r, sample size β, F(r) and T updates.

    Args:
        staleness: r >= 0.
        sample: β >= 1 (β = 0 is ASP: no bound).
        lag_cdf: F(r), the probability that a worker lags at most r steps, in (0, 1).
        updates: T > r.

    Raises:
        ConfigError: an argument is outside the range where the bounds are defined.

    >>> b = psp_bounds(staleness=4, sample=1, lag_cdf=0.5, updates=10_000)
    >>> round(b.s, 4), round(b.mean, 3), round(b.variance, 3)
    (0.6667, 14.667, 73.333)
    """
    r, beta, f = staleness, sample, lag_cdf
    if r < 0:
        raise ConfigError(f"staleness must be >= 0, got {r}")
    if beta < 1:
        raise ConfigError(f"sample (beta) must be >= 1 for a bound, got {beta}")
    if not 0.0 < f < 1.0:
        raise ConfigError(f"lag CDF F(r) must lie strictly between 0 and 1, got {f}")
    if updates <= r:
        raise ConfigError(f"updates T must exceed staleness r, got T={updates}, r={r}")
    a = f ** beta
    s = (1 - a) / (f * (1 - a) + a - a ** (updates - r + 1))
    mean = s * (r * (r + 1) / 2 + a * (r + 2) / (1 - a) ** 2)
    variance = s * (r * (r + 1) * (2 * r + 1) / 6 + a * (r * r + 4) / (1 - a) ** 3)
    return PSPBounds(mean=mean, variance=variance, s=s, a=a)
