"""The learning-world search (issue 46, part 3): a BF16-only search for a tiny world where
GRPO gains at least 15 points of held-out mean@4 by step 300 and keeps them over 600 steps.

Stage A screens the candidates (one seed, 300 steps); stage B confirms the one that passed
(three seeds, 600 steps). Its criterion and report: fp8rl.analysis.learning_world.
"""

from fp8rl.study import Study

STUDY = Study(
    name="learning_world",
    title="The learning-world search (issue 46, part 3)",
    experiment="learning_world",
    grids=(
        ("+experiment=learning_world_screen",),
        ("+experiment=learning_world_confirm", "model.sft.noise=0.5", "train.lr=3.0e-05"),
    ),
    protocol="docs/study/learning_world_protocol.md",
    writer="learning_world",
    endpoints=("final", "peak", "gain", "drawdown"),
    results_version=6,  # the runs' version (the world's defaults moved in version 7)
)
