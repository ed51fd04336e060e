#!/bin/bash
#SBATCH --job-name=pl-cifar
#SBATCH --gres=gpu:1
#SBATCH --cpus-per-task=8
#SBATCH --time=04:00:00
source ~/.bashrc 2>/dev/null || true
python train.py --batch_size 256 --precision 16-mixed "$@"
