"""fp8rl.rl.settings: the RL room's option lists and Calibrated Clipping's knobs load
without torch (the run config, and with it the CLI's schema, is built from them), and each
list is what its implementing module implements."""

from __future__ import annotations

import subprocess
import sys

import fp8rl.rl as rl
from fp8rl.rl import calibration, losses, settings

from room_rules import REPO


def test_the_settings_load_no_torch() -> None:
    code = (
        "import sys\n"
        "import fp8rl.rl.settings as s\n"
        "s.CalibratorConfig.of(s.CalibrationKnobs(period=10), eps_low=0.2, eps_high=0.28)\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'numpy'}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


def test_the_loss_names_are_the_loss_registry() -> None:
    assert settings.POLICY_LOSS_NAMES == tuple(losses.POLICY_LOSSES)
    assert set(settings.LIVE_BOUND_LOSSES) < set(losses.POLICY_LOSSES)


def test_the_implementing_modules_re_export_the_same_objects() -> None:
    assert calibration.CalibratorConfig is settings.CalibratorConfig is rl.CalibratorConfig
    assert calibration.CalibrationKnobs is settings.CalibrationKnobs is rl.CalibrationKnobs
    assert losses.LIVE_BOUND_LOSSES is settings.LIVE_BOUND_LOSSES is rl.LIVE_BOUND_LOSSES
    assert calibration.CLIPPING_MODES is settings.CLIPPING_MODES
    # the package's names load on first use, each from the module that defines it
    assert rl.Calibrator is calibration.Calibrator
    for name in rl.__all__:
        assert getattr(rl, name) is not None, name
