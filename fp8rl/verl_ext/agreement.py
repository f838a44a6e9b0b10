"""One method at two scales: a tiny-backend run and the same config's verl run, step by step.

The two backends share the method's functions (losses, advantages, calibration, sampler), not
their loops: the tiny backend's trainer (``fp8rl.tiny.train``) and verl's V1 trainer with
fp8rl's actor, loss, engine and CPU rollout inside it. :func:`compare_runs` compares what both
wrote for one step of one config (``runs/<experiment>/<id>`` of each backend, with
``train.dump_samples_every`` and ``train.checkpoint_every`` covering the step):

- **exact** (the same bits): the step's prompts and sampled token ids, each response's reward
  (as FP32: verl holds token scores in a float32 tensor), the rollout engine's log-probs, the
  bounds in force. Both backends sample the step's batch in one call of the same sampler with
  the same seed on the same weights (fp8rl's CPU rollout server waits for the batch verl sends
  row by row: ``fp8rl.verl_ext.agent_loop``, "Seeded batches"; fp8rl's trainer keeps it in
  draw order: ``fp8rl.verl_ext.actor_trainer``).
- **the trainer's forward** (old log-probs) within FP32 reassociation: verl packs each
  micro-batch without padding, the tiny trainer pads it, and on the CPU verl's engine applies
  the recipe exactly as the tiny trainer does (``FP8EngineConfig.fp8rl_emulate``).
- **after an optimizer step** (loss, gradient norm, KL, clip shares by side and sign, each
  token's ratio at its last PPO visit, calibrated bounds, the updated weights) within the
  recipe's :data:`TOLERANCES`. Those are not FP32-tight, and cannot be: the backward rounds to
  BF16 (and FP8) after reassociated FP32 sums, so single elements flip by one BF16 or FP8 step,
  and Adam's first steps move each weight by about ``lr * g / |g|`` whatever ``|g|`` is, so
  elements whose gradient is of the flips' size move by up to ``lr`` either way.
  :func:`layout_noise_floor` measures that floor with one trainer (the same rows batched two
  ways, one AdamW step): docs/verl_backend.md, "One method at two scales", has the numbers.

Every check is a :class:`Check`; :func:`failures` lists those that fail.
:func:`agreement_record` measures one arm (its checks, its negative control's, the layout
noise floor, the runs' wall times and machine) as a plain record that
``scripts/verl_agreement.py`` stores beside the arm's compact results
(``results/verl_agreement/<arm>/agreement.json``); :func:`agreement_markdown` renders the
records (the ``verl_agreement`` study's report, ``python -m fp8rl.study report
verl_agreement``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from fp8rl.runs.store import (
    CONFIG_FILE,
    METRICS_FILE,
    PROVENANCE_FILE,
    STATUS_FILE,
    attempt_seconds,
)

__all__ = [
    "ARMS",
    "CLOSE_METRICS",
    "COMMON",
    "CONTROL",
    "LAYOUT_AGGREGATES",
    "RECORD_FILE",
    "SUM_ORDER_METRICS",
    "TOLERANCES",
    "VERL",
    "Check",
    "Tolerance",
    "agreement_markdown",
    "agreement_record",
    "compare_ranks",
    "compare_runs",
    "failures",
    "layout_noise_floor",
    "read_records",
    "tolerance_for",
    "verl_step_weights",
]

#: The arms the agreement is measured on (tests/verl_ext/test_backend_agreement.py,
#: scripts/verl_agreement.py): overrides of ``python sweep.py`` after :data:`COMMON`.
ARMS: dict[str, tuple[str, ...]] = {
    "bf16": ("granularity=bf16",),
    "rowwise": ("granularity=rowwise",),
    "blockwise_cc": (
        "granularity=blockwise",
        "clipping=calibrated",
        "clipping.calibrate_at_start=true",
    ),
}
#: Every arm's run: the test study, two PPO epochs (every row's last visit follows an update,
#: so the dump holds the whole batch), a token dump and a checkpoint every step, no evaluation.
COMMON: tuple[str, ...] = (
    "+experiment=test", "model=tiny-test", "train.dump_samples_every=1", "train.dump_samples=16",
    "train.ppo_epochs=2", "train.checkpoint_every=1", "eval.every=0",
)  # fmt: skip
#: The verl side of an arm, and the negative control's change (on the tiny side).
VERL: tuple[str, ...] = ("backend=verl", "cluster=local_cpu")
CONTROL: tuple[str, ...] = ("algorithm.eps_low=0.03",)

#: Step metrics both backends log under the same name, by what bounds their difference: the
#: update's noise (relative), a share of tokens (absolute), the bounds in force (exact up to
#: float formatting), the samples alone (exact).
UPDATE_METRICS = ("actor/pg_loss", "actor/grad_norm", "actor/ppo_kl")
SHARE_METRICS = (
    "actor/pg_clipfrac",
    "actor/pg_clipfrac_lower",
    "fp8rl/clipfrac_low_negadv",
    "fp8rl/clipfrac_low_posadv",
    "fp8rl/clipfrac_high_negadv",
    "fp8rl/clipfrac_high_posadv",
)
BOUND_METRICS = ("fp8rl/clip_low", "fp8rl/clip_high")
EXACT_METRICS = ("critic/score/mean", "critic/score/max", "critic/score/min")
#: On a calibration step: the schedule (exact) and the bounds it calibrated (update noise: the
#: calibrator reads the ratios after the update).
CALIBRATION_EXACT = ("fp8rl/calib/is_calibration_step", "fp8rl/calib/applies_from_step")
CALIBRATION_BOUNDS = ("fp8rl/calib/new_clip_low", "fp8rl/calib/new_clip_high")
CLOSE_METRICS = UPDATE_METRICS + SHARE_METRICS + BOUND_METRICS
#: Metrics that are means over micro-batches and ranks: their values move with the number of
#: data-parallel ranks even on the same tokens (:func:`compare_ranks`).
LAYOUT_AGGREGATES = ("actor/ppo_kl", *SHARE_METRICS)
#: Means of the same values summed in another order across ranks: equal within 1e-6, not
#: bitwise (:func:`compare_ranks`).
SUM_ORDER_METRICS = ("critic/score/mean",)


@dataclass(frozen=True)
class Tolerance:
    """How far each kind of quantity may differ between the backends.

    forward: old (trainer) log-probs, absolute nats - one forward of the same weights on the
    same tokens, differing only by FP32 reassociation (verl packs the micro-batch);
    update_rel: loss, gradient norm, KL and calibrated bounds, relative, or within
    ``update_abs`` (a value near zero: the KL of a step whose rows are mostly visited before
    any update); share: clip shares,
    absolute; ratio: each token's ratio at its last PPO visit, absolute in log space; weight:
    the updated weights, ``||w_verl - w_tiny|| / ||w_tiny - w_before||`` over all parameters;
    bound: the bounds in force (config or an earlier calibration), relative.
    """

    forward: float
    update_rel: float
    update_abs: float
    share: float
    ratio: float
    weight: float
    bound: float = 1e-9


#: Per recipe kind, from the measurements in docs/verl_backend.md ("One method at two
#: scales"): the largest difference seen between the backends on the test study, rounded up
#: to the next power of ten or a 2x margin. The forward agrees to FP32 reassociation
#: (<= 5e-7 measured); everything after an optimizer step agrees only as far as BF16/FP8
#: rounding flips and Adam's first step allow: Adam's update is ~ lr * g / |g| per element, so
#: elements whose gradient is small relative to the flips' noise move by up to lr in either
#: direction (:func:`layout_noise_floor`: the same trainer on the same rows, batched one way or
#: another, drifts 0.5-4% apart in one step).
TOLERANCES = {
    "bf16": Tolerance(1e-5, update_rel=3e-3, update_abs=3e-4, share=0.01, ratio=0.05, weight=0.05),
    "fp8": Tolerance(1e-5, update_rel=3e-2, update_abs=3e-3, share=0.03, ratio=0.1, weight=0.1),
    "blockwise": Tolerance(
        1e-5, update_rel=0.1, update_abs=5e-3, share=0.03, ratio=1.0, weight=0.5
    ),
}


def tolerance_for(recipe: str) -> Tolerance:
    """The tolerance of a training recipe (``granularity.training``): ``bf16``, ``blockwise``
    (per-block scales over the tiny models' 4-wide blocks: the most rounding flips), every
    other FP8 recipe ``fp8``."""
    return TOLERANCES[recipe if recipe in ("bf16", "blockwise") else "fp8"]


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
    for line in (run_dir / METRICS_FILE).read_text().splitlines():
        record = json.loads(line)
        if record["step"] == step:
            return record["data"]
    raise KeyError(f"{run_dir}: no metrics of step {step}")


def _rel(a: float, b: float) -> float:
    scale = max(abs(a), abs(b))
    return abs(a - b) / scale if scale else 0.0


def verl_step_weights(run_dir: Path, step: int) -> dict[str, Any]:
    """The actor's weights after ``step`` from verl's FSDP checkpoint, HF names
    (``verl/checkpoints/global_step_<n>/actor/model_world_size_<w>_rank_<r>.pt``): one
    rank's full tensors, or ``w`` ranks' ``Shard(0)`` pieces put back together in rank order
    (FSDP2 shards every parameter along its first dimension), without a process group."""
    import torch

    actor = run_dir / "verl" / "checkpoints" / f"global_step_{step}" / "actor"
    shards = sorted(actor.glob("model_world_size_*_rank_*.pt"))
    if not shards:
        raise FileNotFoundError(f"{actor}: no model shard")
    world = int(shards[0].name.split("_")[3])
    by_rank = {int(s.stem.rsplit("_", 1)[1]): s for s in shards}
    if sorted(by_rank) != list(range(world)):
        raise FileNotFoundError(f"{actor}: expected the shards of {world} ranks, found {shards}")
    states = [torch.load(by_rank[r], map_location="cpu", weights_only=False) for r in range(world)]
    out = {}
    for name in states[0]:
        parts = [s[name] for s in states]
        if world == 1:
            value = parts[0].full_tensor() if hasattr(parts[0], "full_tensor") else parts[0]
        else:
            placements = {str(getattr(v, "placements", None)) for v in parts}
            if placements != {"(Shard(dim=0),)"}:
                raise ValueError(f"{actor}: {name} is not sharded along dim 0: {placements}")
            value = torch.cat([v.to_local() for v in parts], dim=0)
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
    seen = f"tiny {sorted(ts)}, verl {sorted(vs)}"
    checks.append(Check("dumped rows", "exact", sorted(ts) == sorted(vs), seen))
    rows = sorted(set(ts) & set(vs))
    for key in ("prompt_ids", "response_ids", "score", "finished"):
        same_value = _f32 if key == "score" else (lambda x: x)
        bad = [r for r in rows if same_value(ts[r].get(key)) != same_value(vs[r].get(key))]
        seen = f"{len(rows) - len(bad)}/{len(rows)} rows equal; differ: {bad[:8]}"
        checks.append(Check(f"samples: {key}", "exact", not bad and bool(rows), seen))
    same = [r for r in rows if ts[r]["response_ids"] == vs[r]["response_ids"]]
    pairs = [(a, b) for r in same for a, b in zip(ts[r]["tokens"], vs[r]["tokens"], strict=True)]
    limits = {"rollout_log_prob": 0.0, "old_log_prob": tol.forward, "ratio": tol.ratio}
    for key, limit in limits.items():
        diffs = [
            abs(math.log(a[key]) - math.log(b[key])) if key == "ratio" else abs(a[key] - b[key])
            for a, b in pairs
        ]
        worst = max(diffs, default=0.0)
        space = " (log space)" if key == "ratio" else ""
        seen = f"max |diff| {worst:.3g}{space}, limit {limit:g}, over {len(pairs)} tokens"
        kind = "exact" if limit == 0.0 else "close"
        checks.append(Check(f"per-token {key}", kind, bool(pairs) and worst <= limit, seen))
    flips = sum(
        (a["clipped_low"], a["clipped_high"]) != (b["clipped_low"], b["clipped_high"])
        for a, b in pairs
    )
    share = flips / len(pairs) if pairs else 1.0
    seen = (
        f"{flips} of {len(pairs)} tokens clipped on one side only ({share:.3g}, <= {tol.share:g})"
    )
    checks.append(Check("per-token clip flags", "close", share <= tol.share, seen))
    for key in ("clip_low", "clip_high"):
        ok = _rel(float(tiny[key]), float(verl[key])) <= tol.bound
        checks.append(Check(f"dump {key}", "close", ok, f"tiny {tiny[key]}, verl {verl[key]}"))
    for key in ("batch_size", "mini_batches"):
        ok = tiny[key] == verl[key]
        checks.append(Check(f"dump {key}", "exact", ok, f"tiny {tiny[key]}, verl {verl[key]}"))
    return checks


def _metric_checks(
    tm: dict[str, Any], vm: dict[str, Any], tol: Tolerance, across_ranks: bool = False
) -> list[Check]:
    """The step's metrics compared; ``across_ranks`` (:func:`compare_ranks`): without
    :data:`LAYOUT_AGGREGATES`, and :data:`SUM_ORDER_METRICS` within 1e-6 (relative)."""
    checks = []

    def pair(name: str) -> tuple[float, float] | None:
        if name not in tm or name not in vm:
            seen = f"missing: tiny {name in tm}, verl {name in vm}"
            checks.append(Check(name, "close", False, seen))
            return None
        return float(tm[name]), float(vm[name])

    for name in EXACT_METRICS + (CALIBRATION_EXACT if "fp8rl/calib/n_tokens" in tm else ()):
        if (values := pair(name)) is not None:
            seen = f"tiny {values[0]}, verl {values[1]}"
            if across_ranks and name in SUM_ORDER_METRICS:
                rel = _rel(*values)
                checks.append(Check(name, "close", rel <= 1e-6, f"{seen}, rel {rel:.2g}"))
            else:
                checks.append(Check(name, "exact", values[0] == values[1], seen))
    skipped = LAYOUT_AGGREGATES if across_ranks else ()
    calibrated = CALIBRATION_BOUNDS if tm.get("fp8rl/calib/is_calibration_step") else ()
    for name in UPDATE_METRICS + calibrated:
        if name not in skipped and (values := pair(name)) is not None:
            rel, diff = _rel(*values), abs(values[0] - values[1])
            ok = rel <= tol.update_rel or diff <= tol.update_abs
            seen = (
                f"tiny {values[0]:.9g}, verl {values[1]:.9g}, rel {rel:.2g} (<= "
                f"{tol.update_rel:g}) or abs {diff:.2g} (<= {tol.update_abs:g})"
            )
            checks.append(Check(name, "close", ok, seen))
    for name in SHARE_METRICS:
        if name not in skipped and (values := pair(name)) is not None:
            diff = abs(values[0] - values[1])
            seen = (
                f"tiny {values[0]:.6g}, verl {values[1]:.6g}, |diff| {diff:.3g} (<= {tol.share:g})"
            )
            checks.append(Check(name, "close", diff <= tol.share, seen))
    for name in BOUND_METRICS:
        if (values := pair(name)) is not None:
            rel = _rel(*values)
            seen = f"tiny {values[0]:.9g}, verl {values[1]:.9g}"
            checks.append(Check(name, "close", rel <= tol.bound, seen))
    return checks


def _run_tolerance(run_dir: Path) -> Tolerance:
    """The tolerance of the run's training recipe (:func:`tolerance_for`)."""
    import yaml

    config = yaml.safe_load((run_dir / CONFIG_FILE).read_text())
    return tolerance_for(config["granularity"]["training"])


def compare_runs(
    tiny_dir: str | Path,
    verl_dir: str | Path,
    step: int = 1,
    tolerance: Tolerance | None = None,
    weights: bool = True,
    across_ranks: bool = False,
) -> list[Check]:
    """Every check of the module docstring for ``step`` of the two runs (``tolerance``: the
    tiny run's training recipe's, :func:`tolerance_for`, by default; ``across_ranks``: two
    verl runs of different rank counts, :func:`compare_ranks`)."""
    tiny_dir, verl_dir = Path(tiny_dir), Path(verl_dir)
    tol = tolerance or _run_tolerance(tiny_dir)
    checks = _sample_checks(_dump(tiny_dir, step), _dump(verl_dir, step), tol)
    checks += _metric_checks(_metrics(tiny_dir, step), _metrics(verl_dir, step), tol, across_ranks)
    if weights:
        checks.append(_weight_check(tiny_dir, verl_dir, step, tol))
    return checks


def compare_ranks(
    one_dir: str | Path,
    many_dir: str | Path,
    step: int = 1,
    tolerance: Tolerance | None = None,
) -> list[Check]:
    """Two verl runs of one config, one data-parallel rank against several: the checks of
    :func:`compare_runs` (samples exact, per-token ratios and clip flags, loss, gradient
    norm and bounds within the recipe's tolerance), the weights of both from verl's
    checkpoints (the several ranks' shards put together).

    Not the step's clip shares and KL (:data:`LAYOUT_AGGREGATES`): verl logs them as means
    over micro-batches, then over ranks, so their values depend on how the tokens are cut
    into micro-batches (1/W of each mini-batch per rank), not only on the tokens; the
    token dump's per-token clip flags, which they summarise, are compared instead. The
    score mean is the same values summed in another order: equal within 1e-6, not
    bitwise."""
    one_dir, many_dir = Path(one_dir), Path(many_dir)
    tolerance = tolerance or _run_tolerance(one_dir)
    checks = compare_runs(one_dir, many_dir, step, tolerance, weights=False, across_ranks=True)
    one, many = verl_step_weights(one_dir, step), verl_step_weights(many_dir, step)
    base = verl_step_weights(one_dir, step - 1) if step > 1 else _base_weights(one_dir)
    checks.append(_weights_apart(one, many, base, tolerance))
    return checks


def _weights_apart(a: dict[str, Any], b: dict[str, Any], base: dict[str, Any],
                   tol: Tolerance) -> Check:  # fmt: skip
    """``||a - b|| / ||a - base||`` over every parameter (the step's own change as scale)."""
    if sorted(a) != sorted(b):
        missing = sorted(set(a) ^ set(b))[:5]
        return Check("updated weights", "close", False, f"different tensors: {missing}")
    num = sum(float((a[k] - b[k]).pow(2).sum()) for k in a) ** 0.5
    den = sum(float((a[k] - base[k]).pow(2).sum()) for k in a) ** 0.5
    rel = num / den if den else num
    seen = f"||diff|| / ||step change|| {rel:.3g} (limit {tol.weight:g})"
    return Check("updated weights", "close", rel <= tol.weight, seen)


def _weight_check(tiny_dir: Path, verl_dir: Path, step: int, tol: Tolerance) -> Check:
    """The updated weights: ``||w_tiny - w_verl|| / ||w_tiny - w_before||`` over every
    parameter (the step's own change as the scale)."""
    tiny = _tiny_step_weights(tiny_dir, step)
    base = _tiny_step_weights(tiny_dir, step - 1) if step > 1 else _base_weights(verl_dir)
    return _weights_apart(tiny, verl_step_weights(verl_dir, step), base, tol)


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


def layout_noise_floor(
    model_dir: str | Path,
    dump: dict[str, Any],
    recipe: str,
    lr: float,
    weight_decay: float = 0.0,
    **recipe_kwargs: Any,
) -> dict[str, float]:
    """How far two mathematically equal computations of one update drift apart in this
    precision: the step's dumped rows (prompt and response ids, advantages) through the model
    at ``model_dir`` with ``recipe`` applied as both backends apply it, once row by row and
    once as one right-padded batch (different GEMM shapes: FP32 sums reassociated, so BF16 and
    FP8 roundings flip), a token-mean policy-gradient loss, one AdamW step each. Returns the
    gradients' and the updates' relative distance (L2 over all parameters) and the largest
    log-prob difference before the update: the floor under any comparison of two trainers.
    ``recipe_kwargs``: ``get_recipe``'s (``block_size``, ``include_lm_head``)."""
    import torch
    from transformers import AutoModelForCausalLM

    from fp8rl.numerics import apply_fp8_training, get_recipe

    rows = [(s["prompt_ids"], s["response_ids"], [t["advantage"] for t in s["tokens"]])
            for s in dump["samples"]]  # fmt: skip

    def update(batched: bool) -> tuple[dict[str, Any], dict[str, Any], list[Any]]:
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        apply_fp8_training(model, get_recipe(recipe, **recipe_kwargs))
        model.train()
        n_tokens = sum(len(r) for _, r, _ in rows)
        log_probs = []
        groups = [rows] if batched else [[r] for r in rows]
        for group in groups:
            width = max(len(p) + len(r) for p, r, _ in group)
            ids = torch.zeros(len(group), width, dtype=torch.long)
            mask = torch.zeros(len(group), width, dtype=torch.long)
            for i, (p, r, _) in enumerate(group):
                ids[i, : len(p) + len(r)] = torch.tensor(p + r)
                mask[i, : len(p) + len(r)] = 1
            logits = model(input_ids=ids, attention_mask=mask).logits.float()
            lp = torch.log_softmax(logits[:, :-1], -1).gather(2, ids[:, 1:, None]).squeeze(2)
            loss = 0.0
            for i, (p, r, a) in enumerate(group):
                tok = lp[i, len(p) - 1 : len(p) - 1 + len(r)]
                log_probs.append(tok.detach())
                loss = loss - (torch.tensor(a) * tok).sum() / n_tokens
            loss.backward()
        grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.999),
                                weight_decay=weight_decay)  # fmt: skip
        opt.step()
        delta = {n: p.detach() - before[n] for n, p in model.named_parameters()}
        return grads, delta, log_probs

    def rel(a: dict[str, Any], b: dict[str, Any]) -> float:
        num = sum(float((a[k] - b[k]).pow(2).sum()) for k in a) ** 0.5
        den = sum(float(a[k].pow(2).sum()) for k in a) ** 0.5
        return num / den if den else num

    g1, d1, lp1 = update(batched=False)
    g2, d2, lp2 = update(batched=True)
    worst = max(float((x - y).abs().max()) for x, y in zip(lp1, lp2, strict=True))
    return {"grad_rel": rel(g1, g2), "update_rel": rel(d1, d2), "log_prob_max": worst}


#: An arm's record beside its compact results (``<results>/<arm>/agreement.json``).
RECORD_FILE = "agreement.json"


def _wall_seconds(run_dir: Path) -> float | None:
    """A run's own wall time, as its status records it (:func:`attempt_seconds`)."""
    return attempt_seconds(json.loads((Path(run_dir) / STATUS_FILE).read_text()))


def read_records(root: Path) -> list[dict[str, Any]]:
    """The records of the arms measured so far under ``root`` (``<root>/<arm>/``
    :data:`RECORD_FILE`), in :data:`ARMS` order."""
    paths = [Path(root) / arm / RECORD_FILE for arm in ARMS]
    return [json.loads(p.read_text()) for p in paths if p.is_file()]


def agreement_record(arm: str, tiny: Path, control: Path, verl: Path) -> dict[str, Any]:
    """One arm of :data:`ARMS` measured from its three full runs (the tiny run, the negative
    control and the verl run: run directories with their checkpoints and the verl model):
    the checks, the control's failed checks, the layout noise floor of its recipe, the runs'
    ids and wall times, and the verl run's day and machine. JSON-ready."""
    import yaml

    checks = compare_runs(tiny, verl)
    config = yaml.safe_load((Path(tiny) / CONFIG_FILE).read_text())
    g = config["granularity"]
    kwargs = {"block_size": g["block_size"]} if g.get("block_size") else {}
    dump = json.loads((Path(verl) / "samples" / "step_00000001.json").read_text())
    floor = layout_noise_floor(Path(verl) / "verl" / "model", dump, g["training"],
                               config["train"]["lr"], **kwargs)  # fmt: skip
    prov = json.loads((Path(verl) / PROVENANCE_FILE).read_text())
    hardware = prov.get("hardware") or {}
    return {
        "arm": arm,
        "overrides": list(ARMS[arm]),
        "recipe": g["training"],
        "checks": [asdict(c) for c in checks],
        "control_failed": [c.name for c in failures(compare_runs(control, verl))],
        "floor": floor,
        "runs": {"tiny": Path(tiny).name, "control": Path(control).name, "verl": Path(verl).name},
        "wall_s": {"tiny": _wall_seconds(tiny), "verl": _wall_seconds(verl)},
        "date": str(prov.get("started_at", "?"))[:10],
        "cpu": hardware.get("cpu_model", "?"),
        "cores": hardware.get("cpu_count", "?"),
    }


def _joined(values: Iterable[Any]) -> str:
    return ", ".join(dict.fromkeys(str(v) for v in values))


def agreement_markdown(records: Iterable[dict[str, Any]]) -> str:
    """The agreement report of :func:`agreement_record`'s records (one section per arm)."""
    records = list(records)
    if not records:
        raise ValueError("no agreement records")
    lines = [
        "# One method at two scales: the tiny and the verl backend, step 1",
        "",
        "Written by `python scripts/verl_agreement.py` and "
        "`python -m fp8rl.study report verl_agreement` (do not edit by hand) from runs of "
        f"{_joined(r['date'] for r in records)} on {_joined(r['cpu'] for r in records)} "
        f"({_joined(r['cores'] for r in records)} cores). Each arm: "
        f"`python sweep.py {' '.join(COMMON)} <arm>` with `backend=tiny` and with "
        f"`{' '.join(VERL)}`; the control adds `{' '.join(CONTROL)}` on the tiny side. "
        "Checks and tolerances: `fp8rl.verl_ext.agreement` (docs/verl_backend.md, "
        "*One method at two scales*).",
        "",
    ]
    for r in records:
        checks = [Check(**c) for c in r["checks"]]
        verdict = "agree" if not failures(checks) else "DISAGREE"
        floor, wall, runs = r["floor"], r["wall_s"], r["runs"]
        control = ", ".join(f"`{n}`" for n in r["control_failed"])
        lines += [
            f"## `{' '.join(r['overrides'])}`: {verdict}",
            "",
            f"tiny run `{runs['tiny']}` {wall['tiny']:.0f} s, verl run `{runs['verl']}` "
            f"{wall['verl']:.0f} s (wall, as the runs record it); control `{runs['control']}`.",
            "",
            "| check | kind | ok | seen |",
            "|---|---|---|---|",
            *(
                f"| {c.name} | {c.kind} | {'yes' if c.ok else '**no**'} | "
                f"{c.detail.replace('|', chr(92) + '|')} |"
                for c in checks
            ),
            "",
            f"Negative control (`{' '.join(CONTROL)}` on the tiny side) fails: "
            + (control or "**nothing (the test fails)**"),
            "",
            f"Layout noise floor of `{r['recipe']}` (`layout_noise_floor`: the dumped rows "
            "through one trainer row by row and as one padded batch, one AdamW step): "
            f"gradients {floor['grad_rel']:.3g} apart (relative L2), updates "
            f"{floor['update_rel']:.3g}, log-probs before the update "
            f"{floor['log_prob_max']:.2g} (max abs).",
            "",
        ]
    return "\n".join(lines)
