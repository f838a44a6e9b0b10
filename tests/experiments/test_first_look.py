"""The first look, the noise table and the quickstart run are presets and sweeps of the
config tree (run by ``sweep.py``); ``scripts/first_look.py`` and ``scripts/noise_table.py``
only report, finding each arm's run by its run id. Checked here: the sweeps hold the
protocol's runs (same settings as the scripts that used to train them), and the report
scripts print their tables from runs in a store (synthetic step logs: nothing trains)."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType

import pytest

from fp8rl.config import RunConfig
from fp8rl.experiments.compose import Composer, compose_run_config, expand_grid
from fp8rl.experiments.grid import GridPoint, plan_grid
from fp8rl.runs import RunStatus, RunStore

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts"


def load_script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"_script_{name}", SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def first_look() -> ModuleType:
    return load_script("first_look")


@pytest.fixture(scope="module")
def noise_table() -> ModuleType:
    return load_script("noise_table")


def plan(sweep: str, runs_dir: Path, *extra: str) -> list[GridPoint]:
    with Composer() as compose:
        args = [f"+sweep={sweep}", f"runs_dir={runs_dir}", *extra]
        return plan_grid([(p, compose(p)) for p in expand_grid(args, compose)]).points


def make_recipe(target: str) -> list[str]:
    """The arguments ``make <target>`` passes to ``sweep.py`` (continuations joined)."""
    lines = (REPO / "Makefile").read_text().split(f"\n{target}:", 1)[1].split("\n\n", 1)[0]
    words = lines.replace("\\\n", " ").split("\n", 1)[1].split()
    return words[words.index("sweep.py") + 1 :]


def test_make_train_tiny_is_the_old_quickstart_run() -> None:
    overrides = [w for w in make_recipe("train-tiny") if w != "$(ARGS)"]
    cfg = compose_run_config(overrides)
    g, c = cfg.granularity, cfg.clipping
    assert (g.training, g.rollout, g.block_size) == ("blockwise", "block", 4)
    assert (c.mode, c.period) == ("calibrated", 5)
    assert (cfg.steps, cfg.eval.every, cfg.eval.limit, cfg.eval.k) == (30, 15, 50, 4)
    assert cfg.model.preset == "tiny-s" and cfg.algorithm.name == "grpo"
    # a plain run since issue 46: the learning world's shipped slip base, sampled eval
    assert (cfg.model.sft.steps, cfg.model.sft.noise, cfg.eval.greedy) == (1200, 0.5, False)
    assert {"experiment_name=quickstart", "threads=2"} <= set(overrides)


def test_the_first_look_sweeps_hold_the_protocols_runs(tmp_path: Path, first_look) -> None:
    improvement = plan("first_look_improvement", tmp_path)
    assert [p.resolved.config.seed for p in improvement] == [0, 1, 2, 3]
    runs = {p.run_id: p for s in first_look.SWEEPS["recipes"] for p in plan(s, tmp_path)}
    recipes = list(runs.values())
    for p in improvement + recipes:
        cfg, exp = p.resolved.config, p.resolved.experiment
        assert (exp.experiment_name, exp.threads) == ("first_look", 1)
        assert (cfg.steps, cfg.eval.every, cfg.eval.limit, cfg.eval.k) == (60, 60, 100, 4)
        assert not cfg.eval.greedy and cfg.model.preset == "tiny-s"
        assert cfg.algorithm.name == "grpo" and cfg.algorithm.eps_low == 0.2
    ordered = sorted(recipes, key=lambda p: first_look.recipe_order(p.resolved.config))
    assert [first_look.recipe_label(p.resolved.config) for p in ordered] == [
        "BF16 / BF16",
        "FP8 tensor rollout / BF16 training",
        "tensor rollout / tensorwise",
        "channel rollout / rowwise",
        "block rollout / blockwise",
        "block rollout / blockwise, calibrated (K=10)",
    ]
    # the recipes' BF16 run is the improvement's seed 0: one run
    assert ordered[0].run_id == improvement[0].run_id
    for p in ordered[4:]:  # the calibration check's pair
        cfg = p.resolved.config
        assert (cfg.granularity.block_size, cfg.train.shadow_every) == (4, 2)
    assert all(p.resolved.config.train.shadow_every == 0 for p in ordered[:4])


def test_the_noise_table_sweeps_hold_the_old_tables_probes(tmp_path: Path, noise_table) -> None:
    points = list({p.run_id: p for s in noise_table.SWEEPS for p in plan(s, tmp_path)}.values())
    for p in points:
        cfg = p.resolved.config
        assert (cfg.task, cfg.probe_rounds, cfg.seed) == ("noise_probe", 4, 0)
        assert (cfg.rollout.prompts_per_step, cfg.rollout.n_samples) == (16, 8)
        assert p.resolved.experiment.experiment_name == "noise_table"
    ordered = sorted(points, key=lambda p: noise_table.recipe_order(p.resolved.config))
    labels = [noise_table.recipe_label(p.resolved.config) for p in ordered]
    assert labels == [
        "BF16 / BF16",
        "FP8 tensor rollout / BF16 training",
        "tensor rollout / tensorwise",
        "tensor rollout / tensorwise, FP8 LM head",
        "channel rollout / rowwise",
        "channel rollout / rowwise, FP8 LM head",
        "block rollout / blockwise (block 4)",
        "block rollout / blockwise (block 4), FP8 LM head",
    ]


def fake_run(store: RunStore, experiment: str, cfg: RunConfig, steps: int) -> None:
    """A finished run of ``cfg`` with synthetic step and eval logs."""
    families = [*(cfg.eval.families or ()), "all"]
    k = cfg.eval.k
    with store.open_run(experiment, cfg.to_dict()) as run:
        for step in range(1, steps + 1):
            run.log_metrics(
                step,
                {
                    "critic/score/mean": 0.1,
                    "actor/entropy": 0.25,
                    "fp8rl/well_formed_frac": 1.0,
                    "fp8rl/repeat_4gram_frac": 0.02,
                    "fp8rl/clipfrac_low_negadv": 0.001,
                    "fp8rl/logratio/negadv/std": 0.02,
                    "fp8rl/rollout_trainer_logprob_absdiff": 0.005,
                    "timing_s/step": 1.0,
                    "fp8rl/clip_low": 0.8,
                    "fp8rl/shadow/clipfrac_low_negadv_gap": 0.001 * (step % 3),
                    "fp8rl/shadow/clipfrac_low_negadv_fp8": 0.002,
                    "fp8rl/shadow/clipfrac_low_negadv_bf16": 0.001,
                    "fp8rl/shadow/clipfrac_high_posadv_gap": 0.0,
                    "fp8rl/shadow/n_negadv": 100.0,
                },
            )
        for step, acc in ((0, 0.1 + 0.01 * cfg.seed), (steps, 0.2)):
            run.log_eval(step, {f"val-core/{f}/acc/mean@{k}": acc for f in families})
        run.mark(RunStatus.DONE)


def test_first_look_reports_from_the_store(
    tmp_path: Path, first_look, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    store = RunStore(tmp_path)
    steps = 4
    small = [f"steps={steps}", "clipping.period=2", "eval.families=[add_sub,max_min]"]
    for sweep in ("first_look_improvement", *first_look.SWEEPS["recipes"]):
        for p in plan(sweep, tmp_path, *small):
            if p.action == "start" and p.resolved.config.seed != 3:  # seed 3 left out
                fake_run(store, p.experiment, p.resolved.config, steps)
    monkeypatch.setattr(sys, "argv", ["first_look.py", f"runs_dir={tmp_path}", *small])
    first_look.main()
    out, err = capsys.readouterr()
    assert "### BF16 RL vs the SFT base (3 seeds, acc/mean@4, T=1)" in out
    assert "| max_min | 0.110 | 0.200 | +0.090 | [+0.065, +0.115] |" in out
    assert "| block rollout / blockwise, calibrated (K=2) | 0.100 | 0.200 |" in out
    assert out.count("rollout / ") == 5  # + "BF16 / BF16"
    assert "- eps 0.2 seed 0: calibrated |gap| " in out
    assert "first_look_improvement: 1 of 4 runs not done (seed=3: start)" in err
    assert "python sweep.py +sweep=first_look_improvement" in err


def test_noise_table_reports_from_the_store(
    tmp_path: Path, noise_table, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    store = RunStore(tmp_path)
    for sweep in noise_table.SWEEPS:
        for p in plan(sweep, tmp_path):
            if p.action != "start":
                continue
            with store.open_run(p.experiment, p.resolved.config.to_dict()) as run:
                g = p.resolved.config.granularity
                std = 0.0 if g.training == "bf16" else 0.04
                data = {"noise/responses": 512.0, "noise/tokens": 18000.0}
                for source in ("rollout_vs_trainer", "train_vs_bf16"):
                    for key in ("all", "negadv", "posadv", "negadv/p_lt_0.1", "negadv/p_ge_0.5"):
                        data[f"noise/{source}/{key}/std"] = std
                run.log_metrics(0, data)
                run.mark(RunStatus.DONE)
    out_json = tmp_path / "noise.json"
    monkeypatch.setattr(
        sys, "argv", ["noise_table.py", "--json", str(out_json), f"runs_dir={tmp_path}"]
    )
    noise_table.main()
    out = capsys.readouterr().out
    assert f"trust region log(0.8) = {math.log(0.8):.3f}" in out
    assert out.count("| block rollout / blockwise (block 4), FP8 LM head | 0.0400 |") == 2
    assert out.count("| BF16 / BF16 | 0.0000 |") == 2
    assert "FP8 tensor rollout / BF16 training" in out_json.read_text()
