"""fp8rl: full-pipeline FP8 RL reproduction harness."""

from collections.abc import Callable
from typing import Any

from fp8rl import _quiet

# First thing on any fp8rl import, before torchao can be imported by anything (fp8rl.numerics,
# or transformers' quantizer registry): two import-time log lines that read like breakage.
_quiet.install()


def lazy_exports(
    package: str, exports: dict[str, str], namespace: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """PEP 562 hooks for a package whose public names load on first use: ``exports`` maps
    a name to the submodule of ``package`` that defines it; the first access imports that
    submodule and caches the value in ``namespace`` (the package's ``globals()``). Returns
    ``(__getattr__, __dir__)``; ``fp8rl.numerics`` and ``fp8rl.rl`` use it so that their
    torch-free modules load without torch."""
    import importlib

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted([*namespace, *exports])

    return __getattr__, __dir__
