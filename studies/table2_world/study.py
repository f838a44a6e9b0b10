"""The default size of `make reproduce-table2`: the paper's six Table-2 rows, one seed,
30 RL steps on the learning world (issue 46). No claim is decided here.
"""

from fp8rl.analysis.reproduce import plan_table2
from fp8rl.study import Study

PLAN = plan_table2("default")

STUDY = Study(
    name="table2_world",
    title="Table 2 at tiny scale (default)",
    experiment="table2_world",
    grids=PLAN.sweep_grids,
    writer="table2",
    options={"commands": tuple(PLAN.commands), "item_intervals": True},
)
