"""``granularity.bf16_compute``: the tiny backend's native BF16 GEMMs are an opt-in that
never silently changes a run (another run id, recorded in the config), close to the
emulated run, and refused before any compute on a CPU without native BF16."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

import fp8rl.tiny.settings as settings
from fp8rl.config import ConfigError
from fp8rl.numerics.bf16 import native_bf16_available
from fp8rl.runs import RunStore
from fp8rl.tiny.backend import TinyBackend
from fp8rl.tiny.train import train

from quick_runs import quick

NATIVE = {"granularity.bf16_compute": "native"}


def _step_metrics(path: Path) -> list[dict[str, float]]:
    return [json.loads(line)["data"] for line in (path / "metrics.jsonl").read_text().splitlines()]


def test_native_is_its_own_run_close_to_the_emulated_one(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the numbers do not depend on the CPU check; where it fails the run is only slower
    monkeypatch.setattr(settings, "native_bf16_available", lambda: True)
    store = RunStore(tmp_path / "runs")
    emulated = train(quick(), store, "t", cache_dir=cache)
    native = train(quick(**NATIVE), store, "t", cache_dir=cache)
    assert emulated.status == native.status == "done"
    assert emulated.run_id != native.run_id
    for summary, compute in ((emulated, "emulated"), (native, "native")):
        config = yaml.safe_load((summary.path / "config.yaml").read_text())
        assert config["granularity"]["bf16_compute"] == compute
    # Step 1 samples from the same SFT base with the same seeds; the two precisions differ
    # only where a GEMM output's FP32 accumulation lands on the other side of a BF16
    # rounding boundary (one BF16 ulp, rare: tests/numerics/test_native_bf16.py), so the
    # step-1 tokens, scores and lengths are the same and the entropy agrees to ~1e-5.
    # The gradient norm is looser by nature: GRPO advantages sum to zero in each group, so
    # the policy gradient is a difference of nearly equal sums and ulp-level differences in
    # the per-token terms survive the cancellation; the second mini-batch then starts from an
    # Adam step, whose first update is about lr * sign(g) and flips with tiny components.
    # Measured (emulated vs native grad_norm): 1.4560 vs 1.4505 (0.4%) on an Intel Xeon with
    # AMX, 1.4303 vs 1.4493 (1.3%) on CI's machine, whose SFT base also differs slightly.
    # The bounds below leave ~2x room over the worst measured; a native path that rounded
    # or accumulated on another grid than the emulation's would move the entropy first.
    e, n = _step_metrics(emulated.path)[0], _step_metrics(native.path)[0]
    assert n["critic/score/mean"] == e["critic/score/mean"]  # the same rollout
    assert n["response_length/mean"] == e["response_length/mean"]
    assert n["actor/entropy"] == pytest.approx(e["actor/entropy"], rel=1e-4)
    assert n["actor/pg_loss"] == pytest.approx(e["actor/pg_loss"], abs=5e-3)
    assert n["actor/grad_norm"] == pytest.approx(e["actor/grad_norm"], rel=3e-2)


def test_native_on_a_cpu_without_native_bf16_is_a_one_line_config_error(monkeypatch) -> None:
    monkeypatch.setattr(settings, "native_bf16_available", lambda: False)
    with pytest.raises(ConfigError) as err:
        TinyBackend().resolve(quick(**NATIVE))
    message = str(err.value)
    assert "\n" not in message
    assert "granularity.bf16_compute=native" in message and "avx512_bf16" in message
    assert "granularity.bf16_compute=emulated" in message  # the fix
    assert TinyBackend().resolve(quick()).config.granularity.bf16_compute == "emulated"


def test_the_cpu_check_reads_the_cpuinfo_flags(tmp_path: Path) -> None:
    for flags, expected in (("fpu avx512f avx512_bf16", True), ("fpu amx_tile amx_bf16", True),
                            ("fpu avx2 avx512f", False)):  # fmt: skip
        cpuinfo = tmp_path / f"cpuinfo-{expected}-{len(flags)}"
        cpuinfo.write_text(f"processor\t: 0\nflags\t\t: {flags}\nbogomips\t: 4000\n")
        assert native_bf16_available(str(cpuinfo)) is expected
    assert native_bf16_available(str(tmp_path / "missing")) is False
