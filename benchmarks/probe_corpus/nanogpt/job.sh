#!/bin/bash
#SBATCH --job-name=gpt
#SBATCH --gres=gpu:1
#SBATCH --time=12:00:00
python train.py --batch_size=12 --gradient_accumulation_steps=5 --max_iters=20 "$@"
