#!/bin/bash
#SBATCH --job-name=waiter
#SBATCH --gres=gpu:1
python train.py --ready-file data/READY
