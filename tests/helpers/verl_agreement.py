"""The backend-agreement assertions shared by tests/verl_ext/test_backend_agreement.py, the
verl-on-CPU CI arm (tests/verl_ext/test_cpu_e2e.py) and the two-rank test
(tests/verl_ext/test_two_ranks.py), and their one-run helper."""

from __future__ import annotations

from pathlib import Path

from fp8rl.verl_ext.agreement import compare_runs, failures


def run_dir(tmp_path: Path, name: str, *overrides: str) -> Path:
    """One ``sweep.py`` run into the store ``tmp_path/name``; its run directory."""
    from sweep_cli import sweep

    runs = tmp_path / name
    out = sweep(tmp_path, *overrides, f"runs_dir={runs}", timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    (found,) = (runs / "test").glob("[0-9a-f]" * 16)
    return found


def assert_agree(tiny: Path, verl: Path) -> None:
    """Step 1 of the two runs agrees (every check of ``compare_runs``), samples included."""
    checks = compare_runs(tiny, verl)
    report = "\n".join(f"{'ok ' if c.ok else 'BAD'} {c.name}: {c.detail}" for c in checks)
    assert not failures(checks), report
    assert any(c.name == "samples: response_ids" and c.ok for c in checks)


def assert_control_fails(control: Path, verl: Path, blockwise: bool) -> None:
    """``eps_low`` 0.01 wider on the tiny side only: the bounds in force differ (exact
    checks), and - except under blockwise FP8, whose update noise on the tiny model's 4-wide
    blocks is as large as the change (docs/verl_backend.md) - the ratios after the update."""
    failed = {c.name for c in failures(compare_runs(control, verl))}
    assert {"dump clip_low", "fp8rl/clip_low"} <= failed, failed
    assert blockwise or "per-token ratio" in failed, failed
    assert "samples: response_ids" not in failed  # step 1 samples before any update
