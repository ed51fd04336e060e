#!/bin/bash
#SBATCH --time=00:15:00
#SBATCH --cpus-per-task=1
# Device benchmark job without #COLOC model lines (trace replay, OOM offender): the memory request comes from
# --coloc-mem or --exclusive-gpu on the coloc-sbatch command line. Args: <workload> [workloads.py options].
exec "${COLOC_BENCH_PY:-python3}" "${COLOC_BENCH_DIR:-$SLURM_SUBMIT_DIR}/workloads.py" "$@"
