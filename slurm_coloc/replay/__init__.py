"""Trace replay: submit a CARMA/Philly trace through coloc-sbatch, exclusive or collocated,
and measure makespan, job completion time, SM activity, energy and OOM retries."""
