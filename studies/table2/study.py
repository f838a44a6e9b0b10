"""The pre-registered Table-2 study (`make reproduce-table2 FULL=1`, issue 15): eleven arms x
four seeds, its protocol committed before its first run. Its committed runs are of
results version 4; its findings: docs/study/findings.md.
"""

from fp8rl.analysis.reproduce import plan_table2
from fp8rl.study import Study

PLAN = plan_table2("full")

STUDY = Study(
    name="table2",
    title="Table 2 at tiny scale: the pre-registered study (full)",
    experiment="table2",
    grids=PLAN.sweep_grids,
    protocol="docs/study/table2_protocol.md",
    writer="table2",
    results_version=4,
    options={"commands": tuple(PLAN.commands), "preregistered": True},
)
