"""The run config: every numeric key declares its range once, bad values fail naming the
key, combinations are checked across groups, and the config round-trips through plain
data and dotted-key overrides."""

from __future__ import annotations

import dataclasses
import math
import re
import subprocess
import sys
import typing

import pytest

from fp8rl.config import ClippingConfig, ConfigError, RunConfig, leaf_fields, override, resolve
from fp8rl.config.fields import Range, check_fields, num
from fp8rl.config.run import MAX_STEPS
from fp8rl.rl import LIVE_BOUND_LOSSES, POLICY_LOSSES
from fp8rl.rl.calibration import UPPER_RULES, CalibrationKnobs, CalibratorConfig

from room_rules import REPO, imported_modules


def _numeric(f: dataclasses.Field) -> bool:
    text = str(f.type)
    return any(t in text for t in ("int", "float")) and "bool" not in text


def test_every_numeric_leaf_declares_its_range() -> None:
    numeric = {k: f for k, f in leaf_fields().items() if _numeric(f)}
    assert len(numeric) > 40
    missing = [k for k, f in numeric.items() if "range" not in f.metadata]
    assert missing == []


#: Numeric leaves without an upper bound, and why none is meaningful.
UNBOUNDED = {
    "seed": "a seed: any non-negative integer names a random stream, none is too large",
    "model.sft.seed": "a seed (as seed)",
    "eval.seed": "a seed (as seed)",
}


def _has_upper_bound(f: dataclasses.Field) -> bool:
    rng = f.metadata["range"]
    return rng.le is not None or rng.lt is not None


def test_every_numeric_leaf_has_an_upper_bound_or_a_reason_not_to() -> None:
    numeric = {k: f for k, f in leaf_fields().items() if _numeric(f)}
    unbounded = sorted(k for k, f in numeric.items() if not _has_upper_bound(f))
    assert unbounded == sorted(UNBOUNDED)  # a new key needs a bound (or a reason here)


def _float_leaves() -> dict[str, dataclasses.Field]:
    return {
        k: f for k, f in leaf_fields().items() if _numeric(f) and str(f.type).startswith("float")
    }


def test_every_float_leaf_refuses_nan_and_infinities_naming_the_key() -> None:
    """In process, every float setting of the schema with NaN, +inf and -inf: refused by
    the group's own check (a comparison with NaN is false, so a range alone lets it by),
    naming the key and the range."""
    leaves = _float_leaves()
    assert len(leaves) >= 20 and "train.lr" in leaves and "rollout.temperature" in leaves
    for key, f in leaves.items():
        assert f.metadata.get("finite", True), f"{key} declares finite=False"
        for value in (math.nan, math.inf, -math.inf):
            with pytest.raises(ConfigError) as err:
                override(RunConfig(), {key: value})
            assert str(err.value) == (
                f"{key}={value!r} is not a finite number: {f.metadata['range'].describe()}"
            )


def test_integer_leaves_refuse_nan_and_infinities() -> None:
    ints = [k for k, f in leaf_fields().items() if _numeric(f) and "int" in str(f.type)]
    assert len(ints) > 30
    for key in ints:
        value = [math.nan] if leaf_fields()[key].metadata.get("list") else math.inf
        with pytest.raises(ConfigError, match=rf"^{re.escape(key)}=.* must be an integer$"):
            override(RunConfig(), {key: value})


def test_a_declaration_can_let_infinity_through_but_never_nan() -> None:
    @dataclasses.dataclass
    class Group:
        cap: float = num(1.0, gt=0.0, finite=False)  # inf: "no cap"
        x: float = num(0.5, ge=0.0, le=1.0)

    check_fields(Group(cap=math.inf), "g")
    with pytest.raises(ConfigError, match=r"^g.cap=nan is out of range: need 0.0 < x$"):
        check_fields(Group(cap=math.nan), "g")
    with pytest.raises(ConfigError, match=r"^g.cap=-inf is out of range"):
        check_fields(Group(cap=-math.inf), "g")
    with pytest.raises(ConfigError, match=r"^g.x=inf is not a finite number"):
        check_fields(Group(x=math.inf), "g")
    assert not Range(ge=0.0).contains(math.nan) and Range().contains(1e300)


def test_sizes_that_cap_compute_are_marked_and_bounded() -> None:
    """The keys whose upper bound is a cap on compute (the pre-run check prices a value
    above it: fp8rl.experiments.grid.compute_cap_error)."""
    fields = leaf_fields()
    marked = sorted(k for k, f in fields.items() if f.metadata.get("sizes_compute"))
    assert {"steps", "model.sft.steps", "eval.limit", "rollout.max_new_tokens"} <= set(marked)
    assert all(fields[k].metadata["range"].le is not None for k in marked)
    assert fields["steps"].metadata["range"].le == 100_000


def test_every_closed_set_names_its_options() -> None:
    fields = leaf_fields()
    for key in ("granularity.training", "clipping.loss", "clipping.upper_rule", "task"):
        assert "choices" in fields[key].metadata, key
    assert fields["clipping.loss"].metadata["choices"] == tuple(POLICY_LOSSES)
    assert fields["clipping.upper_rule"].metadata["choices"] == UPPER_RULES
    # the one string that is not a closed set here: the model preset, whose names belong to
    # the backend (its validate checks them)
    free = {
        k
        for k, f in fields.items()
        if str(f.type).startswith("str") and "choices" not in f.metadata
    }
    assert free == {"model.preset"}


def test_the_defaults_are_a_valid_config() -> None:
    cfg = RunConfig()
    assert cfg.algorithm.eps_low == 0.2 and cfg.clipping.mode == "standard"
    assert RunConfig.from_dict(cfg.to_dict()) == cfg


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"algorithm.eps_low": 1.0}, "algorithm.eps_low=1.0 is out of range: need 0.0 <= x < 1.0"),
        ({"steps": 0}, "steps=0 is out of range: need 1 <= x"),
        ({"steps": 2.5}, "steps=2.5 must be an integer"),
        ({"train.lr": 0.0}, "train.lr=0.0 is out of range: need 0.0 < x"),
        ({"model.sft.difficulties": [0, 1]}, "model.sft.difficulties=[0, 1] is out of range"),
        ({"granularity.training": "fp4"}, "granularity.training='fp4' is not one of"),
        ({"clipping.loss": "cispo"}, "clipping.loss='cispo' is not one of"),
        ({"train.ppo_epochs": None}, "train.ppo_epochs must not be null"),
        ({"eval.greedy": True, "eval.k": 4}, "eval.k=4 with eval.greedy=true"),
        ({"train.ppo_mini_batches": 1000}, "train.ppo_mini_batches=1000 exceeds the batch"),
        ({"granularity.rollout_activation": "token"}, "granularity.rollout is null"),
        ({"granularity.bf16_compute": "fp16"}, "granularity.bf16_compute='fp16' is not one of"),
        (
            {"train.old_logprob_source": "rollout", "train.tis": True},
            "train.tis=true with train.old_logprob_source=rollout",
        ),
        (
            {"clipping.mode": "calibrated", "train.ppo_mini_batches": 1},
            "clipping.mode=calibrated needs an off-policy mini-batch",
        ),
        ({"clipping.mode": "calibrated", "clipping.loss": "vanilla"}, "clipping.loss=vanilla"),
        ({"clipping.init_low": 0.6, "clipping.loss": "vanilla"}, "reads no live bounds"),
        # within eps_low's range, but 1 - 0.6 is under Calibrated Clipping's hard limit
        ({"algorithm.eps_low": 0.6}, "keys: algorithm.eps_low, algorithm.eps_high"),
        ({"algorithm.eps_high": 5.0}, "algorithm.eps_high=5.0 is out of range: need 0.0 <= x"),
        ({"train.lr": float("nan")}, "train.lr=nan is not a finite number: need 0.0 < x <= 1.0"),
        ({"steps": 10**12}, "steps=1000000000000 is out of range: need 1 <= x <= 100000"),
        ({"algorithm.overlong_buffer_len": 100}, "algorithm.overlong_buffer_len=100 exceeds"),
    ],
)
def test_bad_values_fail_naming_the_key(changes: dict, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        override(RunConfig(), changes)
    assert message in str(err.value)


def test_override_refuses_unknown_keys_and_from_dict_unknown_settings() -> None:
    with pytest.raises(ConfigError, match=r"unknown setting 'clipping\.perid'"):
        override(RunConfig(), {"clipping.perid": 5})
    data = RunConfig().to_dict()
    data["train"]["lr_schedule"] = "cosine"
    with pytest.raises(ConfigError, match=r"\['train.lr_schedule'\]"):
        RunConfig.from_dict(data)


def test_live_bound_losses_accept_calibration() -> None:
    for loss in LIVE_BOUND_LOSSES:
        cfg = override(RunConfig(), {"clipping.mode": "calibrated", "clipping.loss": loss})
        assert cfg.calibrator_config().enabled


def test_resolve_fills_derived_values_and_resets_unused_ones() -> None:
    cfg = override(
        RunConfig(),
        {
            "granularity.training": "blockwise",
            "algorithm.overlong_buffer_len": None,
            "clipping.period": 7,
            "algorithm.kl_type": "k1",
        },
    )
    resolved, unused = resolve(cfg, default_block_size=4, families=("a", "b"))
    assert resolved.granularity.block_size == 4
    assert resolved.algorithm.overlong_buffer_len == 16  # a quarter of 64 new tokens
    assert resolved.train.tis is True  # trainer old log-probs
    assert resolved.eval.families == ["a", "b"]
    assert resolved.clipping.period == RunConfig().clipping.period
    assert set(unused) == {"clipping.period", "algorithm.kl_type"}
    again, nothing = resolve(resolved, default_block_size=4, families=("a", "b"))
    assert again == resolved and nothing == {}


#: The clipping group's Hydra keys (sweeps, presets, docs and committed results use them).
CLIPPING_KEYS = (
    "loss mode period smoothing init_low init_high upper_rule lower_only calibrate_at_start "
    "max_step pool min_tail_tokens"
).split()


def test_the_calibration_knobs_are_declared_once_and_the_clipping_group_is_them() -> None:
    """``clipping`` is ``CalibrationKnobs`` (same declarations, same keys in the same order)
    plus ``loss``/``mode``; eps_low/eps_high are the calibrator's declarations; the
    calibrator's config is the clipping group's knobs with the algorithm's eps."""
    clipping = {f.name: f for f in dataclasses.fields(ClippingConfig)}
    assert list(clipping) == CLIPPING_KEYS
    for f in dataclasses.fields(CalibrationKnobs):
        assert clipping[f.name] is f  # inherited, not copied
    calibrator = {f.name: f for f in dataclasses.fields(CalibratorConfig)}
    fields = leaf_fields()
    for key in ("eps_low", "eps_high"):
        mine, theirs = fields[f"algorithm.{key}"], calibrator[key]
        assert (mine.default, mine.metadata) == (theirs.default, theirs.metadata)
    assert fields["clipping.period"].metadata["range"].le == MAX_STEPS  # a run's step cap
    changes = {"clipping.mode": "calibrated", "clipping.period": 7, "clipping.smoothing": 0.0,
               "clipping.init_low": 0.7, "clipping.upper_rule": "quantile",
               "clipping.lower_only": True, "clipping.calibrate_at_start": True,
               "clipping.max_step": 0.1, "clipping.pool": "period",
               "clipping.min_tail_tokens": 5, "algorithm.eps_high": 0.28}  # fmt: skip
    cfg = override(RunConfig(), changes)
    cal = cfg.calibrator_config()
    assert cal.knobs_dict() == {k: getattr(cfg.clipping, k) for k in CLIPPING_KEYS[2:]}
    assert (cal.eps_low, cal.eps_high, cal.start_step, cal.enabled) == (0.2, 0.28, 1, True)
    knobs = {k.split(".")[1]: v for k, v in changes.items() if k.split(".")[1] in CLIPPING_KEYS}
    del knobs["mode"]
    assert CalibrationKnobs.from_knobs_dict(cfg.clipping.knobs_dict()) == CalibrationKnobs(**knobs)
    with pytest.raises(ConfigError, match=r"^clipping\.smoothing=1\.0 is out of range: need"):
        override(RunConfig(), {"clipping.smoothing": 1.0})


def test_standard_clipping_resets_every_calibration_knob_but_the_fixed_bounds() -> None:
    calibrating = {"clipping.period": 7, "clipping.smoothing": 0.0, "clipping.init_low": 0.7,
                   "clipping.upper_rule": "quantile", "clipping.lower_only": True,
                   "clipping.calibrate_at_start": True, "clipping.max_step": 0.1,
                   "clipping.pool": "period", "clipping.min_tail_tokens": 5}  # fmt: skip
    resolved, unused = resolve(
        override(RunConfig(), calibrating), default_block_size=4, families=("a",)
    )
    assert set(unused) == set(calibrating) - {"clipping.init_low"}
    assert resolved.clipping == ClippingConfig(init_low=0.7)


def test_check_fields_reads_only_declared_fields() -> None:
    @dataclasses.dataclass
    class Group:
        x: float = num(0.5, gt=0.0, le=1.0)
        label: str = "free text"

    check_fields(Group(), "g")
    with pytest.raises(ConfigError, match=r"g.x=1.5 is out of range: need 0.0 < x <= 1.0"):
        check_fields(Group(x=1.5), "g")
    assert Range(ge=1).describe() == "need 1 <= x"


def test_groups_are_dataclasses_with_hints_hydra_can_read() -> None:
    hints = typing.get_type_hints(RunConfig)
    assert all(dataclasses.is_dataclass(hints[f.name]) for f in dataclasses.fields(RunConfig)[4:])


def test_the_config_room_imports_only_numerics_and_rl() -> None:
    """... and ``fp8rl.fields``, the ground-floor field declarations (no room's); the run
    request names the run store in its type hints only (``TYPE_CHECKING``), loading nothing."""
    allowed = ("fp8rl.config", "fp8rl.numerics", "fp8rl.rl", "fp8rl.fields")
    for file in sorted((REPO / "fp8rl" / "config").glob("*.py")):
        for name, _ in imported_modules(file):
            if file.name == "request.py" and name == "fp8rl.runs":
                continue
            if name.startswith("fp8rl."):
                assert name.startswith(allowed), f"{file.name} imports {name}"
    code = "import sys, fp8rl.config.request; assert 'fp8rl.runs' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def _outside(rng: Range, integer: bool) -> list[float]:
    """Values just outside each declared side of ``rng``."""
    step = 1 if integer else 0.5
    out = []
    if rng.ge is not None:
        out.append(rng.ge - step)
    if rng.gt is not None:
        out.append(rng.gt)
    if rng.le is not None:
        out.append(rng.le + step)
    if rng.lt is not None:
        out.append(rng.lt)
    return [int(v) if integer else float(v) for v in out]


def _boundary_cases() -> list[tuple[str, float]]:
    cases = []
    for key, f in leaf_fields().items():
        if "range" in f.metadata:
            integer = str(f.type).startswith(("int", "list[int]"))
            for value in _outside(f.metadata["range"], integer):
                cases.append((key, [value] if f.metadata.get("list") else value))
    return cases


def test_every_declared_range_is_enforced_naming_the_key() -> None:
    """Every side of every declared range, just outside it: refused naming the key."""
    cases = _boundary_cases()
    assert len(cases) > 50
    for key, value in cases:
        with pytest.raises(ConfigError) as err:
            override(RunConfig(), {key: value})
        assert f"{key}=" in str(err.value) and "out of range" in str(err.value), key


def test_out_of_range_values_are_refused_through_the_tree_before_compute(tmp_path) -> None:
    """A seeded sample of the same cases as command-line overrides of the Hydra tree, through
    sweep.py's preflight (what runs before Hydra starts): one line naming the key and the
    range, nothing written."""
    import random

    from fp8rl.experiments.preflight import preflight

    cases = random.Random(0).sample(_boundary_cases(), 12)
    for key, value in cases:
        text = f"[{value[0]}]" if isinstance(value, list) else str(value)
        with pytest.raises(ConfigError) as err:
            preflight([f"{key}={text}", f"runs_dir={tmp_path / 'runs'}"])
        message = str(err.value)
        assert re.search(rf"{re.escape(key)}=\S+ is out of range: need ", message), message
        assert "\n" not in message
    assert list(tmp_path.iterdir()) == []


def test_calibration_on_one_mini_batch_is_allowed_in_bypass_mode() -> None:
    # with rollout old log-probs every ratio carries the rollout-vs-trainer mismatch, so
    # even the first (only) mini-batch has something to calibrate
    one = {"clipping.mode": "calibrated", "train.ppo_mini_batches": 1}
    bypass = {**one, "train.old_logprob_source": "rollout", "train.tis": False}
    assert override(RunConfig(), bypass).train.ppo_mini_batches == 1
