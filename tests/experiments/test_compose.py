"""The config tree composes through Hydra's compose API: every group option, every preset,
every grid point; and what cannot run is refused at composition or validation, with a
message naming the key to change.

Composition costs ~0.1 s here, so the default run covers every *pair* of group options
(and every value of every preset's grid axes); the full cross and every grid point are
``slow``.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

from fp8rl.config import RunConfig
from fp8rl.experiments.backends import resolve_run
from fp8rl.experiments.compose import CONF_DIR, SWEEPS_DIR, Composer, compose, expand_grid
from fp8rl.experiments.schema import ConfigError
from fp8rl.numerics.registry import BUILTIN, RECIPES

from grid_points import covering_points

GROUPS = ("granularity", "algorithm", "model", "clipping", "backend")


def to_run_config(cfg) -> RunConfig:
    """The resolved run config a composed config runs as (schema and backend checks)."""
    return resolve_run(cfg).config


def options(group: str) -> list[str]:
    """A group's options, without the aliases a study selects per backend
    (``model/<backend>_<study>.yaml``: study/dapo.yaml picks ``model=${backend}_dapo``)."""
    stems = sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))
    return [s for s in stems if not s.startswith(("tiny_", "verl_"))] if group == "model" else stems


#: Model presets and the backend that knows them.
TINY_MODELS = ("tiny-l", "tiny-m", "tiny-s", "tiny-test")
VERL_MODELS = ("qwen2.5-32b", "qwen3-0.6b-base", "qwen3-14b-base", "qwen3-8b-base")


PRESETS = [f"+experiment={name}" for name in options("experiment")] + [
    f"+sweep={p.stem}" for p in sorted((SWEEPS_DIR / "sweep").glob("*.yaml"))
]


def test_the_tree_has_the_issues_options() -> None:
    # a preset per shipped training recipe of the registry, plus the FP8-rollout-only row
    shipped = [d.name for d in BUILTIN if d.trainable]
    assert options("granularity") == sorted([*shipped, "fp8_rollout_only"])
    assert {"bf16", "tensorwise", "rowwise", "blockwise"} <= set(shipped)
    assert options("algorithm") == ["dapo", "grpo"]
    assert options("model") == sorted((*TINY_MODELS, *VERL_MODELS))
    assert options("clipping") == ["calibrated", "cispo", "lower_only", "standard"]
    assert options("backend") == ["tiny", "verl"]
    assert {"+experiment=table2", "+experiment=dapo_table", "+experiment=test"} <= set(PRESETS)
    assert {"+sweep=regime", "+sweep=regime_noise", "+sweep=tis", "+sweep=lm_head"} <= set(PRESETS)


def pairwise_combinations() -> list[dict[str, str]]:
    """A covering set: every pair of options of two groups appears in some combination, the
    models paired with their own backend's options (a model of the other backend is one
    refusal per pair: test_a_model_composes_only_on_its_backend)."""
    return [
        {**pick, "backend": backend}
        for backend, models in (("tiny", TINY_MODELS), ("verl", VERL_MODELS))
        for pick in _cover({g: options(g) for g in GROUPS if g != "backend"} | {"model": models})
    ]


def _cover(values: dict[str, list[str] | tuple[str, ...]]) -> list[dict[str, str]]:
    groups = tuple(values)
    uncovered = {
        (g1, v1, g2, v2)
        for g1, g2 in itertools.combinations(groups, 2)
        for v1 in values[g1]
        for v2 in values[g2]
    }
    combos = [dict(zip(groups, c, strict=True)) for c in itertools.product(*values.values())]

    def pairs(pick: dict[str, str]) -> set[tuple[str, str, str, str]]:
        return {(g1, pick[g1], g2, pick[g2]) for g1, g2 in itertools.combinations(groups, 2)}

    chosen = []
    while uncovered:  # greedy: the combination that covers the most pairs still uncovered
        best = max(combos, key=lambda pick: len(pairs(pick) & uncovered))
        chosen.append(best)
        uncovered -= pairs(best)
    assert not uncovered
    return chosen


def check_combination(composer: Composer, pick: dict[str, str]) -> None:
    cfg = composer([f"{g}={v}" for g, v in pick.items()])
    # a tiny model is a verl model too (with the tiny study settings; cluster=local_cpu)
    known = TINY_MODELS if pick["backend"] == "tiny" else VERL_MODELS + TINY_MODELS
    if pick["model"] not in known:
        with pytest.raises(ConfigError, match=rf"the {pick['backend']} backend knows"):
            to_run_config(cfg)
        return
    decl = RECIPES.get(pick["granularity"])
    if pick["backend"] == "verl" and decl is not None and decl.verl is None:
        with pytest.raises(ConfigError, match="the verl backend cannot run this recipe"):
            to_run_config(cfg)
        return
    run = to_run_config(cfg)
    spelled = {
        "fp8_rollout_only": ("bf16", "block"),
        **{d.name: (d.name, d.rollout) for d in BUILTIN if d.trainable},  # the Table-2 pairing
    }[pick["granularity"]]
    g, a, c = run.granularity, run.algorithm, run.clipping
    assert (g.training, g.rollout) == spelled
    assert a.name == pick["algorithm"]
    assert (a.eps_low, a.eps_high) == {"grpo": (0.2, 0.2), "dapo": (0.2, 0.28)}[pick["algorithm"]]
    assert a.dynamic_sampling == (pick["algorithm"] == "dapo")
    assert (run.overlong_buffer is not None) == (pick["algorithm"] == "dapo")
    preset = cfg.model.preset  # the model file's (verl: the Hugging Face id)
    tiny_model = pick["model"] in TINY_MODELS
    assert run.model.preset == preset and (preset == pick["model"]) == tiny_model
    calibrated = pick["clipping"] in ("calibrated", "lower_only")
    assert c.mode == ("calibrated" if calibrated else "standard")
    assert c.lower_only == (pick["clipping"] == "lower_only")
    assert c.loss == ("fp8rl_cispo" if pick["clipping"] == "cispo" else "calibrated_clip")


def test_every_pair_of_group_options_composes_and_builds() -> None:
    picks = pairwise_combinations()
    # a greedy cover of every pair of options, per backend (the granularity options, one per
    # shipped recipe, make most of it)
    assert 40 <= len(picks) < 20 * len(options("granularity"))
    with Composer() as composer:
        for pick in picks:
            check_combination(composer, pick)


def test_a_verl_model_is_refused_on_tiny_and_a_tiny_model_builds_on_verl() -> None:
    # (a tiny model on verl takes the tiny study settings: tests/verl_ext/test_cpu_launch.py)
    with Composer() as composer:
        for backend, models in (("tiny", VERL_MODELS), ("verl", TINY_MODELS)):
            for model in models:
                pick = {"granularity": "bf16", "algorithm": "grpo", "clipping": "standard"}
                check_combination(composer, {**pick, "model": model, "backend": backend})


@pytest.mark.slow
def test_every_combination_of_group_options_composes_and_builds() -> None:
    with Composer() as composer:
        for combo in itertools.product(*(options(g) for g in GROUPS)):
            check_combination(composer, dict(zip(GROUPS, combo, strict=True)))


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_composes_and_its_grid_axes_validate(preset: str) -> None:
    with Composer() as composer:
        points = expand_grid([preset], composer)
        assert len(points) >= 1
        for point in covering_points(points):
            to_run_config(composer(point))
    if preset != "+experiment=test":
        assert len(points) > 1, f"{preset} defines no grid"


@pytest.mark.slow
def test_every_point_of_every_preset_validates() -> None:
    with Composer() as composer:
        for preset in PRESETS:
            for point in expand_grid([preset], composer):
                to_run_config(composer(point))


def test_table2_is_the_papers_grid() -> None:
    points = expand_grid(["+experiment=table2"])
    assert len(points) == 4 * 2 * 4  # granularity x clipping x seeds 0-3 (the protocol's)
    cfg = compose(points[0])
    assert cfg.experiment_name == "table2"
    assert cfg.algorithm.name == "grpo"
    # the scale model comes from scale/tiny_table2.yaml through study=table2
    assert (cfg.algorithm.eps_low, cfg.steps, cfg.model.sft.steps) == (0.08, 50, 1200)
    assert compose(["+experiment=table2_default"]).algorithm.eps_low == 0.2
    grid = {(p[0], p[1]) for p in points}
    assert ("granularity=blockwise", "clipping=calibrated") in grid
    assert ("granularity=bf16", "clipping=standard") in grid
    # the preset runs as a grid without -m
    hydra_cfg = compose(["+experiment=table2"], return_hydra_config=True)
    assert str(hydra_cfg.hydra.mode) == "RunMode.MULTIRUN"


def test_command_line_values_replace_a_presets_axis() -> None:
    points = expand_grid(["+experiment=table2", "seed=7", "granularity=rowwise,blockwise"])
    assert len(points) == 2 * 2
    assert all("seed=7" in p for p in points)
    assert {p[0] for p in points} == {"granularity=rowwise", "granularity=blockwise"}


def test_the_regime_sweep_is_symmetric_in_width() -> None:
    points = expand_grid(["+sweep=regime"])
    assert len(points) == 2 * 3 * 2 * 2 * 2  # docs/regime.md's pre-registered grid
    run = to_run_config(compose(points[0]))
    assert run.algorithm.eps_low == run.algorithm.eps_high == 0.05
    assert run.train.ppo_mini_batches == 4
    assert run.train.shadow_every == 1  # every step compared with its BF16 shadow
    assert run.granularity.training != "bf16"  # FP8 runs only


# ------------------------------------------------------------------ refusals


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        # unknown key (composition): the nearest names, or the group's keys; never "+key"
        (["granularity.foo=1"], r"^unknown key 'granularity.foo': granularity has training, "),
        (["+clipping.K=20"], r"^unknown key 'clipping.K': clipping has loss, mode, period, "),
        (["granulraity=rowwise"], r"^unknown key 'granulraity' \(did you mean 'granularity'\?\)$"),
        (["trian.lr=1"], r"^unknown key 'trian.lr' \(did you mean 'train.lr'\?\)$"),
        (["++clipping.perod=5"], r"^unknown key 'clipping.perod' \(did you mean 'clipping.period'"),
        (["hydra.sweeper.progres_every_s=1"], r"did you mean 'hydra.sweeper.progress_every_s'\?"),
        (["experimnt=table2"], r"^unknown key 'experimnt' \(did you mean '\+experiment'\?\)$"),
        # a group no defaults list selects: the one place where "+" is the advice
        (["experiment=test"], r"^experiment=test: experiment is a config group that no "),
        # unknown option of a group: its options, as a plain list, and the nearest
        (
            ["granularity=int3"],
            "^granularity=int3 is not an option: choose one of "
            + re.escape(", ".join(options("granularity")))
            + "$",
        ),
        (
            ["+experiment=tabel2"],
            r"^experiment=tabel2 is not an option: .* \(did you mean table2\?\)$",
        ),
        (["hydra/launcher=paralel"], r"^hydra/launcher=paralel is not an option: choose one of "),
        # a value outside a closed set, with the valid ones listed
        (
            ["granularity.training=int3"],
            "granularity.training='int3' is not one of "
            + re.escape(str([d.name for d in BUILTIN if d.trainable])),
        ),
        (
            ["clipping.upper_rule=max"],
            r"clipping.upper_rule='max' is not one of \['balance', 'quantile'\]",
        ),
        # a wrong type
        (
            ["algorithm.eps_low=wide"],
            r"(?s)could not be converted to Float.*full_key: algorithm.eps_low",
        ),
        (["steps=ten"], r"could not be converted to Integer"),
        # a sweep where one value is needed
        (["seed=0,1"], r"(?i)ambiguous value for argument 'seed=0,1'|multirun"),
    ],
)
def test_composition_refuses_with_hydras_reason(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        to_run_config(compose(overrides))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        # out of range: checked by the schema, naming the key
        (["clipping.smoothing=1.5"], r"clipping.smoothing=1.5 is out of range: need 0.0 <= x < 1"),
        (["algorithm.eps_low=1.0"], r"algorithm.eps_low=1.0 is out of range"),
        (["clipping=calibrated", "clipping.period=0"], r"clipping.period=0 is out of range"),
        (["clipping.init_high=0.9"], r"clipping.init_high=0.9 is out of range: need 1.0 < x"),
        (["rollout.n_samples=0"], r"rollout.n_samples=0 is out of range"),
        (["threads=0"], r"threads=0 is out of range"),
        (
            ["eval.k=4", "eval.greedy=true"],
            r"eval.k=4 with eval.greedy=true.*set eval.k=1 or eval.greedy=false",
        ),
        (["eval.families=[add_sub,calculus]"], r"eval.families: unknown \['calculus'\]"),
        # impossible combinations, naming the Hydra keys involved
        (
            ["train.old_logprob_source=rollout", "train.tis=true"],
            r"train.tis=true with train.old_logprob_source=rollout.*Set train.tis=false",
        ),
        (
            ["clipping=calibrated", "train.ppo_mini_batches=1"],
            r"off-policy mini-batch.*Set train.ppo_mini_batches >= 2",
        ),
        (
            ["granularity.rollout_activation=token"],
            r"granularity.rollout_activation is set but granularity.rollout is null",
        ),
        (
            ["granularity=blockwise", "granularity.block_size=7"],
            r"granularity.block_size=7 does not divide the linear widths",
        ),
        (
            ["rollout.max_new_tokens=1000"],
            r"rollout.max_new_tokens=1000 exceeds model 'tiny-s'.s budget",
        ),
        (
            ["backend=verl", "model=tiny-s", "scale=verl_plain"],
            r"tiny-s takes the tiny study .* drop scale=verl_",
        ),
        (["model=qwen3-8b-base"], r"model.preset='Qwen/Qwen3-8B-Base': the tiny backend knows"),
        (["clipping=calibrated", "clipping.loss=vanilla"], r"clipping.loss=vanilla clips at"),
    ],
)
def test_validation_refuses_before_any_run_saying_what_to_change(
    overrides: list[str], message: str
) -> None:
    cfg = compose(overrides)  # composes: types are fine
    with pytest.raises(ConfigError, match=f"(?s){message}"):
        to_run_config(cfg)


def test_a_typo_in_a_preset_file_is_refused(tmp_path: Path, monkeypatch) -> None:
    """Group files merge into typed nodes: a misspelt key in a preset fails too."""
    import fp8rl.experiments.compose as compose_module

    conf = tmp_path / "conf"
    import shutil

    shutil.copytree(CONF_DIR, conf)
    (conf / "clipping" / "typo.yaml").write_text("mode: calibrated\nperiod_k: 20\n")
    monkeypatch.setattr(compose_module, "CONF_DIR", conf)
    expected = (
        "clipping/typo.yaml: unknown key 'clipping.period_k' (did you mean 'clipping.period'?)"
    )
    with pytest.raises(ConfigError) as err:
        compose(["clipping=typo"])
    assert str(err.value) == expected


# ------------------------------------------------------------------ search path and grids


def test_sweeps_is_on_the_search_path_through_the_primary_config(
    tmp_path: Path, monkeypatch
) -> None:
    """config.yaml's hydra.searchpath (no command-line override) finds sweeps/ from any
    working directory."""
    monkeypatch.chdir(tmp_path)
    cfg = compose(["+sweep=smoke"], return_hydra_config=True)
    assert cfg.experiment_name == "smoke"
    assert list(cfg.hydra.overrides.hydra) == []
    sources = {(s.provider, s.schema, s.path) for s in cfg.hydra.runtime.config_sources}
    assert ("hydra.searchpath in main", "file", str(SWEEPS_DIR)) in sources


GRIDS = [
    [],
    ["a=1"],
    ["a=1,2", "b=x,y,z"],
    ["a=1,2", "b=3", "c=4,5"],
    # a later value for the same key wins and keeps the key's first place
    ["a=1,2", "b=3,4", "a=5,6,7"],
    ["a=1,2", "a=9", "b=3,4"],
    ["a=range(0,3)", "b=choice(p,q)", "+c=1,2", "~d", "e@pkg=1,2", "f='s, t',u"],
    ["granularity=bf16,rowwise", "seed=0,1,2", "+experiment=table2", "steps=3"],
    ["list=[1,2],[3,4]", "dict={a:1},{a:2}", "n=null,1"],
    ["a=sort(3,1,2)", "b=tag(t,choice(1,2))", "c=range(5,0,-2)"],
]


@pytest.mark.parametrize("grid", GRIDS, ids=[" ".join(g) or "empty" for g in GRIDS])
def test_grid_points_is_hydras_basic_sweeper_expansion(grid: list[str]) -> None:
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper  # the reference
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from fp8rl.experiments.compose import grid_points

    parsed = OverridesParser.create().parse_overrides(grid)
    (expected,) = BasicSweeper.split_arguments(parsed, None)
    assert grid_points(parsed) == [list(p) for p in expected]


def test_a_grid_refuses_a_sweep_it_cannot_enumerate() -> None:
    with pytest.raises(ConfigError, match=r"INTERVAL_SWEEP.*interval"):
        expand_grid(["clipping.smoothing=interval(0.1,0.5)"])


@pytest.mark.parametrize("size", [None, -1, 1, 2, 3, 5, 8])
def test_grid_batches_are_hydras_chunks(size: int | None) -> None:
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper  # the reference

    from fp8rl.experiments.sweeper import batches

    for n in (1, 5, 6):
        jobs = [[f"seed={i}"] for i in range(n)]
        assert batches(jobs, size) == list(BasicSweeper.split_overrides_to_chunks(jobs, size))
    # a grid with nothing to launch (every run done) launches nothing (Hydra's helper
    # asserts on an empty list with no batch size)
    assert batches([], size) == []


def test_grid_batches_refuse_a_size_below_one() -> None:
    from hydra.errors import HydraException

    from fp8rl.experiments.sweeper import batches

    with pytest.raises(HydraException, match="max_batch_size=0"):
        batches([["seed=0"]], 0)
