#!/bin/bash
#SBATCH --job-name=digits-cnn
#SBATCH --time=00:10:00
#SBATCH --cpus-per-task=1
#COLOC model=train_digits.py:DigitsCNN kwarg.channels=32
#COLOC input=1x8x8 batch=64 optimizer=adam precision=fp32
# A small CNN on scikit-learn's real handwritten digits; coloc-sbatch estimates its GPU memory from the
# #COLOC lines above (the model path is relative to this script) and asks for that many 1 GiB shards.
# Submit:  coloc-sbatch examples/train_digits.sh
# PYTHON may name the interpreter with torch (default: python3 on the submitter's PATH).
# Slurm runs a copy of this script, so the example's directory comes from COLOC_EXAMPLES or the submit dir.
EXAMPLES=${COLOC_EXAMPLES:-$SLURM_SUBMIT_DIR/examples}
exec "${PYTHON:-python3}" "$EXAMPLES/train_digits.py" "$@"
