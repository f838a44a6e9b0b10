"""The BF16 setup search for the Table-2 study (issue 15, step 1): BF16 pilots that change one
lever each, to choose the study's learning rate and base; every configuration tried is in
its table (docs/study/search.md). Its runs are of results version 4; the slowest arm's
budget check is experiment study_budget.
"""

from fp8rl.study import Study

STUDY = Study(
    name="bf16_search",
    title="The BF16 setup search: every configuration tried",
    experiment="bf16_search",
    grids=(
        ("+sweep=bf16_search",),
        ("+sweep=bf16_search", "train.lr=1e-4", "model.sft.steps=600"),
        (
            "+sweep=bf16_search",
            "train.lr=1e-4",
            "rollout.difficulties=[3]",
            "eval.difficulties=[1,2,3]",
        ),
    ),
    protocol="docs/study/search_protocol.md",
    writer="bf16_search",
    results_version=4,
    report_dir="docs/study",
)
