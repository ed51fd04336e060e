#!/bin/bash
#SBATCH -J convnext
#SBATCH --gpus=1
#SBATCH -t 1-00:00:00
MODEL=${MODEL:-convnext_tiny}
python train.py --model $MODEL --amp -b 64 "$@"
