"""``export_hf`` on the verl backend (fp8rl.verl_ext.export): verl's own merger
(``verl.model_merger``) turns verl's actor checkpoint (one rank; two FSDP2 ranks in a slow
test) into an HF checkpoint that
``AutoModelForCausalLM``/``AutoTokenizer`` load, with the checkpoint's weights rounded to
BF16 (the merger's choice) and EOS where ``generate`` reads it; a run exports its evaluated
steps that are on disk (step 0: the base as it is), names the others, and keeps only the
newest ``train.keep_checkpoints`` after. Slow: the real CLI, a verl run on this CPU with
``export_hf=true`` then ``sweep.py --eval`` (lm-eval) on its exports."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from verl_checkpoints import base_model_dir, write_rank, write_single

from fp8rl.config import RunConfig
from fp8rl.runs import hf_export_dir, list_hf_exports
from fp8rl.verl_ext.export import (
    EXPORT_INFO_FILE,
    actor_checkpoints,
    export_run,
    merge_actor_checkpoint,
    prune_checkpoints,
)
from fp8rl.verl_ext.translate import RunFiles

from gloo_ranks import run_gloo


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory) -> tuple[Path, Path, dict[str, torch.Tensor]]:
    """The base model dir, a verl checkpoints dir holding a step-2 actor checkpoint of one
    rank (written in this process), and the full FP32 weights it holds."""
    root = tmp_path_factory.mktemp("verl_ckpt")
    base = base_model_dir(root / "base")
    weights = write_single(base, root / "checkpoints", 2, seed=1)
    return base, root / "checkpoints", weights


def _check_merge(actor: Path, out: Path, weights: dict[str, torch.Tensor]) -> None:
    """``actor`` merged into ``out``: the weights rounded to BF16, loadable with the
    tokenizer by the Auto classes, EOS where generate reads it, the info beside."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    merge_actor_checkpoint(actor, out, {"step": 2})
    merged = load_file(out / "model.safetensors")
    assert set(merged) == set(weights)
    for name, w in weights.items():  # the FP32 master weights, rounded to BF16 by the merger
        assert merged[name].dtype == torch.bfloat16
        assert torch.equal(merged[name], w.bfloat16()), name
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert torch.equal(model.lm_head.weight, weights["lm_head.weight"].bfloat16().float())
    tok = AutoTokenizer.from_pretrained(out)
    assert GenerationConfig.from_pretrained(out).eos_token_id == tok.eos_token_id is not None
    assert json.loads((out / EXPORT_INFO_FILE).read_text()) == {"step": 2}
    assert not list(out.parent.glob(".tmp-*"))  # appeared atomically, nothing left beside


def test_verl_s_merger_writes_a_loadable_bf16_checkpoint_of_the_actor_s_weights(
    one_rank, tmp_path
) -> None:
    _, checkpoints, weights = one_rank
    _check_merge(checkpoints / "global_step_2" / "actor", tmp_path / "hf" / "step_2", weights)


def test_a_generation_config_without_eos_gets_the_tokenizer_s(one_rank, tmp_path) -> None:
    from transformers import AutoTokenizer, GenerationConfig

    _, checkpoints, _ = one_rank
    actor = tmp_path / "actor"
    shutil.copytree(checkpoints / "global_step_2" / "actor", actor)
    (actor / "huggingface" / "generation_config.json").unlink()  # a model that ships none
    out = merge_actor_checkpoint(actor, tmp_path / "out")
    eos = AutoTokenizer.from_pretrained(out).eos_token_id
    assert eos is not None and GenerationConfig.from_pretrained(out).eos_token_id == eos


@pytest.mark.slow  # ~16 s on 2 busy cores: two spawned ranks importing torch and transformers
def test_verl_s_merger_joins_the_shards_of_two_fsdp2_ranks(tmp_path) -> None:
    base = base_model_dir(tmp_path / "base")
    checkpoints = tmp_path / "checkpoints"
    weights, _ = run_gloo(write_rank, 2, tmp_path, str(base), str(checkpoints), 2, 1)
    actor = checkpoints / "global_step_2" / "actor"
    shard = torch.load(actor / "model_world_size_2_rank_0.pt", weights_only=False)
    some = shard["model.embed_tokens.weight"]
    assert type(some).__name__ == "DTensor" and some.to_local().shape[0] * 2 == some.shape[0]
    _check_merge(actor, tmp_path / "hf" / "step_2", weights)


def _cfg() -> RunConfig:
    """A tiny-test verl run config: 4 steps evaluated every 2."""
    return RunConfig.from_dict(
        {"backend": {"name": "verl"}, "model": {"preset": "tiny-test"}, "steps": 4,
         "eval": {"every": 2}}
    )  # fmt: skip


def _run_with(one_rank, run_dir: Path, steps: tuple[int, ...]) -> RunFiles:
    """A verl run directory: the base in verl/model and verl's checkpoints of ``steps``
    (copies of the one-rank one), verl's tracker at the last of them."""
    base, checkpoints, _ = one_rank
    files = RunFiles(run_dir)
    shutil.copytree(base, files.model_dir)
    for step in steps:
        shutil.copytree(checkpoints / "global_step_2", files.checkpoints / f"global_step_{step}")
    (files.checkpoints / "latest_checkpointed_iteration.txt").write_text(str(max(steps)))
    return files


def test_a_run_exports_the_evaluated_steps_it_kept_and_names_the_others(one_rank, tmp_path) -> None:
    files = _run_with(one_rank, tmp_path / "run", (1, 3))
    (files.checkpoints / "latest_checkpointed_iteration.txt").write_text("2")  # 3: cut off
    assert list(actor_checkpoints(files.checkpoints)) == [1]
    shutil.copytree(files.checkpoints / "global_step_1", files.checkpoints / "global_step_2")
    result = export_run(_cfg(), files)  # evaluates 0, 2, 4
    assert result.steps == [0, 2] and list(result.missing) == [4]
    assert "export_hf=true checkpoints every evaluated step" in result.missing[4]
    assert list(list_hf_exports(files.run_dir)) == [0, 2]  # not 1 (not evaluated), not 3
    step0 = hf_export_dir(files.run_dir, 0)  # the base as it is: its FP32 weights, its info
    assert (step0 / "model.safetensors").read_bytes() == (
        files.model_dir / "model.safetensors"
    ).read_bytes()
    info = json.loads((hf_export_dir(files.run_dir, 2) / EXPORT_INFO_FILE).read_text())
    assert info["step"] == 2 and info["source"] == "verl/checkpoints/global_step_2/actor"
    assert info["weights"].startswith("bf16") and info["run_id"] == "run"
    again = export_run(_cfg(), files, missing_only=True)  # a finished run asked again
    assert again.steps == [] and list(again.missing) == [4]


def test_step_0_of_a_model_from_outside_the_run_is_named_not_exported(tmp_path) -> None:
    cfg = _cfg()
    cfg.model.preset = "qwen3-8b-base"
    result = export_run(cfg, RunFiles(tmp_path))
    assert result.steps == [] and sorted(result.missing) == [0, 2, 4]
    assert "evaluate it by its path" in result.missing[0]


def test_pruning_keeps_the_newest_checkpoints_and_the_one_verl_resumes_from(
    one_rank, tmp_path
) -> None:
    files = _run_with(one_rank, tmp_path / "run", (1, 2, 3))
    assert prune_checkpoints(files.checkpoints, keep=2) == [1]
    assert list(actor_checkpoints(files.checkpoints)) == [2, 3]
    assert prune_checkpoints(files.checkpoints, keep=1) == [2]
    assert sorted(p.name for p in files.checkpoints.iterdir()) == [
        "global_step_3",
        "latest_checkpointed_iteration.txt",
    ]


# --------------------------------------------------------------------------------------
# The real CLI: a verl run on this CPU with export_hf, then sweep.py --eval on its exports


@pytest.mark.slow
def test_sweep_eval_runs_lm_eval_on_a_verl_run_s_exports(tmp_path: Path) -> None:
    """``python sweep.py +experiment=test backend=verl cluster=local_cpu model=tiny-test
    export_hf=true eval.every=1``, then ``sweep.py --eval`` with the same overrides: steps 0,
    1 and 2 exported (step 1 only because export_hf made verl checkpoint it), each evaluated
    by lm-eval's hf model as a tiny run's export is; the merged weights are verl's
    checkpoints' rounded to BF16; a second --eval after the exports are deleted exports them
    again from what the run kept, byte for byte, and evaluates nothing twice."""
    from sweep_cli import sweep

    from fp8rl.runs import LM_EVAL_FILE, RunStore

    runs = tmp_path / "runs"
    run_args = ("+experiment=test", "backend=verl", "model=tiny-test", "cluster=local_cpu",
                "eval.every=1", f"runs_dir={runs}")  # fmt: skip
    evals = ("lm_eval.limit=1", "lm_eval.dtype=float32", "lm_eval.max_gen_toks=8", "threads=1")
    t0 = time.monotonic()
    out = sweep(tmp_path, *run_args, "export_hf=true", timeout=900)
    run_s = time.monotonic() - t0
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    (run_dir,) = (runs / "test").glob("[0-9a-f]" * 16)
    info = RunStore(runs).run_info("test", run_dir.name)
    assert info.status.value == "done" and info.last_step == 2
    command = (run_dir / "verl" / "command.sh").read_text()
    assert "trainer.save_freq=1 " in command and "trainer.max_actor_ckpt_to_keep=null" in command
    assert list(list_hf_exports(run_dir)) == [0, 1, 2]
    checkpoints = actor_checkpoints(run_dir / "verl" / "checkpoints")
    assert list(checkpoints) == [1, 2]  # train.keep_checkpoints=2: nothing to prune
    for step, actor in checkpoints.items():  # verl's FSDP weights, rounded to BF16
        fsdp = torch.load(actor / "model_world_size_1_rank_0.pt", weights_only=False)
        merged = load_file(hf_export_dir(run_dir, step) / "model.safetensors")
        assert set(merged) == set(fsdp)
        for name, w in fsdp.items():
            assert torch.equal(merged[name], w.full_tensor().bfloat16()), (step, name)
    step1 = load_file(hf_export_dir(run_dir, 1) / "model.safetensors")
    step2 = load_file(hf_export_dir(run_dir, 2) / "model.safetensors")
    assert any(not torch.equal(step1[k], step2[k]) for k in step1)  # step 2 trained on
    base = (run_dir / "verl" / "model" / "model.safetensors").read_bytes()
    assert (hf_export_dir(run_dir, 0) / "model.safetensors").read_bytes() == base

    t0 = time.monotonic()
    first = sweep(tmp_path, "--eval", *run_args, *evals, timeout=600)
    eval_s = time.monotonic() - t0
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "3 checkpoints, 0 already evaluated, 3 to go (6 problems)" in first.stderr
    rows = [json.loads(x) for x in (run_dir / LM_EVAL_FILE).read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    for r in rows:
        assert r["data"]["engine"] == "lm-eval/hf" and r["data"]["precision"] == "float32"
        assert set(r["data"]["benchmarks"]) == {"add_sub", "max_min"}  # the run's families
        assert 0.0 <= r["data"]["val-core/all/acc/mean@1"] <= 1.0
        results = run_dir / "lm_eval" / f"step_{r['step']:08d}" / r["data"]["settings_sha"]
        assert (results / "results.json").is_file()

    digests = {r["step"]: r["data"]["checkpoint_sha256"] for r in rows}
    shutil.rmtree(run_dir / "hf")
    t0 = time.monotonic()
    second = sweep(tmp_path, "--eval", *run_args, *evals, timeout=600)
    again_s = time.monotonic() - t0
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert f"exported steps [0, 1, 2] of {run_dir.name}" in second.stderr
    assert "3 checkpoints, 3 already evaluated, 0 to go" in second.stderr  # same digests
    assert len((run_dir / LM_EVAL_FILE).read_text().splitlines()) == 3 and digests
    print(f"verl run with export {run_s:.0f} s, --eval {eval_s:.0f} s, again {again_s:.0f} s")
