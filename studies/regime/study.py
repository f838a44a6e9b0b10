"""The regime study (docs/regime.md, pre-registered there): where does FP8 noise start to
distort negative-advantage clipping, and does Calibrated Clipping undo it? FP8 with the BF16
shadow on every step, eps x granularity x old-log-prob source x clipping, two seeds; its
noise probes are the grid ``+sweep=regime_noise``. Its runs are not in results/: the report
is written from a run store (``--source runs``).
"""

from fp8rl.study import Study

STUDY = Study(
    name="regime",
    title="The regime study: where FP8 starts to distort negative-advantage clipping",
    experiment="regime",
    grids=(("+sweep=regime",),),
    protocol="docs/regime.md",
    writer="regime",
    endpoints=("clip_gap",),
    options={"period": 5},
)
