"""The config tree composes through Hydra's compose API: every group option, every preset,
every grid point; and what cannot run is refused at composition or validation, with a
message naming the key to change.

Composition costs ~0.1 s here, so the default run covers every *pair* of group options
(and every value of every preset's grid axes); the full cross and every grid point are
``slow``.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from fp8rl.experiments.build import to_train_config
from fp8rl.experiments.compose import CONF_DIR, SWEEPS_DIR, Composer, compose, expand_grid
from fp8rl.experiments.schema import ConfigError

GROUPS = ("granularity", "algorithm", "model", "clipping", "backend")


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


PRESETS = [f"+experiment={name}" for name in options("experiment")] + [
    f"+sweep={p.stem}" for p in sorted((SWEEPS_DIR / "sweep").glob("*.yaml"))
]


def test_the_tree_has_the_issues_options() -> None:
    assert options("granularity") == [
        "bf16",
        "blockwise",
        "fp8_rollout_only",
        "rowwise",
        "tensorwise",
    ]
    assert options("algorithm") == ["dapo", "grpo"]
    assert options("model") == ["tiny-l", "tiny-m", "tiny-s", "tiny-test"]
    assert options("clipping") == ["calibrated", "lower_only", "standard"]
    assert options("backend") == ["tiny", "verl"]
    assert {"+experiment=table2", "+experiment=dapo_table", "+experiment=test"} <= set(PRESETS)
    assert {"+sweep=regime", "+sweep=regime_noise", "+sweep=tis", "+sweep=lm_head"} <= set(PRESETS)


def pairwise_combinations() -> list[dict[str, str]]:
    """A covering set: every pair of options of two groups appears in some combination."""
    values = {g: options(g) for g in GROUPS}
    uncovered = {
        (g1, v1, g2, v2)
        for g1, g2 in itertools.combinations(GROUPS, 2)
        for v1 in values[g1]
        for v2 in values[g2]
    }
    chosen = []
    for combo in itertools.product(*(values[g] for g in GROUPS)):
        pick = dict(zip(GROUPS, combo, strict=True))
        pairs = {(g1, pick[g1], g2, pick[g2]) for g1, g2 in itertools.combinations(GROUPS, 2)}
        if pairs & uncovered:
            chosen.append(pick)
            uncovered -= pairs
    assert not uncovered
    return chosen


def check_combination(composer: Composer, pick: dict[str, str]) -> None:
    cfg = composer([f"{g}={v}" for g, v in pick.items()])
    if pick["backend"] == "verl":
        with pytest.raises(ConfigError, match=r"backend=verl is not available yet.*backend=tiny"):
            to_train_config(cfg)
        return
    train = to_train_config(cfg)
    spelled = {
        "bf16": ("bf16", None),
        "tensorwise": ("tensorwise", "tensor"),
        "rowwise": ("rowwise", "channel"),
        "blockwise": ("blockwise", "block"),
        "fp8_rollout_only": ("bf16", "block"),
    }[pick["granularity"]]
    assert (train.recipe, train.rollout_weight_scale) == spelled
    assert train.algorithm == pick["algorithm"]
    assert train.clip_eps == {"grpo": (0.2, 0.2), "dapo": (0.2, 0.28)}[pick["algorithm"]]
    assert train.use_dynamic_sampling == (pick["algorithm"] == "dapo")
    assert (train.overlong_buffer is not None) == (pick["algorithm"] == "dapo")
    assert train.base.preset == pick["model"]
    assert train.clipping == ("standard" if pick["clipping"] == "standard" else "calibrated")
    assert train.calib_lower_only == (pick["clipping"] == "lower_only")


def test_every_pair_of_group_options_composes_and_builds() -> None:
    picks = pairwise_combinations()
    assert 20 <= len(picks) < 60
    with Composer() as composer:
        for pick in picks:
            check_combination(composer, pick)


@pytest.mark.slow
def test_every_combination_of_group_options_composes_and_builds() -> None:
    with Composer() as composer:
        for combo in itertools.product(*(options(g) for g in GROUPS)):
            check_combination(composer, dict(zip(GROUPS, combo, strict=True)))


def covering_points(points: list[list[str]]) -> list[list[str]]:
    """Points such that every override value of the grid appears at least once."""
    seen: set[str] = set()
    chosen = []
    for point in points:
        if set(point) - seen:
            chosen.append(point)
            seen |= set(point)
    return chosen


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_composes_and_its_grid_axes_validate(preset: str) -> None:
    with Composer() as composer:
        points = expand_grid([preset], composer)
        assert len(points) >= 1
        for point in covering_points(points):
            to_train_config(composer(point))
    if preset != "+experiment=test":
        assert len(points) > 1, f"{preset} defines no grid"


@pytest.mark.slow
def test_every_point_of_every_preset_validates() -> None:
    with Composer() as composer:
        for preset in PRESETS:
            for point in expand_grid([preset], composer):
                to_train_config(composer(point))


def test_table2_is_the_papers_grid() -> None:
    points = expand_grid(["+experiment=table2"])
    assert len(points) == 4 * 2 * 3
    cfg = compose(points[0])
    assert cfg.experiment_name == "table2"
    assert cfg.algorithm.name.value == "grpo"
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
    train = to_train_config(compose(points[0]))
    assert train.eps_low == train.eps_high == 0.05
    assert train.ppo_mini_batches == 4
    assert train.shadow_every == 1  # every step compared with its BF16 shadow
    assert train.recipe != "bf16"  # FP8 runs only


# ------------------------------------------------------------------ refusals


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        # unknown key (composition)
        (["granularity.foo=1"], r"Key 'foo' not in 'GranularityConfig'"),
        (["+clipping.K=20"], r"unknown setting\(s\) \['clipping.K'\]"),
        # unknown option of a group
        (["granularity=fp4"], r"Could not find 'granularity/fp4'"),
        # a value outside a closed set, with the valid ones listed
        (["granularity.training=fp4"], r"expected one of \[bf16, tensorwise, rowwise, blockwise\]"),
        (["clipping.upper_rule=max"], r"expected one of \[balance, quantile\]"),
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
        to_train_config(compose(overrides))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        # out of range: checked by the schema, naming the key
        (["clipping.smoothing=1.5"], r"clipping.smoothing=1.5 is out of range: need \[0, 1\)"),
        (["algorithm.eps_low=1.0"], r"algorithm.eps_low=1.0 is out of range"),
        (["clipping=calibrated", "clipping.period=0"], r"clipping.period=0 is out of range"),
        (["clipping.init_high=0.9"], r"clipping.init_high=0.9 is out of range: need > 1"),
        (["rollout.n_samples=0"], r"rollout.n_samples=0 is out of range"),
        (["threads=0"], r"threads=0 is out of range"),
        (["eval.k=4"], r"eval.k=4 with eval.greedy=true.*set eval.k=1 or eval.greedy=false"),
        (["eval.families=[add_sub,calculus]"], r"eval.families: unknown \['calculus'\]"),
        # impossible combinations, naming the Hydra keys involved
        (
            ["train.old_logprob_source=rollout", "train.tis=true"],
            r"Set tis=False.*tis = train.tis",
        ),
        (
            ["clipping=calibrated", "train.ppo_mini_batches=1"],
            r"off-policy mini-batch.*ppo_mini_batches = train.ppo_mini_batches",
        ),
        (
            ["granularity.rollout_activation=token"],
            r"granularity.rollout_activation is set but granularity.rollout is null",
        ),
        (
            ["granularity=blockwise", "granularity.block_size=7"],
            r"block_size=7 does not divide.*block_size = granularity.block_size",
        ),
        (
            ["rollout.max_new_tokens=1000"],
            r"max_new_tokens=1000 exceeds.*max_new_tokens = rollout.max_new_tokens",
        ),
        (["backend=verl"], r"backend=verl is not available yet: the verl-backend issue"),
    ],
)
def test_validation_refuses_before_any_run_saying_what_to_change(
    overrides: list[str], message: str
) -> None:
    cfg = compose(overrides)  # composes: types are fine
    with pytest.raises(ConfigError, match=f"(?s){message}"):
        to_train_config(cfg)


def test_a_typo_in_a_preset_file_is_refused(tmp_path: Path, monkeypatch) -> None:
    """Group files merge into typed nodes: a misspelt key in a preset fails too."""
    import fp8rl.experiments.compose as compose_module

    conf = tmp_path / "conf"
    import shutil

    shutil.copytree(CONF_DIR, conf)
    (conf / "clipping" / "typo.yaml").write_text("mode: calibrated\nperiod_k: 20\n")
    monkeypatch.setattr(compose_module, "CONF_DIR", conf)
    with pytest.raises(ConfigError, match="period_k"):
        compose(["clipping=typo"])
