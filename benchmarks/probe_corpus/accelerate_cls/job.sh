#!/bin/bash
#SBATCH --job-name=acc-vit
#SBATCH --gres=gpu:1
#SBATCH --cpus-per-task=8
#SBATCH --time=08:00:00
export OMP_NUM_THREADS=8
accelerate launch --num_processes 1 --mixed_precision bf16 train.py \
    --model vit_b_16 --batch_size 64 --output_dir ckpt "$@"
