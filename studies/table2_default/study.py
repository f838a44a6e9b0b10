"""The default size before issue 28 (`make reproduce-table2 MEDIUM=1`): BF16 and the three
granularities x standard and CC plus the FP8-rollout row, one seed, 50 RL steps on the
600-step base. Its committed runs are of results version 4. No claim is decided here.
"""

from fp8rl.analysis.reproduce import plan_table2
from fp8rl.study import Study

PLAN = plan_table2("medium")

STUDY = Study(
    name="table2_default",
    title="Table 2 at tiny scale (medium)",
    experiment="table2_default",
    grids=PLAN.sweep_grids,
    writer="table2",
    results_version=4,
    options={"commands": tuple(PLAN.commands)},
)
