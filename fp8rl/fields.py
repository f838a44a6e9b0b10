"""Declaring a config field's accepted values once: :func:`num` (a numeric range),
:func:`choice` (a closed set), :func:`like` (another group's declaration of the same value)
and :func:`check_fields` (the one check that reads them).

A ground-floor module (the standard library only), so the room that implements a knob can
declare its range where the knob lives and the run config (``fp8rl.config``, which
re-exports this module as ``fp8rl.config.fields``) builds on that declaration:
``fp8rl.rl.calibration.CalibrationKnobs`` is Calibrated Clipping's knobs, declared once and
read by the run config's ``clipping`` group, the calibrator and verl's loss config alike.

Every numeric field of the run config is declared with :func:`num` and every closed set
with :func:`choice`; a test walks the schema and fails on a numeric leaf without a range,
or without an upper bound unless it is on the test's justified list (seeds). A number must
be finite (NaN and +-inf are refused) unless its declaration says ``finite=False``; NaN is
never inside a range. ``sizes_compute=True`` marks a count whose upper bound is a cap on a
run's compute: the experiment system's pre-run check refuses a value above it with the cost
model's estimate (``fp8rl.experiments.grid``). Messages name the config key
(``algorithm.eps_low``), the value and the requirement.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ConfigError",
    "Range",
    "check_fields",
    "choice",
    "is_late",
    "like",
    "num",
    "num_list",
]


class ConfigError(ValueError):
    """A config that cannot run; the message names the keys to change."""


@dataclass(frozen=True)
class Range:
    """``ge <= x``, ``gt < x``, ``x <= le``, ``x < lt`` (None: no bound on that side)."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None

    def contains(self, value: float) -> bool:
        """Whether ``value`` is inside (NaN never is: every comparison with it is false)."""
        if value != value:  # NaN
            return False
        return not (
            (self.ge is not None and value < self.ge)
            or (self.gt is not None and value <= self.gt)
            or (self.le is not None and value > self.le)
            or (self.lt is not None and value >= self.lt)
        )

    def describe(self) -> str:
        low = (
            f"{self.ge} <= "
            if self.ge is not None
            else f"{self.gt} < "
            if self.gt is not None
            else ""
        )
        high = (
            f" <= {self.le}"
            if self.le is not None
            else f" < {self.lt}"
            if self.lt is not None
            else ""
        )
        return f"need {low}x{high}"


def num(
    default: Any,
    *,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    null: str | None = None,
    finite: bool = True,
    sizes_compute: bool = False,
    late: bool = False,
) -> Any:
    """A numeric field with its accepted range; ``null`` says what None stands for (None
    is refused when it is not given). ``finite=False`` lets ``+-inf`` through (inside the
    range); ``sizes_compute``: the upper bound caps a run's compute (see the module);
    ``late``: added after runs were recorded (see :func:`is_late`)."""
    meta = {"range": Range(ge, gt, le, lt), "null": null, "finite": finite}
    if sizes_compute:
        meta["sizes_compute"] = True
    if late:
        meta["late"] = True
    return field(default=default, metadata=meta)


def is_late(f: dataclasses.Field) -> bool:
    """Whether field ``f`` was declared ``late=True``: a setting added after runs were
    recorded, which a config carries (and its run id and ``config_sha256`` hash) only when it
    differs from its default, so every earlier config keeps its hash."""
    return bool(f.metadata.get("late"))


def num_list(
    default: list[int] | None,
    *,
    ge: float | None = None,
    le: float | None = None,
    null: str | None = None,
    late: bool = False,
) -> Any:
    """A list of numbers, each in the range and finite; ``null`` says what None means (None
    not allowed without it); ``late`` as :func:`num`'s."""
    meta = {"range": Range(ge=ge, le=le), "list": True, "null": null, "finite": True}
    if late:
        meta["late"] = True
    if default is None:
        return field(default=None, metadata=meta)
    return field(default_factory=lambda: list(default), metadata=meta)


def choice(
    default: str | None, options: Sequence[str], *, null: str | None = None, late: bool = False
) -> Any:
    """A field whose value is one of ``options`` (the room that implements them names them).

    A tuple is kept as given; another sequence is kept as a live view (the recipe
    registry's ``RecipeNames``: a recipe registered later is a valid choice at once).
    ``late`` as :func:`num`'s."""
    opts = (
        options
        if isinstance(options, Sequence) and not isinstance(options, list)
        else tuple(options)
    )
    meta: dict[str, Any] = {"choices": opts, "null": null}
    if late:
        meta["late"] = True
    return field(default=default, metadata=meta)


def like(cls: type, name: str) -> Any:
    """A field declared as ``cls``'s field ``name`` is (the same default and accepted values),
    for a value two groups carry: one declaration, read by both."""
    (f,) = (f for f in dataclasses.fields(cls) if f.name == name)
    if f.default_factory is not dataclasses.MISSING:
        return field(default_factory=f.default_factory, metadata=f.metadata)
    return field(default=f.default, metadata=f.metadata)


def _key(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def check_fields(obj: object, prefix: str = "") -> None:
    """Check every :func:`num`/:func:`num_list`/:func:`choice` field of the dataclass
    ``obj``; raises :class:`ConfigError` naming ``<prefix>.<field>``."""
    for f in dataclasses.fields(obj):  # type: ignore[arg-type]
        meta, value, key = f.metadata, getattr(obj, f.name), _key(prefix, f.name)
        if "range" not in meta and "choices" not in meta:
            continue
        if value is None:
            if meta.get("null") is None:
                raise ConfigError(f"{key} must not be null")
            continue
        if "choices" in meta:
            if value not in meta["choices"]:
                raise ConfigError(f"{key}={value!r} is not one of {list(meta['choices'])}")
            continue
        rng: Range = meta["range"]
        for item in value if meta.get("list") else [value]:
            integer = str(f.type).startswith(("int", "list[int]"))
            if isinstance(item, bool) or not isinstance(item, int if integer else int | float):
                kind = "an integer" if integer else "a number"
                raise ConfigError(f"{key}={value!r} must be {kind}")
            finite = not isinstance(item, float) or math.isfinite(item)  # an int always is
            if meta.get("finite", True) and not finite:
                raise ConfigError(f"{key}={value!r} is not a finite number: {rng.describe()}")
            if not rng.contains(item):
                raise ConfigError(f"{key}={value!r} is out of range: {rng.describe()}")
