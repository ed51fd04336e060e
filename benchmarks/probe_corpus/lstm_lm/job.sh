#!/bin/bash
#SBATCH --job-name=wlm
#SBATCH --gpus=1
#SBATCH --time=04:00:00
module load python 2>/dev/null || true
python main.py --cuda --emsize 650 --nhid 650 --batch_size 64 --bptt 70 "$@"
