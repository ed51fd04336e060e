#!/bin/bash
#SBATCH --job-name=writer
#SBATCH --gres=gpu:1
python train.py --run-dir runs/exp1 --batch-size 64
