"""One method at two scales: the tiny and the verl backend on one config, step 1 compared,
per arm (BF16, rowwise FP8, blockwise FP8 with Calibrated Clipping calibrating at step 1),
with a negative control that must fail and the layout noise floor of each recipe
(fp8rl.verl_ext.agreement; docs/verl_backend.md, "One method at two scales"). Its checks
read the runs' checkpoints, which results/ does not keep: scripts/verl_agreement.py (this
study's runner) measures each arm from the full runs and stores the measurement beside the
arm's compact results (results/verl_agreement/<arm>/agreement.json); the report reads those.
"""

from fp8rl.study import Study
from fp8rl.verl_ext.agreement import ARMS, COMMON, CONTROL, VERL

STUDY = Study(
    name="verl_agreement",
    title="One method at two scales: the tiny and the verl backend, step 1",
    experiment="test",
    grids=tuple((*COMMON, *ARMS[arm], *side) for arm in ARMS for side in ((), CONTROL, VERL)),
    writer="verl_agreement",
    options={"runner": ("scripts/verl_agreement.py",)},
)
