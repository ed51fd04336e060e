#!/bin/bash
#SBATCH --job-name=glue
#SBATCH --gres=gpu:1
#SBATCH --mem=32G
export TASK=sst2
python run_glue.py \
  --max_seq_length 128 \
  --per_device_train_batch_size 32 \
  --max_steps 100 \
  --fp16 \
  --output_dir out/$TASK
