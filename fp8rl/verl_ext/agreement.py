"""One method at two scales: a tiny-backend run and the same config's verl run, step by step.

The two backends share the method's functions (losses, advantages, calibration, sampler), not
their loops: the tiny backend's trainer (``fp8rl.tiny.train``) and verl's V1 trainer with
fp8rl's actor, loss and CPU rollout inside it. :func:`compare_runs` compares what both wrote
for one step of one config (``runs/<experiment>/<id>`` of each backend, with
``train.dump_samples_every`` and ``train.checkpoint_every`` covering the step):

- **exact** (the same bits): the step's prompts and sampled token ids, each response's reward
  (as FP32: verl holds token scores in a float32 tensor), the rollout engine's log-probs. Both
  backends sample the step's batch in one call of the same sampler with the same seed (fp8rl's CPU
  rollout server waits for the batch verl sends
  row by row: ``fp8rl.verl_ext.agent_loop``, "Seeded batches"), on the same weights.
- **close** (within a stated tolerance): what each trainer computes from those samples - the
  old (trainer) log-probs, each token's ratio at its last PPO visit, the step's loss, gradient
  norm, clip shares by side and advantage sign, KL, calibrated bounds, and the updated
  weights. The two trainers reach them through different code (verl packs the micro-batch
  without padding and runs its FSDP2 engine; the tiny trainer runs the padded batch), so FP32
  sums are reassociated: about 1e-6 relative for FP32 compute. Where a value is rounded to a
  narrower format after such a sum - BF16 emulation, an FP8 cast - a reassociation that moves
  an FP32 value across a rounding boundary flips one element by one BF16 (2^-8 relative) or
  FP8 step, and the flip propagates; the per-recipe tolerances of :data:`TOLERANCES` say how
  much that can move each quantity, measured (docs/verl_backend.md, "Agreement").
- clip flags: a token whose ratio lies within the ratio tolerance of a bound may be clipped
  on one side only; any other disagreement fails.

Every check is a :class:`Check`; :func:`failures` lists those that fail.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "CLOSE_METRICS",
    "TOLERANCES",
    "Check",
    "Tolerance",
    "compare_runs",
    "failures",
    "verl_step_weights",
]

#: The step metrics both backends log under the same name that must agree.
CLOSE_METRICS = (
    "actor/pg_loss",
    "actor/grad_norm",
    "actor/pg_clipfrac",
    "actor/pg_clipfrac_lower",
    "actor/ppo_kl",
    "fp8rl/clipfrac_low_negadv",
    "fp8rl/clipfrac_low_posadv",
    "fp8rl/clipfrac_high_negadv",
    "fp8rl/clipfrac_high_posadv",
    "fp8rl/clip_low",
    "fp8rl/clip_high",
)
#: The step metrics that are exact (functions of the samples and rewards only).
EXACT_METRICS = ("critic/score/mean", "critic/score/max", "critic/score/min")


@dataclass(frozen=True)
class Tolerance:
    """Relative tolerance of values (with an absolute floor for values near zero), of
    per-token log-probs (absolute, in nats) and of the updated weights (relative to the
    step's weight change, max over elements)."""

    rel: float
    abs: float
    log_prob: float
    weight: float


#: Per training recipe: FP32 compute (``bf16`` emulation included: rounding flips, see the
#: module docstring) and the FP8 recipes (whose casts flip more often: a one-step FP8 flip is
#: 2^-3 or 2^-2 relative on one element).
TOLERANCES = {
    "fp32": Tolerance(rel=1e-6, abs=1e-7, log_prob=1e-5, weight=1e-5),
    "bf16": Tolerance(rel=1e-3, abs=1e-5, log_prob=2e-2, weight=1e-2),
    "fp8": Tolerance(rel=1e-2, abs=1e-4, log_prob=5e-2, weight=5e-2),
}


@dataclass(frozen=True)
class Check:
    """One comparison: its name, kind (``exact`` or ``close``), outcome and what it saw."""

    name: str
    kind: str
    ok: bool
    detail: str


def failures(checks: Iterable[Check]) -> list[Check]:
    return [c for c in checks if not c.ok]


def _f32(x: Any) -> Any:
    """A reward as FP32 holds it (verl keeps token scores in a float32 tensor)."""
    import struct

    return None if x is None else struct.unpack("f", struct.pack("f", float(x)))[0]


def _dump(run_dir: Path, step: int) -> dict[str, Any]:
    path = run_dir / "samples" / f"step_{step:08d}.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no token dump of step {step} (train.dump_samples_every)")
    return json.loads(path.read_text())


def _metrics(run_dir: Path, step: int) -> dict[str, float]:
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record["step"] == step:
            return record["data"]
    raise KeyError(f"{run_dir}: no metrics of step {step}")


def _close(a: float, b: float, tol: Tolerance) -> tuple[bool, float]:
    diff = abs(a - b)
    scale = max(abs(a), abs(b))
    return diff <= max(tol.abs, tol.rel * scale), diff / scale if scale else diff


def verl_step_weights(run_dir: Path, step: int) -> dict[str, Any]:
    """The actor's weights after ``step`` from verl's FSDP checkpoint of a one-rank run
    (``verl/checkpoints/global_step_<n>/actor/model_world_size_1_rank_0.pt``), HF names."""
    import torch

    actor = run_dir / "verl" / "checkpoints" / f"global_step_{step}" / "actor"
    shards = sorted(actor.glob("model_world_size_*_rank_*.pt"))
    if len(shards) != 1:
        raise FileNotFoundError(f"{actor}: expected one rank's model shard, found {shards}")
    state = torch.load(shards[0], map_location="cpu", weights_only=False)
    out = {}
    for name, value in state.items():
        value = value.full_tensor() if hasattr(value, "full_tensor") else value
        out[name] = value.detach().float()
    return out


def _tiny_step_weights(run_dir: Path, step: int) -> dict[str, Any]:
    import torch

    path = run_dir / "checkpoints" / f"step_{step:08d}.pt"
    state = torch.load(path, map_location="cpu", weights_only=False)["state"]["model"]
    return {k: v.float() for k, v in state.items()}


def _sample_checks(tiny: dict[str, Any], verl: dict[str, Any], tol: Tolerance) -> list[Check]:
    checks = []
    ts = {s["row"]: s for s in tiny["samples"]}
    vs = {s["row"]: s for s in verl["samples"]}
    checks.append(Check("dumped rows", "exact", sorted(ts) == sorted(vs),
                        f"tiny {sorted(ts)}, verl {sorted(vs)}"))  # fmt: skip
    rows = sorted(set(ts) & set(vs))
    for key in ("prompt_ids", "response_ids", "score", "finished"):
        same_value = _f32 if key == "score" else (lambda x: x)
        bad = [r for r in rows if same_value(ts[r].get(key)) != same_value(vs[r].get(key))]
        seen = f"{len(rows) - len(bad)}/{len(rows)} rows equal; differ: {bad[:8]}"
        checks.append(Check(f"step samples: {key}", "exact", not bad, seen))
    same = [r for r in rows if ts[r]["response_ids"] == vs[r]["response_ids"]]
    for key, kind in (("rollout_log_prob", "exact"), ("old_log_prob", "close"),
                      ("ratio", "close")):  # fmt: skip
        worst, bad = 0.0, 0
        for r in same:
            for a, b in zip(ts[r]["tokens"], vs[r]["tokens"], strict=True):
                x, y = a[key], b[key]
                d = abs(math.log(x) - math.log(y)) if key == "ratio" else abs(x - y)
                worst = max(worst, d)
                bad += d > (0.0 if kind == "exact" else tol.log_prob)
        limit = 0.0 if kind == "exact" else tol.log_prob
        checks.append(Check(f"per-token {key}", kind, bad == 0 and bool(same),
                            f"max |diff| {worst:.3g} (log space for ratio; limit {limit:g}) over "
                            f"{len(same)} rows, {bad} tokens beyond"))  # fmt: skip
    low, high = tiny["clip_low"], tiny["clip_high"]
    unexplained, near = 0, 0
    for r in same:
        for a, b in zip(ts[r]["tokens"], vs[r]["tokens"], strict=True):
            if (a["clipped_low"], a["clipped_high"]) == (b["clipped_low"], b["clipped_high"]):
                continue
            lr = math.log(a["ratio"])
            if min(abs(lr - math.log(low)), abs(lr - math.log(high))) <= tol.log_prob:
                near += 1
            else:
                unexplained += 1
    checks.append(Check("per-token clip flags", "close", unexplained == 0 and bool(same),
                        f"{near} flips within the ratio tolerance of a bound, {unexplained} "
                        "other"))  # fmt: skip
    for key in ("clip_low", "clip_high", "batch_size", "mini_batches"):
        checks.append(Check(f"dump {key}", "exact" if "clip" not in key else "close",
                            _close(float(tiny[key]), float(verl[key]), tol)[0],
                            f"tiny {tiny[key]}, verl {verl[key]}"))  # fmt: skip
    return checks


def compare_runs(
    tiny_dir: str | Path,
    verl_dir: str | Path,
    step: int = 1,
    tolerance: Tolerance | None = None,
    weights: bool = True,
) -> list[Check]:
    """Every check of the module docstring for ``step`` of the two runs."""
    tiny_dir, verl_dir = Path(tiny_dir), Path(verl_dir)
    if tolerance is None:
        tolerance = TOLERANCES["fp32"]
    tol = tolerance
    checks = _sample_checks(_dump(tiny_dir, step), _dump(verl_dir, step), tol)
    tm, vm = _metrics(tiny_dir, step), _metrics(verl_dir, step)
    for name in EXACT_METRICS:
        ok = name in tm and name in vm and tm[name] == vm[name]
        checks.append(Check(name, "exact", ok, f"tiny {tm.get(name)}, verl {vm.get(name)}"))
    for name in CLOSE_METRICS:
        if name not in tm or name not in vm:
            seen = f"missing: tiny {name in tm}, verl {name in vm}"
            checks.append(Check(name, "close", False, seen))
            continue
        ok, rel = _close(float(tm[name]), float(vm[name]), tol)
        seen = f"tiny {tm[name]:.9g}, verl {vm[name]:.9g}, rel {rel:.2g}"
        checks.append(Check(name, "close", ok, seen))
    calib = sorted(k for k in tm if k.startswith("fp8rl/calib/") and k in vm)
    for name in calib:
        ok, rel = _close(float(tm[name]), float(vm[name]), tol)
        checks.append(Check(name, "close", ok, f"tiny {tm[name]:.9g}, verl {vm[name]:.9g}"))
    if weights:
        checks.append(_weight_check(tiny_dir, verl_dir, step, tol))
    return checks


def _weight_check(tiny_dir: Path, verl_dir: Path, step: int, tol: Tolerance) -> Check:
    """The updated weights: max over tensors of |w_tiny - w_verl| / max |w_step - w_base|
    (the step's own change; a wrong update is off by its whole size)."""
    tiny = _tiny_step_weights(tiny_dir, step)
    verl = verl_step_weights(verl_dir, step)
    if sorted(tiny) != sorted(verl):
        missing = sorted(set(tiny) ^ set(verl))[:5]
        return Check("updated weights", "close", False, f"different tensors: {missing}")
    base = _tiny_step_weights(tiny_dir, step - 1) if step > 1 else _base_weights(verl_dir)
    worst, where = 0.0, ""
    for name, a in tiny.items():
        change = float((a - base[name]).abs().max())
        diff = float((a - verl[name]).abs().max())
        rel = diff / change if change else diff
        if rel > worst:
            worst, where = rel, name
    seen = f"max |diff| / |step change| {worst:.3g} (limit {tol.weight:g}) at {where}"
    return Check("updated weights", "close", worst <= tol.weight, seen)


def _base_weights(verl_dir: Path) -> dict[str, Any]:
    """The weights the run started from: the tiny base the launcher exported."""
    import torch
    from safetensors.torch import load_file

    model = verl_dir / "verl" / "model"
    files = sorted(model.glob("*.safetensors"))
    if files:
        out = {}
        for f in files:
            out.update(load_file(str(f)))
        return {k: v.float() for k, v in out.items()}
    state = torch.load(model / "pytorch_model.bin", map_location="cpu", weights_only=True)
    return {k: v.float() for k, v in state.items()}
