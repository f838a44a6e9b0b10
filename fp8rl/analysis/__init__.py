"""Analysis of run stores: tidy frames, the Table-2 layout, figures, verdicts and reports.

Backend-blind: everything here reads a run store (``runs/`` or an exported ``results/``
folder, which has the same layout) through :class:`fp8rl.runs.RunStore`, never a backend.

* :mod:`.load`     — runs, training metrics and held-out evaluations as pandas frames.
* :mod:`.arms`     — which arm of the paper's tables a run config is.
* :mod:`.stats`    — mean and t-interval over seeds, paired differences.
* :mod:`.tables`   — the Table-2 layout (Markdown, LaTeX, CSV) and the paper's figures.
* :mod:`.verdicts` — the rules that say what did and did not reproduce.
* :mod:`.curves`   — entropy surges and entropy stability.
* :mod:`.figures`  — matplotlib figures, each returning the data it plotted.
* :mod:`.export`   — an experiment's compact results into ``results/``.
* :mod:`.report`   — a report folder: tables, figures and a generated summary.
* :mod:`.viewer`   — the token viewer: static HTML pages of a run's sample dumps, and two
  runs side by side.
* :mod:`.reproduce` — ``make reproduce-table2``: which grids a size runs, where results go.
* :mod:`.first_look` — the tiny trainer's first look: improvement over the SFT base, one
  row per recipe, the calibration check and its verdict.
* :mod:`.regime`   — the regime study: FP8 vs its BF16 shadow, and its verdicts.
* :mod:`.noise`    — the noise table: std of the log-ratio noises per recipe.
* :mod:`.study`    — the pre-registered Table-2 study: each run's endpoints (accuracy,
  entropy surge, garbled share, lower-clip gap), the endpoint table, mechanism verdicts.
* :mod:`.study_report` — the study's part of a report: controls, BF16's gain over the SFT
  base, run time per arm, the protocol-precedes-runs check.
* :mod:`.thresholds` — failure thresholds from a study's own BF16 reference runs.
* :mod:`.frontier_report` — the frontier pilot's report (``make frontier-pilot-report``;
  its rule: ``studies/frontier_pilot/rule.py``).

Scripts in ``scripts/`` (``first_look.py``, ``regime_report.py``, ``noise_table.py``) only
find runs and print what these return.
"""
