#!/bin/bash
#SBATCH --time=00:15:00
#SBATCH --cpus-per-task=1
# Device benchmark job without #COLOC model lines (trace replay, OOM offender): the memory request comes from
# --coloc-mem or --exclusive-gpu on the coloc-sbatch command line. Args: <workload> [workloads.py options].
exec "${COLOC_BENCH_PY:-/opt/torch/.venv/bin/python3}" "${COLOC_BENCH_DIR:-/opt/coloc/src/benchmarks/device}/workloads.py" "$@"
