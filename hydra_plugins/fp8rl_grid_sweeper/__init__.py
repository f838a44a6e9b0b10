"""fp8rl's grid sweeper where Hydra looks for plugins.

Hydra instantiates sweepers only from the ``hydra_plugins`` namespace package, so this
module gives :class:`fp8rl.experiments.sweeper.GridSweeper` a name there. The code and its
documentation live in ``fp8rl/experiments/sweeper.py``; ``hydra/sweeper: grid`` (selected
by ``experiments/conf/config.yaml``) is registered by
``fp8rl.experiments.schema.register_configs``.
"""

from fp8rl.experiments.sweeper import GridSweeper as _GridSweeper


class GridSweeper(_GridSweeper):
    """:class:`fp8rl.experiments.sweeper.GridSweeper`, under Hydra's plugin namespace."""
