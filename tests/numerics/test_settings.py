"""fp8rl.numerics.settings: the numerics options the run config offers, without torch;
the implementing modules re-export the same objects."""

from __future__ import annotations

import subprocess
import sys

from fp8rl.numerics import bf16, linears, rollout, settings

from room_rules import REPO


def test_the_settings_load_no_torch() -> None:
    code = (
        "import sys\n"
        "import fp8rl.numerics.settings as s\n"
        "c = s.RolloutQuantConfig(weight_scale='block', block_size=4)\n"
        "assert c.activation_block() == (1, 4) and c.to_dict()['fmt'] == 'e4m3'\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'torchao'}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


def test_the_implementing_modules_re_export_the_same_objects() -> None:
    assert rollout.RolloutQuantConfig is settings.RolloutQuantConfig
    assert linears.BF16_COMPUTE is settings.BF16_COMPUTE
    assert bf16.native_bf16_available is settings.native_bf16_available
