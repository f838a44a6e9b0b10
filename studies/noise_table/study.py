"""The noise table: the std of the two log-ratio noises (rollout vs trainer, the TIS side;
training recipe vs its BF16 shadow, the Calibrated-Clipping side) per precision recipe, on
the Table-2 study's 1200-step SFT base, no training (``task=noise_probe``). Its probes chose
the Table-2 study's eps (0.08) and its control granularity (docs/study/table2_protocol.md,
"eps"); they are of results version 4 and precede that protocol: a measurement, not a
pre-registered study.
"""

from fp8rl.study import Study

SIZE = ("model.sft.steps=1200", "experiment_name=noise_table_study")

STUDY = Study(
    name="noise_table",
    title="The noise table: log-ratio noise per precision recipe on the SFT base",
    experiment="noise_table_study",
    grids=(("+sweep=noise_table", *SIZE), ("+sweep=noise_table_fp8_rollout", *SIZE)),
    writer="noise_table",
    results_version=4,
)
