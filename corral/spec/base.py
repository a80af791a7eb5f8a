"""The primitives every configuration and spec model shares, defined once: the strict base
model (unknown fields are errors, values frozen) and the duration type (``30s``, ``5m``,
``1h30m``, ``1-00:00:00`` or seconds)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict

from corral.spec.quantity import parse_duration

Duration = Annotated[float, BeforeValidator(parse_duration)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
