#!/bin/bash
#SBATCH --job-name=resnet18-cifar
#SBATCH --time=00:20:00
#SBATCH --gpus=1
#COLOC model=torchvision.models:resnet18 kwarg.num_classes=10
#COLOC input=3x32x32 batch=128 optimizer=sgd-momentum precision=fp32
# torchvision's ResNet-18 on 32x32 inputs. The '#SBATCH --gpus=1' above is translated by coloc-sbatch into
# a shard request sized by the estimate (docs/user.md, "How your GPU request is translated").
EXAMPLES=${COLOC_EXAMPLES:-$SLURM_SUBMIT_DIR/examples}
exec "${PYTHON:-python3}" "$EXAMPLES/train_resnet_cifar.py" "$@"
