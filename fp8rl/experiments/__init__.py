"""The experiment system: Hydra configs -> validated runs -> the run store, one grid at a time.

An entry-point room (``sweep.py`` is its command line). It turns a composed Hydra config
(``experiments/conf``: granularity, algorithm, model, clipping, backend, rollout, train,
eval; ``sweeps/`` for grids) into a backend's run config, plans grids (run ids, store
status, cost), shows their progress, and dispatches each run to its backend. It may import
``fp8rl.tiny``, ``fp8rl.runs``, ``fp8rl.numerics`` and ``fp8rl.rl``; nothing else in
``fp8rl`` imports it. Docs: ``docs/experiments.md``.

Modules:

- :mod:`~fp8rl.experiments.schema`: the structured configs (dataclasses registered in
  Hydra's ConfigStore), one per group, and ``ConfigError``.
- :mod:`~fp8rl.experiments.build`: ``to_train_config(cfg)``, the one translation from a
  Hydra config to ``fp8rl.tiny.train.TrainConfig``.
- :mod:`~fp8rl.experiments.compose`: ``compose(overrides)`` through Hydra's compose API and
  ``expand_grid(overrides)`` through Hydra's own override parser and sweeper splitting.
- :mod:`~fp8rl.experiments.grid`: ``plan_grid`` (run id, store status, estimated cost per
  point) and ``grid_status``.
- :mod:`~fp8rl.experiments.progress`: rich tables and the one-line progress summary.
- :mod:`~fp8rl.experiments.dispatch`: ``run_one(cfg)``, the backend dispatch.
- :mod:`~fp8rl.experiments.sweeper`: ``GridSweeper``, Hydra's basic sweeper plus
  validation of every point before any run, pending registration, de-duplication,
  progress and a failure summary.
"""
