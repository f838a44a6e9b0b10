"""The lm-eval call, built without running it: model arguments and the command line for
both engines (the vLLM path is checked here without vLLM, which only a GPU node has),
generation settings, the generated task files, the settings' checks and fingerprint."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import lm_eval
import pytest
import yaml

from fp8rl.config import ConfigError
from fp8rl.evaluation.runner import (
    TASKS_DIR,
    generation_kwargs,
    lm_eval_command,
    model_args,
    plan_tasks,
    run_lm_eval,
    settings_fingerprint,
    write_task_dir,
)
from fp8rl.evaluation.settings import LmEvalSettings

CKPT = "/ckpt/step_00000010"


def test_hf_model_args_load_a_local_directory_on_cpu() -> None:
    s = LmEvalSettings(dtype="float32")
    assert model_args(s, CKPT) == {"pretrained": CKPT, "dtype": "float32"}
    cmd = lm_eval_command(s, CKPT, "/tasks", plan_tasks(["add_sub"], s), "/out")
    assert cmd[cmd.index("--device") + 1] == "cpu"  # not in model_args: lm-eval refuses both
    assert s.engine_label == "lm-eval/hf" and s.precision == "float32"


def test_vllm_model_args_serve_fp8_or_bf16() -> None:
    fp8 = LmEvalSettings(engine="vllm", quantization="fp8", tensor_parallel_size=2, seed=3)
    args = model_args(fp8, CKPT)
    assert args == {
        "pretrained": CKPT, "dtype": "bfloat16", "tensor_parallel_size": 2,
        "gpu_memory_utilization": 0.85, "seed": 3, "quantization": "fp8",
    }  # fmt: skip
    assert fp8.engine_label == "lm-eval/vllm" and fp8.precision == "fp8"
    assert "quantization" not in model_args(LmEvalSettings(engine="vllm"), CKPT)
    assert model_args(LmEvalSettings(engine="vllm", max_model_len=8192), CKPT)["max_model_len"]


def test_vllm_model_args_are_what_lm_evals_vllm_model_takes() -> None:
    """Read from lm-eval's source (importing it needs vLLM): every argument is a parameter of
    its VLLM model, except gpu_memory_utilization, which its **kwargs pass to vllm.LLM."""
    source = Path(lm_eval.__file__).parent / "models" / "vllm_causallms.py"
    tree = ast.parse(source.read_text())
    init = next(
        node.body[i]
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef) and node.name == "VLLM"
        for i in range(len(node.body))
        if getattr(node.body[i], "name", "") == "__init__"
    )
    params = {a.arg for a in init.args.args + init.args.kwonlyargs}
    full = LmEvalSettings(engine="vllm", quantization="fp8", max_model_len=4096)
    assert set(model_args(full, CKPT)) - params == {"gpu_memory_utilization"}
    assert init.args.kwarg is not None and "self.model_args.update(kwargs)" in source.read_text()


def test_the_command_line_reproduces_the_call(tmp_path) -> None:
    s = LmEvalSettings(engine="vllm", quantization="fp8", k=4, greedy=False, limit=8)
    plans = plan_tasks(["add_sub"], s)
    cmd = lm_eval_command(s, CKPT, tmp_path, plans, tmp_path / "out")
    assert cmd[:3] == ["lm_eval", "--model", "vllm"]
    assert cmd[cmd.index("--model_args") + 1].startswith(f"pretrained={CKPT},dtype=bfloat16,")
    assert cmd[cmd.index("--tasks") + 1] == "fp8rl_tiny_add_sub"
    assert cmd[cmd.index("--batch_size") + 1] == "auto"
    samples = cmd[cmd.index("--samples") + 1]
    assert samples.startswith('{"fp8rl_tiny_add_sub":[0,1,2,50,51,52,100,101]')
    assert "--log_samples" in cmd and cmd[-2:] == ["--output_path", str(tmp_path / "out")]
    assert "--device" not in cmd  # vLLM takes its GPUs from CUDA_VISIBLE_DEVICES


def test_generation_is_greedy_or_samples_the_whole_vocabulary() -> None:
    plan = plan_tasks(["add_sub"], LmEvalSettings())[0]
    greedy = generation_kwargs(LmEvalSettings(), plan)
    assert greedy == {"until": [], "max_gen_toks": 80, "do_sample": False, "temperature": 0.0}
    sampled = LmEvalSettings(k=8, greedy=False, temperature=0.6, top_p=0.95, max_gen_toks=40)
    assert generation_kwargs(sampled, plan) == {
        "until": [], "max_gen_toks": 40, "do_sample": True, "temperature": 0.6,
        "top_p": 0.95, "top_k": 0,
    }  # fmt: skip
    vllm = LmEvalSettings(engine="vllm", k=8, greedy=False)
    assert "top_k" not in generation_kwargs(vllm, plan)  # vLLM's default is no top-k


def test_task_files_include_the_committed_ones_with_absolute_data_paths(tmp_path) -> None:
    s = LmEvalSettings(k=2, greedy=False, limit=3)
    plans = plan_tasks(["digit_sum"], s)
    write_task_dir(plans, s, tmp_path)
    task = yaml.safe_load((tmp_path / "fp8rl_tiny_digit_sum.yaml").read_text())
    assert task["include"] == str(TASKS_DIR / "fp8rl_tiny_digit_sum.yaml")
    data = Path(task["dataset_kwargs"]["data_files"]["test"])
    assert data.is_absolute() and data.name == "digit_sum.jsonl" and data.is_file()
    assert task["repeats"] == 2 and task["generation_kwargs"]["do_sample"] is True


def test_the_fingerprint_changes_with_what_changes_numbers() -> None:
    base = LmEvalSettings()
    fp = settings_fingerprint(base, plan_tasks(["add_sub"], base))

    def other(**changes) -> str:
        s = LmEvalSettings(**changes)
        return settings_fingerprint(s, plan_tasks(["add_sub"], s))

    assert other() == fp
    assert other(batch_size=8, device="cuda") == fp  # how, not what
    for changes in ({"dtype": "float32"}, {"limit": 5}, {"k": 2, "greedy": False}, {"seed": 1}):
        assert other(**changes) != fp, changes


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"k": 4}, "lm_eval.k=4 with lm_eval.greedy=true"),
        ({"quantization": "fp8"}, "lm_eval.quantization=fp8 is vLLM's"),
        ({"benchmarks": ["aime24", "calculus"]}, r"\['calculus'\] unknown"),
        ({"benchmarks": []}, "names no benchmark"),
        ({"engine": "jax"}, "lm_eval.engine='jax' is not one of"),
        ({"gpu_memory_utilization": 1.5}, "out of range"),
    ],
)
def test_settings_that_cannot_run_fail_naming_the_key(changes, message) -> None:
    with pytest.raises(ConfigError, match=message):
        LmEvalSettings(**changes)


def test_the_vllm_engine_without_vllm_says_where_it_runs(tmp_path) -> None:
    assert importlib.util.find_spec("vllm") is None  # this machine: the CPU stack
    with pytest.raises(RuntimeError, match="needs vLLM, which only a GPU node has"):
        run_lm_eval(tmp_path, ["add_sub"], LmEvalSettings(engine="vllm"), tmp_path / "out")


def test_a_checkpoint_that_would_not_stop_at_eos_is_refused(tmp_path) -> None:
    (tmp_path / "config.json").write_text('{"eos_token_id": null}')
    with pytest.raises(ValueError, match="would not stop at EOS"):
        run_lm_eval(tmp_path, ["add_sub"], LmEvalSettings(), tmp_path / "out")
