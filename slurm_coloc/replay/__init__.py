"""Trace replay (issue 8, run 5): submit a CARMA/Philly trace through coloc-sbatch, exclusive or collocated,
and measure makespan, job completion time, SM activity, energy and OOM retries."""
