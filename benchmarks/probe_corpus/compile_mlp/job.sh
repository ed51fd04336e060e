#!/bin/bash
#SBATCH --job-name=mlp-compile
#SBATCH --gres=gpu:1
srun python train.py --width 4096 --depth 8 --batch-size 2048
