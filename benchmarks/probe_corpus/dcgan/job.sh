#!/bin/bash
#SBATCH --job-name=dcgan
#SBATCH --gres=gpu:1
#SBATCH --cpus-per-task=4
BATCH=128
python3 main.py --batchSize $BATCH --niter 1 "$@"
