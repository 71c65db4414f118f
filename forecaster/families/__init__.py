"""Forecast families, one module each, behind one interface (``Family``) and one registry (``FAMILIES``)."""

from __future__ import annotations

from forecaster.families._base import Failure, Family, Params
from forecaster.families.ets import ETS
from forecaster.families.intermittent import Intermittent
from forecaster.families.mstl import MSTLFamily
from forecaster.families.periodic_event import PeriodicEvent
from forecaster.families.poisson_fourier import PoissonFourier
from forecaster.families.prior import Prior, prior_params
from forecaster.families.rate import Rate
from forecaster.families.seasonal_naive import SeasonalNaive

__all__ = ["CANDIDATES", "FAMILIES", "Failure", "Family", "Params", "family", "prior_params"]

# Alias -> a family with its default configuration. Order matters: on a tie in the backtest the
# earlier (simpler) family wins.
FAMILIES: dict[str, Family] = {
    f.alias: f
    for f in (
        Rate(),
        SeasonalNaive("daily"),
        SeasonalNaive("weekly", seasons=2),
        Intermittent(),
        PeriodicEvent(),
        PoissonFourier(),
        PoissonFourier(half_life_days=1.0, alias="poisson_fourier_recent"),
        ETS(),
        MSTLFamily(),
        Prior(),
    )
}
# The families the backtest chooses between (a prior is only for models too new to backtest).
CANDIDATES: tuple[str, ...] = tuple(a for a in FAMILIES if a != "prior")


def family(alias: str) -> Family:
    """The registered family called ``alias``; ``KeyError`` names the known ones."""
    try:
        return FAMILIES[alias]
    except KeyError:
        raise KeyError(f"unknown forecast family {alias!r}; known: {sorted(FAMILIES)}") from None
