#!/bin/bash
#SBATCH --job-name=mnist
#SBATCH --gres=gpu:1
#SBATCH --time=00:30:00
#SBATCH --cpus-per-task=4

module load cuda 2>/dev/null || true
cd "$SLURM_SUBMIT_DIR"
python train.py --batch-size 128 --epochs 1 "$@"
