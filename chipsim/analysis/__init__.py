"""What a user reads: tables and result files (report), sweeps (sweep), experiments and the paper reproduction
(experiments, reproduction), figures (plots), Perfetto timelines (timeline) and `run --profile` (profile)."""
