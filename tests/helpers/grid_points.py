"""Choosing grid points for tests that cannot afford every point of a preset's grid."""

from __future__ import annotations


def covering_points(points: list[list[str]]) -> list[list[str]]:
    """Points, in grid order, such that every override value of the grid appears at least
    once (a point is kept when it brings a value not seen yet)."""
    seen: set[str] = set()
    chosen = []
    for point in points:
        if set(point) - seen:
            chosen.append(point)
            seen |= set(point)
    return chosen
