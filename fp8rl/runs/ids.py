"""Run identity: plain configs, their canonical JSON, and the run id derived from it.

The run id is the first 16 hex digits of SHA-256 over the canonical JSON of
``{"config": <resolved config>, "results_version": RESULTS_VERSION}``. It depends
only on values, never on key order, the process, the machine or Python's
``hash()`` seed. Canonical JSON: keys sorted, no whitespace, tuples as lists,
``-0.0`` as ``0.0``, non-finite floats as ``{"__float__": "nan"|"inf"|"-inf"}``,
every other float by its shortest round-trip ``repr``. Types are part of the
value: ``1`` and ``1.0`` give different ids (a changed type can change what
the code does, so it is never silently treated as the same run).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from typing import Any

# Bump when a code change alters results (a bug fix in a loss, a new default that
# is not in the config). Finished runs of an older version are then reported as
# stale, and re-run only when asked.
RESULTS_VERSION: int = 8
# 2: the run config is the nested RunConfig (fp8rl.config; the Hydra tree's keys), not the
#    flat TrainConfig: every run id changed, and a version-1 run is not found under the
#    new ids (it is neither reused nor reported stale: its config has another shape).
# 3: TorchAO's tensorwise and rowwise Float8Linear run TorchAO's emulated GEMM (FP32 matmul
#    of the dequantised operands) instead of torch._scaled_mm, whose CPU kernel is oneDNN's
#    reference on some CPUs (fp8rl.numerics.recipes): their numbers move by FP32 rounding.
# 4: issue 15. eval.limit takes a sample stratified by difficulty (fp8rl.world.evaluate),
#    not the first items of each file (difficulty order); new keys rollout.difficulties and
#    eval.difficulties. Calibrated Clipping holds a bound where BF16 clips no token (q = 0;
#    p = 0 for the quantile upper rule) and balances the upper bound against the applied
#    lower one; new keys clipping.pool and clipping.min_tail_tokens; in bypass mode
#    (train.old_logprob_source=rollout) the calibrator and fp8rl/shadow/* see the loss's own
#    ratios, mini-batch 0 included.
# 5: issue 31. The verl backend on the CPU computes the tiny backend's numbers: seeded sampler
#    batches (the tiny backend's samples, in draw order), every recipe in the tiny backend's
#    numerics (FP32, BF16 emulated; fsdp_config.fp8rl_emulate) instead of verl's BF16
#    autocast, and a tiny model's blocks the tiny backend's (granularity.block_size null ->
#    4 for tiny-test, not 128). Tiny-backend numbers are unchanged.
# 6: issue 32. The tiny trainer's training forwards (old log-probs, updates, BF16 shadows)
#    run on packed rows without padding (fp8rl.tiny.packing; new key train.packing, false =
#    the padded layout of version 5): FP32/BF16 numbers move by summation order, FP8 ones
#    also because scales no longer see padding tokens.
# 7: issue 46. Every tiny run logs its training score before the DAPO filter
#    (fp8rl/score_unfiltered/mean) beside the filtered one, and the defaults moved to the
#    learning world (study=plain and make reproduce-table2's default size: the shipped slip
#    base, model.sft.noise=0.5): a report never mixes runs of the old and the new world.
# 8: issue 50. MX E8M0 scales follow OCP's rule for every amax: a group whose amax is below
#    1e-12 no longer takes its shared exponent from 1e-12 (TorchAO's amax-rule floor) and
#    flushes to zero (fp8rl.numerics.scaling._e8m0_multipliers). Every committed MX run hit
#    such groups in its first 3 steps (python scripts/e8m0_amax_floor.py: 298 to 5,547 per
#    run, amax down to 8e-17); FP8/BF16/FP16 numbers are unchanged.

RUN_ID_LENGTH = 16

_SCALARS = (str, int, float, bool, type(None))


def to_plain(config: Any) -> dict[str, Any]:
    """A resolved config as nested plain dicts/lists/scalars.

    Accepts a mapping or an OmegaConf ``DictConfig`` (interpolations resolved,
    missing values an error). Raises ``TypeError`` naming the key of anything
    that is not a str-keyed mapping, list, tuple, str, int, float, bool or None.
    """
    config = _from_omegaconf(config)
    if not isinstance(config, Mapping):
        raise TypeError(f"a config must be a mapping, got {type(config).__name__}")
    return _plain(config, "")


def _from_omegaconf(value: Any) -> Any:
    if type(value).__module__.startswith("omegaconf"):
        from omegaconf import OmegaConf  # only when given one

        return OmegaConf.to_container(value, resolve=True, throw_on_missing=True)
    return value


def _plain(value: Any, where: str) -> Any:
    value = _from_omegaconf(value)
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"config key {key!r} at {where or '<root>'} is not a string")
            out[key] = _plain(item, f"{where}.{key}" if where else key)
        return out
    if isinstance(value, list | tuple):
        return [_plain(item, f"{where}[{i}]") for i, item in enumerate(value)]
    if isinstance(value, _SCALARS):
        return value
    if type(value).__module__ == "numpy" and hasattr(value, "item"):
        return _plain(value.item(), where)
    raise TypeError(
        f"config value at {where or '<root>'} has type {type(value).__name__}; "
        "only mappings, lists and str/int/float/bool/None are allowed"
    )


def _canonical(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _canonical(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_canonical(item) for item in value]
    if isinstance(value, float):
        if math.isnan(value):
            return {"__float__": "nan"}
        if math.isinf(value):
            return {"__float__": "inf" if value > 0 else "-inf"}
        if value == 0.0:
            return 0.0  # folds -0.0 into 0.0
    return value


def canonical_json(config: Any) -> str:
    """The canonical JSON text of a config (see the module docstring)."""
    return json.dumps(
        _canonical(to_plain(config)),
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=True,
        allow_nan=False,
    )


def config_sha256(config: Any) -> str:
    """SHA-256 of the canonical config alone (no salt): the same experiment across versions."""
    return hashlib.sha256(canonical_json(config).encode("ascii")).hexdigest()


def run_id_for(config: Any, results_version: int = RESULTS_VERSION) -> str:
    """The run id of a resolved config under a results version (16 hex digits)."""
    payload = {"config": to_plain(config), "results_version": results_version}
    digest = hashlib.sha256(canonical_json(payload).encode("ascii")).hexdigest()
    return digest[:RUN_ID_LENGTH]


def flatten_config(config: Mapping[str, Any], sep: str = ".") -> dict[str, Any]:
    """Nested mappings to one level with dotted keys; lists stay values, ``{}`` stays ``{}``."""
    flat: dict[str, Any] = {}

    def walk(node: Mapping[str, Any], prefix: str) -> None:
        for key, value in node.items():
            name = f"{prefix}{sep}{key}" if prefix else str(key)
            if isinstance(value, Mapping) and value:
                walk(value, name)
            else:
                flat[name] = value

    walk(config, "")
    return flat


def seeds_in(config: Mapping[str, Any]) -> dict[str, Any]:
    """Every seed a config sets: flattened keys named ``seed`` or ending in ``_seed``."""
    return {
        key: value
        for key, value in flatten_config(config).items()
        if key.rsplit(".", 1)[-1] == "seed" or key.endswith("_seed")
    }
