"""The tiny trainer's first look (docs/tiny_trainer.md): does BF16 RL beat SFT (BF16, seeds
0-3), does every recipe run (one run per precision recipe), does the FP8 rollout with BF16
training run, does Calibrated Clipping bring FP8's clipping back to BF16's (blockwise,
standard vs calibrated)? Its calibration check's verdict is fp8rl.analysis.first_look's
(python scripts/first_look.py prints every table); this declaration plans and runs its
sweeps and gives their endpoints per arm.
"""

from fp8rl.study import Study

STUDY = Study(
    name="first_look",
    title="The tiny trainer's first look",
    experiment="first_look",
    grids=(
        ("+sweep=first_look_improvement",),
        ("+sweep=first_look_recipes",),
        ("+sweep=first_look_fp8_rollout",),
        ("+sweep=first_look_calibration",),
    ),
    protocol="sweeps/sweep/first_look/protocol.yaml",
    endpoints=("final", "gain", "clip_gap"),
)
