"""The experiment system: Hydra configs -> validated runs -> a backend -> the run store.

An entry-point room (``sweep.py`` is its command line). It composes a Hydra config
(``experiments/conf``: granularity, algorithm, model, clipping, backend, rollout, train,
eval; ``sweeps/`` for grids) into the run config (``fp8rl.config.RunConfig``: the tree's
keys are its keys), plans grids (run ids, store status, cost), shows their progress, and
hands each run to its backend through a small protocol. It imports ``fp8rl.config`` and
``fp8rl.runs`` and no backend: backends are loaded by name from the registry in
:mod:`~fp8rl.experiments.backends`. Nothing else in ``fp8rl`` imports it. Docs:
``docs/experiments.md``.

Modules:

- :mod:`~fp8rl.experiments.schema`: ``ExperimentConfig`` (the run config plus where and
  how to run) registered in Hydra's ConfigStore, ``validate``, ``ConfigError``.
- :mod:`~fp8rl.experiments.backends`: the backend protocol (resolve, run, cost), the
  registry (``tiny``; ``verl`` not available yet) and ``resolve_run(cfg)``.
- :mod:`~fp8rl.experiments.compose`: ``compose(overrides)`` through Hydra's compose API and
  ``expand_grid(overrides)`` through Hydra's own override parser.
- :mod:`~fp8rl.experiments.grid`: ``plan_grid`` (run id, store status, estimated cost per
  point) and the measured-step-time ``CostModel``.
- :mod:`~fp8rl.experiments.progress`: rich tables and the one-line progress summary.
- :mod:`~fp8rl.experiments.run_report`: ``run_summary(path)``, one run explained in a few
  lines (held-out results beside the base, state, recipe, path; ``scripts/show_run.py``).
- :mod:`~fp8rl.experiments.dispatch`: ``run_one(cfg)``, one run on its backend.
- :mod:`~fp8rl.experiments.sweeper`: ``GridSweeper``, Hydra's basic sweeper plus
  validation of every point before any run, pending registration, de-duplication,
  progress and a failure summary.
- :mod:`~fp8rl.experiments.search`: Optuna searches whose trials are runs in the store.
"""
