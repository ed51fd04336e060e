#!/bin/bash
#SBATCH --job-name=resnet50_224
#SBATCH --time=00:15:00
#SBATCH --cpus-per-task=1
#COLOC model=workloads.py:resnet50 kwarg.classes=1000
#COLOC input=3x224x224 batch=32 optimizer=sgd-momentum precision=fp32
# Device benchmark job (issue 8): resnet50_224 on synthetic data; prints one COLOC_BENCH json line.
# Submit: coloc-sbatch benchmarks/device/job_resnet50_224.sh --measure-s 15
# Slurm runs a copy of this script: COLOC_BENCH_DIR names this folder, COLOC_BENCH_PY the Python with torch.
exec "${COLOC_BENCH_PY:-python3}" "${COLOC_BENCH_DIR:-$SLURM_SUBMIT_DIR}/workloads.py" resnet50_224 "$@"
