#!/bin/bash
#SBATCH --job-name=hf-clm
#SBATCH --gres=gpu:1
#SBATCH --cpus-per-task=8
#SBATCH --time=12:00:00
export HF_HOME=$SLURM_SUBMIT_DIR/hf_home
python run_clm.py \
    --config_name ./gpt2-small \
    --block_size 512 \
    --per_device_train_batch_size 8 \
    --gradient_accumulation_steps 4 \
    --learning_rate 5e-4 \
    --fp16 \
    --save_steps 500 \
    --output_dir out/clm "$@"
