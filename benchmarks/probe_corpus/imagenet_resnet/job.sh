#!/bin/bash
#SBATCH -J imagenet
#SBATCH --gres=gpu:1
#SBATCH -c 8
#SBATCH -t 2:00:00
srun python main.py -a resnet50 -b 256 "$@"
