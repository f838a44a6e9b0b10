"""A synthetic run store for the analysis tests: runs with chosen arms, seeds, held-out
scores and metric curves, written through the real RunStore API (no training)."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Mapping
from typing import Any

from fp8rl.runs import RunStore, atomic_write_json

ARM_CONFIGS: dict[str, dict[str, Any]] = {
    "BF16": {
        "granularity": {"training": "bf16", "rollout": None},
        "clipping": {"mode": "standard"},
    },
    "FP8 rollout + BF16 training": {
        "granularity": {"training": "bf16", "rollout": "block"},
        "clipping": {"mode": "standard"},
    },
    **{
        f"{g.capitalize()} FP8{' + CC' if cc else ''}": {
            "granularity": {"training": g, "rollout": r},
            "clipping": {"mode": "calibrated" if cc else "standard"},
        }
        for g, r in (("tensorwise", "tensor"), ("rowwise", "channel"), ("blockwise", "block"))
        for cc in (False, True)
    },
    "BF16 + CC (control)": {
        "granularity": {"training": "bf16", "rollout": None},
        "clipping": {"mode": "calibrated"},
    },
    # the Table-2 study's two controls (on rowwise, its STUDY_CONTROL_GRANULARITY)
    "Rowwise FP8 + CC (lower only)": {
        "granularity": {"training": "rowwise", "rollout": "channel"},
        "clipping": {"mode": "calibrated", "lower_only": True},
    },
    "Rowwise FP8 [fp8rl_cispo loss]": {
        "granularity": {"training": "rowwise", "rollout": "channel"},
        "clipping": {"mode": "standard", "loss": "fp8rl_cispo"},
    },
    # the frontier pilot's dose lever: MX recipes of the registry, BF16 rollout
    **{
        label: {
            "granularity": {"training": name, "rollout": None},
            "clipping": {"mode": "standard"},
        }
        for name, label in (("mxfp8", "MXFP8"), ("mxfp6_e3m2", "MXFP6 E3M2"), ("mxfp4", "MXFP4"))
    },
}


def config(arm: str, seed: int, steps: int = 4, **extra: Any) -> dict[str, Any]:
    cfg = {
        **copy.deepcopy(ARM_CONFIGS[arm]),  # the dotted keys below must not edit ARM_CONFIGS
        "seed": seed,
        "steps": steps,
        "algorithm": {"eps_low": 0.2, "eps_high": 0.2, "name": "grpo"},
        "eval": {"limit": 10, "k": 1, "greedy": True},
    }
    for key, value in extra.items():
        node = cfg
        *path, last = key.split(".")
        for part in path:
            node = node.setdefault(part, {})
        node[last] = value
    return cfg


def add_run(
    store: RunStore,
    experiment: str,
    arm: str,
    seed: int,
    *,
    scores: Mapping[str, float] | None = None,
    curve: Callable[[int], Mapping[str, float]] | None = None,
    steps: int = 4,
    status: str = "done",
    stop_at: int | None = None,
    first_eval: Mapping[str, float] | None = None,
    last_eval: Mapping[str, float] | None = None,
    **extra: Any,
) -> str:
    """One run: metrics from ``curve(step)`` for steps 1..steps (or ..stop_at), held-out
    ``scores`` per family at steps 0 (0.0, or ``first_eval``) and the last (the mean over
    families as ``all``; ``last_eval`` adds metrics by full name, e.g.
    ``val-aux/all/garbled/mean@1``), then ``status``. Returns the run id."""
    run = store.open_run(experiment, config(arm, seed, steps, **extra))
    with run:
        last = steps if stop_at is None else stop_at
        for step in range(1, last + 1):
            run.log_metrics(step, dict(curve(step)) if curve else {"actor/entropy": 1.0})
        if scores is not None and stop_at is None:
            data = {f"val-core/{f}/acc/mean@1": v for f, v in scores.items()}
            data["val-core/all/acc/mean@1"] = sum(scores.values()) / len(scores)
            run.log_eval(0, {k: 0.0 for k in data} | dict(first_eval or {}))
            run.log_eval(steps, data | dict(last_eval or {}))
        if status != "running":
            run.mark(status, "" if status == "done" else f"synthetic {status}")
    if status == "running":  # as another machine's run in progress leaves it
        record = json.loads((run.path / "status.json").read_text())
        record.update(status="running", host="another-host", reason="")
        atomic_write_json(run.path / "status.json", record)
    return run.run_id
