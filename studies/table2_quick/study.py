"""The Table-2 pipeline check: the test preset (a 30-step SFT base that answers nothing,
2 RL steps), every arm, one seed. Its numbers mean nothing; its results and report stay
under runs/ (not in git).
"""

from fp8rl.analysis.reproduce import plan_table2
from fp8rl.study import Study

PLAN = plan_table2("quick")

STUDY = Study(
    name="table2_quick",
    title="Table 2 at tiny scale (quick)",
    experiment="table2_quick",
    grids=PLAN.sweep_grids,
    writer="table2",
    report_dir="runs/reports/table2_quick",
    options={"commands": tuple(PLAN.commands)},
)
