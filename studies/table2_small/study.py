"""The default size before issue 46 (`make reproduce-table2 SMALL=1`): the six Table-2 rows,
one seed, 10 RL steps on the clean 1200-step base. Its committed runs are of results
version 4. No claim is decided here.
"""

from fp8rl.analysis.reproduce import plan_table2
from fp8rl.study import Study

PLAN = plan_table2("small")

STUDY = Study(
    name="table2_small",
    title="Table 2 at tiny scale (small)",
    experiment="table2_small",
    grids=PLAN.sweep_grids,
    writer="table2",
    results_version=4,
    options={"commands": tuple(PLAN.commands)},
)
