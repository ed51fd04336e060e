#!/bin/bash
#SBATCH --job-name=resnet18_32
#SBATCH --time=00:15:00
#SBATCH --cpus-per-task=1
#COLOC model=workloads.py:resnet18 kwarg.classes=10
#COLOC input=3x32x32 batch=32 optimizer=sgd-momentum precision=fp32
# Device benchmark job (issue 8): resnet18_32 on synthetic data; prints one COLOC_BENCH json line.
# Submit: coloc-sbatch benchmarks/device/job_resnet18_32.sh --measure-s 15
# Slurm runs a copy of this script: COLOC_BENCH_DIR names this folder, COLOC_BENCH_PY the Python with torch
# (defaults: the device harness's layout; an OOM rerun is submitted with --export=NONE and gets the defaults).
exec "${COLOC_BENCH_PY:-/opt/torch/.venv/bin/python3}" "${COLOC_BENCH_DIR:-/opt/coloc/src/benchmarks/device}/workloads.py" resnet18_32 "$@"
