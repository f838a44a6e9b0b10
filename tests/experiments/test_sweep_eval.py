"""``sweep.py --eval`` end to end in a temporary directory: a finished run that exported
nothing exports its kept checkpoint and is evaluated with lm-eval (hf, this CPU) into its
folder (the real CLI); a second call finds the evaluation in the store and redoes nothing;
a setting that cannot run fails in one line before anything is written."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest
import torch
from sweep_cli import sweep

from fp8rl.experiments.compose import compose
from fp8rl.experiments.dispatch import run_one
from fp8rl.runs import LM_EVAL_FILE, list_hf_exports

from room_rules import REPO

RUN = ["+experiment=test", "steps=1"]
EVAL = ["lm_eval.limit=1", "lm_eval.dtype=float32", "lm_eval.max_gen_toks=8", "threads=1"]


@pytest.fixture(scope="module")
def sweep_py():
    """sweep.py as a module, for the calls that need no interpreter of their own."""
    spec = importlib.util.spec_from_file_location("sweep_entry", REPO / "sweep.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["sweep_entry"] = module  # its dataclasses look their module up
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop("sweep_entry", None)


def test_eval_exports_evaluates_and_resumes(tmp_path, cache, capfd, sweep_py) -> None:
    where = [f"runs_dir={tmp_path / 'runs'}", f"cache_dir={cache}"]
    threads = torch.get_num_threads()
    try:
        summary = run_one(compose([*RUN, *where, "threads=1"]))  # trained without export_hf
    finally:
        torch.set_num_threads(threads)
    assert summary.status == "done" and not list_hf_exports(summary.path)
    run_dir = summary.path
    first = sweep(tmp_path, "--eval", *RUN, *where, *EVAL)
    assert first.returncode == 0, first.stderr
    assert f"exported steps [1] of {run_dir.name}" in first.stderr
    assert "1 checkpoints, 0 already evaluated, 1 to go (2 problems)" in first.stderr
    assert "lm-eval/hf" in first.stdout and "evaluated now" in first.stdout
    (row,) = [json.loads(x) for x in (run_dir / LM_EVAL_FILE).read_text().splitlines()]
    assert row["step"] == 1 and row["data"]["engine"] == "lm-eval/hf"
    assert set(row["data"]["benchmarks"]) == {"add_sub", "max_min"}  # the run's eval.families
    log = (run_dir / LM_EVAL_FILE).read_bytes()
    capfd.readouterr()
    try:
        assert sweep_py.lm_eval([*RUN, *where, *EVAL]) == 0
    finally:
        torch.set_num_threads(threads)
    out, err = capfd.readouterr()
    assert "1 checkpoints, 1 already evaluated, 0 to go" in err
    assert "in store" in out and (run_dir / LM_EVAL_FILE).read_bytes() == log


def test_an_eval_setting_that_cannot_run_fails_in_one_line(tmp_path, capfd, sweep_py) -> None:
    capfd.readouterr()
    code = sweep_py.lm_eval([*RUN, f"runs_dir={tmp_path}", "lm_eval.k=3"])
    err = capfd.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert "eval error" in err and "lm_eval.k=3 with lm_eval.greedy=true" in err
    assert list(tmp_path.iterdir()) == []


def test_eval_is_one_of_the_modes(sweep_py, capsys) -> None:
    assert sweep_py.parse_args(["--eval", "a=1"]).offline == "--eval"
    with pytest.raises(SystemExit) as exit_:
        sweep_py.parse_args(["--eval", "--status"])
    assert exit_.value.code == 2 and "not allowed with argument" in capsys.readouterr().err
    assert sys.argv  # untouched


def test_runs_not_done_are_left_out_and_say_so(tmp_path) -> None:
    from fp8rl.experiments.lm_eval_stage import plan_stage, settings_for
    from fp8rl.experiments.preflight import preflight

    checked = preflight(["-m", *RUN, f"runs_dir={tmp_path}", "seed=0,1"], write=False)
    stage = plan_stage(checked.plan)
    assert (
        stage.jobs == []
        and [why for _, why in stage.left_out] == ["not done (start): run it with sweep.py"] * 2
    )
    assert [label for label, _ in stage.left_out] == ["seed=0", "seed=1"]
    # a tiny run's own token budget unless lm_eval.max_gen_toks says otherwise
    assert settings_for(checked.plan.points[0]).max_gen_toks == 24
    assert not tmp_path.exists() or list(tmp_path.iterdir()) == []


def test_a_tiny_model_s_run_on_verl_is_evaluated_on_its_own_families() -> None:
    """``backend=verl model=tiny-test`` validates on the tiny families at eval.max_new_tokens
    (fp8rl.verl_ext.tiny_world): lm-eval measures the same, as on a tiny run, not the math
    suite; a verl run of a Hub model keeps the suite; lm_eval.* settings win on either."""
    from types import SimpleNamespace

    from fp8rl.config import RunConfig
    from fp8rl.evaluation.benchmarks import SUITE, TINY_BENCHMARKS
    from fp8rl.evaluation.settings import LmEvalSettings
    from fp8rl.experiments.lm_eval_stage import benchmarks_for, settings_for

    def point(preset: str, families: list[str] | None, **lm_eval) -> SimpleNamespace:
        ev = {"families": families, "max_new_tokens": 24}
        cfg = RunConfig.from_dict(
            {"backend": {"name": "verl"}, "model": {"preset": preset}, "eval": ev}
        )
        experiment = SimpleNamespace(lm_eval=LmEvalSettings(**lm_eval))
        return SimpleNamespace(resolved=SimpleNamespace(config=cfg, experiment=experiment))

    tiny = point("tiny-test", ["add_sub", "max_min"])
    assert benchmarks_for(tiny) == ["add_sub", "max_min"]
    assert settings_for(tiny).max_gen_toks == 24
    assert benchmarks_for(point("tiny-s", None)) == list(TINY_BENCHMARKS)  # every family
    hub = point("qwen3-8b-base", ["aime24"])
    assert benchmarks_for(hub) == list(SUITE) and settings_for(hub).max_gen_toks is None
    chosen = point("tiny-test", None, benchmarks=["modulo"], max_gen_toks=9)
    assert benchmarks_for(chosen) == ["modulo"] and settings_for(chosen).max_gen_toks == 9
