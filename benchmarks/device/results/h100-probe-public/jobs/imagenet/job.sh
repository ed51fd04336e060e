#!/bin/bash
#SBATCH -J imagenet
#SBATCH --gres=gpu:1
python main.py --dummy -a resnet50 -b 256 --epochs 1
