"""fp8rl: full-pipeline FP8 RL reproduction harness."""

from fp8rl import _quiet

# First thing on any fp8rl import, before torchao can be imported by anything (fp8rl.numerics,
# or transformers' quantizer registry): two import-time log lines that read like breakage.
_quiet.install()
