"""fp8rl: full-pipeline FP8 RL reproduction harness."""
