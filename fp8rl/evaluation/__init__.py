"""Evaluation through lm-evaluation-harness: the eight tiny benchmarks and the paper's math
benchmarks as lm-eval tasks reading local files, scored with the shared checker and
math-verify, avg@k over every sample, written into the run store (``docs/evaluation.md``).

- :mod:`~fp8rl.evaluation.benchmarks`: the data schema, the benchmark registry, the tiny
  held-out sets (read from ``data/tiny_eval``; this room never imports a backend);
- :mod:`~fp8rl.evaluation.prepare`: local copies (or, online, ``datasets``) -> the schema;
- :mod:`~fp8rl.evaluation.scoring`: answer checking, safe off the main thread;
- ``tasks/``: the lm-eval task files (``--include_path fp8rl/evaluation/tasks``);
- :mod:`~fp8rl.evaluation.settings`: the ``lm_eval`` settings (never in a run id);
- :mod:`~fp8rl.evaluation.runner`: one lm-eval call on one HF checkpoint (hf or vllm);
- :mod:`~fp8rl.evaluation.store`: a run's exported checkpoints -> ``lm_eval.jsonl`` rows
  and per-sample logs under ``<run>/lm_eval/``, resumable.

Importing this package loads neither lm-eval nor torch; the runner imports lm-eval when
it runs.
"""
