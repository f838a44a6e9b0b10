"""The fixed-bounds control beside the Table-2 study (issue 33 part 2): each FP8 granularity
with standard clipping at the bounds Calibrated Clipping reached there on average in
results/table2 (+fixed_bounds=cc_<granularity>, written by scripts/cc_bounds.py), seeds
0-3, the study's scale model. Compared with g FP8 + CC, it separates targeting the tokens
BF16 keeps from widening the trust region. Not run yet; no protocol of its own (the
frontier protocol's "Related control" section says why), so it decides no claim.
"""

from fp8rl.study import Study

STUDY = Study(
    name="table2_fixed_bounds",
    title="The fixed-bounds control at the Table-2 setting",
    experiment="table2_fixed_bounds",
    grids=(("+experiment=table2_fixed_bounds",),),
    endpoints=("final", "peak", "gain", "clip_gap"),
)
