"""fp8rl's FP8 actor and Calibrated Clipping inside verl 0.9.1 - verl's own hybrid worker
(fp8rl's subclass, role ``actor``), verl's ``ppo_loss`` and fp8rl's FP8 FSDP2 engine - on this
CPU in gloo groups of one and two processes (tests/helpers/verl_cpu_actor.py), against the
tiny backend's code computing the same step in one process on the same weights, tokens and
advantages.

Tolerances, and why. Both sides compute the same operations in FP32, not in the same order:
verl packs a micro-batch's sequences into one row (attention under a block-diagonal mask) and
computes the log-softmax and its gradient with its own code, the tiny backend pads. That moves
values by ~1e-7 relative. The numerics then round to BF16 (emulated, one ulp = 2^-8 relative)
and FP8 (E4M3, 2^-3; gradients E5M2, 2^-2), and a 1e-7 difference flips the rounding of any
element that close to a rounding boundary: rare, but the flipped element moves by a whole ulp,
and under a tensorwise scale a flipped amax re-scales its whole tensor. So most tokens agree
to 1e-6 (:data:`ATOL`), the tokens after a flip in their sequence by ~1e-2 (:data:`FLIP`);
mini-batch losses and gradient norms agree to 1e-3 relative, the calibrated bounds to 5e-3.
Tensorwise scales each gradient with one E5M2 scale, so a flipped gradient amax re-scales the
whole gradient: after its first update every weight differs slightly, and its later log-probs
agree to 5e-3, its gradient norms to 2e-2.
Without rounding in between, they agree to ~1e-6 everywhere: the BF16 arm here computes in
FP32, and its numbers match to 1e-6. What must agree exactly does: the calibrator in verl's
actor (rank 0 over the gathered tokens of every rank) against ``fp8rl.rl.Calibrator`` in one
process on the tokens the actor recorded, bounds and every ``fp8rl/calib/*`` metric.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from fp8rl.rl import Calibrator

from gloo_ranks import run_gloo
from verl_cpu_actor import (
    ActorCase,
    calibrator_config,
    make_batch,
    reference,
    run_rank,
    tiny_model_dir,
)

ATOL = 1e-5  # FP32 reassociation (see the module docstring)
FLIP = 2e-2  # the largest deviation one rounding flip has caused here (observed: 7e-3)
SHARE = 0.5  # of the tokens agree within ATOL: a flip moves every later token of its sequence
#            (one flip in a 14-token sequence of a 12-row batch: 5 of 96 tokens); a systematic
#            error (a misaligned token, stale weights, the wrong precision) moves nearly all
GAP_METRICS = (
    "fp8rl/calib/logratio_gap_mean",
    "fp8rl/calib/logratio_gap_std",
    "fp8rl/calib/logratio_gap_absmean",
    "fp8rl/calib/logratio_gap_mean_negadv",
    "fp8rl/calib/logratio_gap_mean_posadv",
)


def _run(case: ActorCase, model_dir: Path, tmp: Path) -> list[dict[str, Any]]:
    return run_gloo(run_rank, case.world_size, tmp, case, str(model_dir), str(tmp), timeout=900)


def _rows(ranks: list[dict[str, Any]], step: int, key: str) -> torch.Tensor:
    """A tensor of every rank's rows at ``step`` (0-based), in rank order (= the batch's)."""
    return torch.cat([r["steps"][step]["record"][key] for r in ranks])


def assert_close_tokens(
    ours: torch.Tensor, theirs: torch.Tensor, what: str, atol: float = ATOL
) -> None:
    diff = (ours - theirs).abs()
    share = float((diff <= atol).float().mean())
    assert share >= SHARE and float(diff.max()) <= FLIP, (
        f"{what}: {share:.1%} of tokens within {atol}, max |diff| {float(diff.max()):.2e}"
    )


def assert_step_matches_the_tiny_backend(
    ranks: list[dict[str, Any]],
    ref: dict[str, Any],
    case: ActorCase,
    rel: float = 1e-3,
    after_update_atol: float = ATOL,
) -> None:
    """Step 1 of the actor in verl against the tiny backend's code (module docstring):
    ``rel`` for mini-batch losses and gradient norms, ``after_update_atol`` for the log-probs
    computed after an optimizer step."""
    old = torch.cat([r["steps"][0]["old_log_probs"] for r in ranks])
    if not case.bypass:  # verl's compute_log_prob through fp8rl's engine: the FP8 pi_old
        assert_close_tokens(old, ref["old_fp8"], "old log-probs (FP8)")
    mask = _rows(ranks, 0, "mask")
    assert torch.equal(mask, ref["four"]["mask"])  # the same visits feed calibration
    assert int(mask.sum()) > 0
    assert_close_tokens(
        _rows(ranks, 0, "old_log_prob_bf16")[mask],
        ref["four"]["old_log_prob_bf16"][mask],
        "old BF16",
    )
    for key in ("log_prob_bf16", "log_prob_fp8"):
        ours, theirs = _rows(ranks, 0, key)[mask], ref["four"][key][mask]
        assert_close_tokens(ours, theirs, key, after_update_atol)
    metrics = ranks[0]["steps"][0]["metrics"]
    assert metrics["grad_norm"] == pytest.approx(ref["grad_norms"], rel=rel)
    assert metrics["actor/pg_loss"] == pytest.approx(ref["losses"], rel=rel, abs=1e-6)
    for name in GAP_METRICS:  # the FP8-vs-BF16 log-ratio gap (on calibration steps)
        if name in ref["metrics"]:
            assert metrics[name][0] == pytest.approx(ref["metrics"][name], abs=2e-3), name
    if ref["metrics"].get("fp8rl/calib/new_clip_low") is not None:
        for side in ("low", "high"):
            ours = metrics[f"fp8rl/calib/new_clip_{side}"][0]
            assert ours == pytest.approx(ref["metrics"][f"fp8rl/calib/new_clip_{side}"], abs=5e-3)


def assert_the_actor_calibrates_as_one_process(
    ranks: list[dict[str, Any]], case: ActorCase
) -> None:
    """Exactness: fp8rl.rl.Calibrator in one process, fed the tokens verl's actor recorded on
    every rank, step by step, gives the bounds and metrics the actor computed and logged."""
    cal = Calibrator(calibrator_config(case))
    for i in range(case.steps):
        step = i + 1
        four = {k: _rows(ranks, i, k) for k in ranks[0]["steps"][i]["record"]}
        if cal.is_calibration_step(step):
            expected = cal.update_from_log_probs(step, **four)
            for r in ranks:
                got = r["steps"][i]["metrics"]
                for name, value in expected.items():
                    assert got[name] == [pytest.approx(value, rel=0, abs=0, nan_ok=True)], name
        elif cal.is_pooling_step(step):
            cal.add_from_log_probs(step, **four)
        for r in ranks:  # every rank holds the bounds rank 0 computed
            assert tuple(r["steps"][i]["next_bounds"]) == cal.bounds_for_step(step + 1)


# --------------------------------------------------------------------------------------
# One rank, rowwise (TorchAO), two steps: in make test (~20 s)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model_dir(tmp_path_factory.mktemp("tiny-qwen3"))


@pytest.fixture(scope="module")
def rowwise(model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    case = ActorCase(recipe="rowwise", steps=2)
    ranks = _run(case, model_dir, tmp_path_factory.mktemp("rowwise"))
    return case, ranks, reference(case, model_dir)


def test_verl_builds_fp8rl_s_worker_on_fp8rl_s_fp8_engine(rowwise) -> None:
    _, ranks, _ = rowwise
    r = ranks[0]
    assert (r["worker"], r["engine"]) == ("Fp8rlTrainingWorker", "FP8FSDPEngineWithLMHead")
    assert r["linears"] == ["TorchAOFloat8Linear"]  # every projection converted, rowwise


def test_the_weights_verl_syncs_to_the_rollout_are_the_master_weights_under_their_names(
    rowwise,
) -> None:
    _, ranks, ref = rowwise
    export = ranks[0]["export"]  # the engine's get_per_tensor_param: what the rollout gets
    assert export.keys() == ref.export.keys()
    for name, value in ref.export.items():
        assert export[name].dtype == torch.float32 and torch.equal(export[name], value), name


def test_the_fp8_actor_step_matches_the_tiny_backend_on_the_same_batch(rowwise) -> None:
    case, ranks, ref = rowwise
    assert_step_matches_the_tiny_backend(ranks, ref.steps[0], case)


def test_the_actor_s_calibrator_is_the_one_process_calibrator(rowwise) -> None:
    case, ranks, _ = rowwise
    assert_the_actor_calibrates_as_one_process(ranks, case)


def test_the_new_bounds_are_set_before_the_next_update_and_reach_the_loss(rowwise) -> None:
    case, ranks, ref = rowwise
    first, second = ranks[0]["steps"]
    low, high = first["next_bounds"]
    assert (low, high) != (1 - case.eps, 1 + case.eps)  # calibration moved them
    assert first["metrics"]["fp8rl/clip_low"] == pytest.approx([1 - case.eps] * case.mini_batches)
    assert second["metrics"]["fp8rl/clip_low"] == pytest.approx([low] * case.mini_batches)
    assert second["metrics"]["fp8rl/clip_high"] == pytest.approx([high] * case.mini_batches)
    assert ref.steps[0]["next_bounds"] == pytest.approx((low, high), abs=5e-3)


def test_shadow_and_calibration_metrics_reach_verl_s_actor_metrics(rowwise) -> None:
    _, ranks, ref = rowwise
    metrics = ranks[0]["steps"][0]["metrics"]
    assert metrics["fp8rl/calib/is_calibration_step"] == [1.0]
    assert metrics["fp8rl/shadow/is_shadow_step"] == [1.0]
    ours = ("fp8rl/calib/", "fp8rl/shadow/")
    expected = {k for k in ref.steps[0]["metrics"] if k.startswith(ours)}
    assert expected <= metrics.keys()
    for name in ("fp8rl/shadow/n_negadv", "fp8rl/shadow/n_posadv"):  # the same tokens
        assert metrics[name] == [ref.steps[0]["metrics"][name]]


def test_the_calibrator_state_round_trips_through_verl_s_checkpoint(rowwise) -> None:
    _, ranks, _ = rowwise
    r = ranks[0]
    assert r["state_file"]
    assert r["state_fresh"] != r["state_saved"]  # a fresh calibrator knows nothing
    assert r["state_loaded"] == r["state_saved"]


def test_the_batch_has_both_advantage_signs_and_no_padding() -> None:
    """What the comparisons above rest on: calibration sees both sides, and verl's packed
    micro-batch holds the same tokens as the tiny backend's padded one."""
    batch = make_batch(ActorCase(), 1)
    assert (batch["advantages"] > 0).any() and (batch["advantages"] < 0).any()
    assert batch["responses"].shape == (16, 8) and batch["prompts"].shape == (16, 6)


# --------------------------------------------------------------------------------------
# The other recipes, two ranks, bypass mode with pooling: slow (each 15-40 s)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("recipe", "rel", "after_update_atol", "linear"),
    [
        # tensorwise: one E5M2 scale per gradient tensor, so a flipped gradient amax re-scales
        # the whole gradient and after the first update every weight differs slightly
        ("tensorwise", 2e-2, 5e-3, "TorchAOFloat8Linear"),
        ("blockwise", 1e-3, ATOL, "EmulatedFp8Linear"),
        ("bf16", 1e-5, ATOL, "Linear"),  # verl's own engine, FP32: no rounding to flip
    ],
)
def test_every_training_recipe_matches_the_tiny_backend(
    recipe: str, rel: float, after_update_atol: float, linear: str, model_dir: Path, tmp_path: Path
) -> None:
    case = ActorCase(recipe=recipe)
    ranks = _run(case, model_dir, tmp_path)
    assert ranks[0]["linears"] == [linear]
    ref = reference(case, model_dir)
    export = ranks[0]["export"]  # the weight sync's source: the master weights, same names
    assert export.keys() == ref.export.keys()
    assert all(torch.equal(export[k], v) for k, v in ref.export.items())
    assert_step_matches_the_tiny_backend(ranks, ref.steps[0], case, rel, after_update_atol)
    assert_the_actor_calibrates_as_one_process(ranks, case)


@pytest.mark.slow
def test_two_data_parallel_ranks_match_one_process(model_dir: Path, tmp_path: Path) -> None:
    """FSDP2 shards the FP8 model over two gloo ranks; the calibrator runs once over both
    ranks' tokens and both ranks hold its bounds; the numbers equal one process's."""
    case = ActorCase(recipe="rowwise", world_size=2, steps=2)
    ranks = _run(case, model_dir, tmp_path)
    ref = reference(case, model_dir)
    assert_step_matches_the_tiny_backend(ranks, ref.steps[0], case)
    assert_the_actor_calibrates_as_one_process(ranks, case)
    assert ranks[0]["steps"][0]["next_bounds"] == ranks[1]["steps"][0]["next_bounds"]
    # fp8rl/shadow/* is over the global batch: both ranks log the same numbers, and the
    # token counts are the one process's
    shadow = [{k: v for k, v in r["steps"][0]["metrics"].items() if "/shadow/" in k} for r in ranks]
    assert shadow[0] == shadow[1]
    for name in ("fp8rl/shadow/n_negadv", "fp8rl/shadow/n_posadv"):
        assert shadow[0][name] == [ref.steps[0]["metrics"][name]]
    assert all(r["state_loaded"]["low"] == r["state_saved"]["low"] for r in ranks)


@pytest.mark.slow
def test_bypass_mode_pools_every_visit_over_the_period(model_dir: Path, tmp_path: Path) -> None:
    """Old log-probs from the rollout (bypass): every visit carries the mismatch, the first
    mini-batch included; two epochs; pool=period with a tail gate over three steps."""
    calib = {"period": 2, "smoothing": 0.5, "pool": "period", "min_tail_tokens": 5}
    case = ActorCase(recipe="blockwise", bypass=True, epochs=2, steps=3, calib=calib)
    ranks = _run(case, model_dir, tmp_path)
    assert bool(ranks[0]["steps"][0]["record"]["mask"].all())  # mini-batch 0 too
    assert ranks[0]["steps"][0]["metrics"]["fp8rl/shadow/is_shadow_step"] == [1.0]  # pooling
    assert "fp8rl/calib/new_clip_low" not in ranks[0]["steps"][0]["metrics"]  # not period yet
    assert ranks[0]["steps"][1]["metrics"]["fp8rl/calib/pool_steps"] == [2.0]
    assert_step_matches_the_tiny_backend(ranks, reference(case, model_dir).steps[0], case)
    assert_the_actor_calibrates_as_one_process(ranks, case)


@pytest.mark.slow
def test_dynamic_batch_sizes_keep_every_row_s_tokens_in_place(model_dir: Path, tmp_path: Path):
    """verl's use_dynamic_bsz (the translation's setting): micro-batches by a token budget (3
    of a mini-batch's 4 sequences, so micro-batches of 3 and 1), rows grouped by verl and
    restored after; the row index must travel with them. FP8 gradients depend on how rows are
    grouped (a weight gradient's scales run over a micro-batch's tokens) and Adam's first
    step turns any gradient difference into a full learning-rate step, so this run keeps the
    weights fixed (lr 0): every recorded log-prob must then be its row's pre-update one,
    which the tiny backend computes row by row (rowwise forwards scale per token)."""
    case = ActorCase(recipe="rowwise", dynamic_bsz=3, lr=0.0)
    ranks = _run(case, model_dir, tmp_path)
    ref = reference(case, model_dir).steps[0]
    mask = _rows(ranks, 0, "mask")
    assert torch.equal(mask, ref["four"]["mask"]) and int(mask.sum()) == 96
    for key, same_as in (("log_prob_fp8", "old_fp8"), ("log_prob_bf16", "old_log_prob_bf16"),
                         ("old_log_prob_bf16", "old_log_prob_bf16")):  # fmt: skip
        theirs = ref["old_fp8"] if same_as == "old_fp8" else ref["four"][same_as]
        assert_close_tokens(_rows(ranks, 0, key)[mask], theirs[mask], key)
    assert len(ranks[0]["steps"][0]["metrics"]["grad_norm"]) == case.mini_batches
    assert_the_actor_calibrates_as_one_process(ranks, case)
