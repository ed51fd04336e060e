#!/bin/bash
#SBATCH --job-name=small_cnn
#SBATCH --time=00:15:00
#SBATCH --cpus-per-task=1
#COLOC model=workloads.py:small_cnn kwarg.classes=10
#COLOC input=1x28x28 batch=64 optimizer=sgd-momentum precision=fp32
# Device benchmark job (issue 8): small_cnn on synthetic data; prints one COLOC_BENCH json line.
# Submit: coloc-sbatch benchmarks/device/job_small_cnn.sh --measure-s 15
# Slurm runs a copy of this script: COLOC_BENCH_DIR names this folder, COLOC_BENCH_PY the Python with torch
# (defaults: the device harness's layout; an OOM rerun is submitted with --export=NONE and gets the defaults).
exec "${COLOC_BENCH_PY:-/opt/torch/.venv/bin/python3}" "${COLOC_BENCH_DIR:-/opt/coloc/src/benchmarks/device}/workloads.py" small_cnn "$@"
