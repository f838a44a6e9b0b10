"""The stability-frontier pilot (issue 33, docs/study/frontier_protocol.md): BF16 and plain
E4M3 at three learning rates, two sampling temperatures and two SFT bases, the MX dose
formats at the centre, two pilot seeds, read at 100 and 200 steps. Its failure thresholds
come from its own BF16 reference runs (the Table-2 study's four BF16 seeds, the BF16
search's lr 3e-5, 5e-5 and 1e-4 runs), never from the pilot; its rule picks the study's
regime (rule.py). Findings: docs/study/frontier_findings.md.
"""

from fp8rl.analysis.thresholds import Reference
from fp8rl.study import Study

from .rule import PilotDesign, Setting, read_pilot

CENTRE = Setting(1.7e-4, 1.0, 1200)
LEVERS = ("lr", "dose", "temperature", "base")

STUDY = Study(
    name="frontier_pilot",
    title="The stability-frontier pilot (issue 33): runs, failure endpoints, the regime",
    experiment="frontier_pilot",
    grids=tuple((f"+experiment=frontier_pilot_{lever}",) for lever in LEVERS),
    protocol="docs/study/frontier_protocol.md",
    writer="frontier_pilot",
    endpoints=("surge", "garbled", "drawdown", "clip_gap"),
    results_version=6,  # every pilot run and BF16 reference ran under version 6
    options={
        "rule": read_pilot,
        "design": PilotDesign(
            centre=CENTRE,
            # lever 1's learning rates at the centre's T and base, lever 3's other levels
            settings=(
                Setting(1e-4, 1.0, 1200),
                CENTRE,
                Setting(3e-4, 1.0, 1200),
                Setting(1.7e-4, 1.2, 1200),
                Setting(1.7e-4, 1.0, 900),
            ),
            lengths=(100, 200),
            seeds=(100, 101),
            eval_every=20,
            baseline="BF16",
            plain="Rowwise FP8",  # "plain E4M3": rowwise FP8 training and channel rollout
            dose=("MXFP8", "MXFP6 E3M2", "MXFP4"),  # E4M3, E3M2, E2M1 in MX 1 x 32 groups
            gentlest_check="MXFP4",
            table2_temperature=1.0,
            table2_sft_steps=1200,
            cap_hours=30.0,  # "The pilot's compute, estimated and capped"
            workers=2,
        ),
        # "The reference": BF16 on the 1200-step base, difficulties 1-3, lr <= the pilot's lowest
        "reference": Reference(
            sft_steps=1200,
            difficulties=(1, 2, 3),
            max_lr=1e-4,
            where='docs/study/frontier_protocol.md, "The reference"',
        ),
        "reference_runs": {
            "table2": (
                "3685ed8ec68d10a3",
                "68dfff03f32871fd",
                "76137b1f08156d6a",
                "3e9144609ee95602",
            ),
            "bf16_search": ("8264001c5735b35e", "9f83076ec3ae9da6", "0be94586780039af"),
        },
        "responses": 1200 * 4,  # held-out responses of one evaluation: 1,200 items x 4
        "commands": (
            *(
                f"python sweep.py +experiment=frontier_pilot_{lever} hydra/launcher=parallel"
                for lever in LEVERS
            ),
            'make frontier-pilot-report ARGS="--export-from runs"',
        ),
    },
)
