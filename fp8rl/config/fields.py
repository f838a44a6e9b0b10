"""The config's field helpers, :mod:`fp8rl.fields` (a ground-floor module, so that the rooms
below the config can declare their knobs' ranges with them), under the config's name."""

from fp8rl.fields import ConfigError, Range, check_fields, choice, is_late, like, num, num_list

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
