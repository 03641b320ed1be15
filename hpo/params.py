"""Search-space parameters of a study spec: floats, ints and categorical choices.

Each is a strict pydantic model tagged by ``type``; :data:`Param` is their
discriminated union. Validators name the field of each problem (``low``,
``high``, ``step``, ``choices``); :mod:`hpo.spec` assembles them into a
``StudySpec``.
"""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationInfo,
    field_validator,
)

from hpo.algorithms import Strict

__all__ = ["MAX_EXACT_INT", "CategoricalParam", "Choice", "FloatParam", "IntParam", "Param"]

MAX_CHOICES = 1000  # choices of one categorical parameter
MAX_GRID_POINTS = 1e9  # values of one stepped float parameter
MAX_EXACT_INT = 2**53  # ints of a search space: exact in float64, as Optuna's samplers compute


SearchInt = Annotated[StrictInt, Field(ge=-MAX_EXACT_INT, le=MAX_EXACT_INT)]


class _Range(Strict):
    """The bounds of a numeric parameter: ``low > 0`` when ``log``, ``high > low``."""

    @field_validator("low", check_fields=False)
    @classmethod
    def _low(cls, v: float, info: ValidationInfo) -> float:
        if info.data.get("log") and v <= 0:
            raise ValueError(f"must be > 0 when log is true, got {v}")
        return v

    @field_validator("high", check_fields=False)
    @classmethod
    def _high(cls, v: float, info: ValidationInfo) -> float:
        low = info.data.get("low")
        if low is not None and v <= low:
            raise ValueError(f"must be > low ({low}), got {v}")
        return v


class FloatParam(_Range):
    """A float in ``[low, high]``, optionally log-uniform or on a grid of ``step``."""

    type: Literal["float"]
    log: StrictBool = False
    low: StrictFloat
    high: StrictFloat
    step: StrictFloat | None = None

    @field_validator("step")
    @classmethod
    def _step(cls, v: float | None, info: ValidationInfo) -> float | None:
        if v is None:
            return v
        if v <= 0:
            raise ValueError(f"must be > 0, got {v}")
        if info.data.get("log"):
            raise ValueError("cannot be combined with log: true")
        low, high = info.data.get("low"), info.data.get("high")
        if low is not None and high is not None:
            n = (high - low) / v
            if not math.isfinite(n) or n > MAX_GRID_POINTS:  # (high - low) may overflow
                raise ValueError(f"{v} makes more than {MAX_GRID_POINTS:.0e} grid points in "
                                 f"[{low}, {high}]")
            # Optuna's test, in decimal (FloatDistribution moves such a high down, with a
            # warning): the grid that runs is the one the spec shows, on every path
            d_low, d_high, d_step = (Decimal(str(x)) for x in (low, high, v))
            if (d_high - d_low) % d_step:
                fit = float((d_high - d_low) // d_step * d_step + d_low)
                raise ValueError(f"{v} does not divide the range [{low}, {high}]; the grid's "
                                 f"last point below high is {fit}")
        return v


class IntParam(_Range):
    """An integer in ``[low, high]`` with ``step``, optionally log-uniform."""

    type: Literal["int"]
    log: StrictBool = False
    low: SearchInt
    high: SearchInt
    step: StrictInt = 1

    @field_validator("step")
    @classmethod
    def _step(cls, v: int, info: ValidationInfo) -> int:
        if v <= 0:
            raise ValueError(f"must be > 0, got {v}")
        if info.data.get("log") and v != 1:
            raise ValueError("must be 1 when log is true")
        low, high = info.data.get("low"), info.data.get("high")
        if low is not None and high is not None and (high - low) % v:
            raise ValueError(f"{v} does not divide the range [{low}, {high}]")
        return v


Choice = StrictBool | StrictInt | StrictFloat | StrictStr | None


class CategoricalParam(Strict):
    """One of ``choices``: numbers, strings, booleans and null may be mixed (optuna#3129)."""

    type: Literal["categorical"]
    # each choice is checked against the task (a few ms each): a bounded list
    choices: list[Choice] = Field(..., max_length=MAX_CHOICES)

    @field_validator("choices")
    @classmethod
    def _choices(cls, v: list[Any]) -> list[Any]:
        if not v:
            raise ValueError("must not be empty")
        seen: set[Any] = set()  # equal numbers hash alike (1, 1.0, True): one lookup each
        for i, c in enumerate(v):
            if isinstance(c, int) and abs(c) > MAX_EXACT_INT:
                raise ValueError(f"choice {i} is beyond +-2**53 (Optuna computes in float64)")
            # Optuna finds a choice by ==: 1, 1.0 and True would be one choice
            if c in seen and c == c:  # NaN equals nothing, not even itself
                raise ValueError(f"{c!r} equals an earlier choice (Optuna compares choices "
                                 f"with ==: 1, 1.0 and True are the same); got {v}")
            seen.add(c)
        return v


Param = Annotated[FloatParam | IntParam | CategoricalParam, Field(discriminator="type")]
