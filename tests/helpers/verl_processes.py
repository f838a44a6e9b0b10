"""What a verl-on-CPU run left running (the e2e, resume and fault tests' check)."""

from __future__ import annotations

from pathlib import Path


def processes_of(path: Path) -> list[int]:
    """Live processes whose environment names ``path`` (verl's driver and its Ray)."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if str(path).encode() in (entry / "environ").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found
