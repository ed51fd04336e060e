"""Benchmarks, research and calibration scripts (not installed; docs/benchmarks.md).

Run them from the repository root as modules, ``.venv/bin/python -m benchmarks.<module>``, so they import
each other and ``slurm_coloc`` as packages. Files a Slurm job or the estimator runs by path
(``device/workloads.py``, ``device/diag_jobs.py``, ``device/honest_oom.py``, ``device/hostile_client.py``,
``estimator/zoo.py``, the corpus jobs) import only the standard library, torch and ``slurm_coloc`` at the top.
"""
