#!/bin/bash
# A job that behaves like a training script with a GPU memory need of NEED_GIB (first argument, default 8):
# with fewer shards than that (1 shard = 1 GiB of the GPU) it dies the way PyTorch does on a CUDA OOM: the
# real torch.OutOfMemoryError traceback text (format of c10/cuda/CUDACachingAllocator.cpp, PyTorch 2.14) on
# stderr, exit 1. With enough shards (e.g. the whole-GPU rerun slurm-coloc submits) it "trains" and exits 0.
# No GPU is touched, so it runs on the CI cluster's fake GPUs.  Usage: sbatch --gres=shard:4 oom_job.sh 8
#SBATCH --job-name=oom-demo
need=${1:-8}
have=${SLURM_SHARDS_ON_NODE:-0}
echo "attempt on $(hostname) job ${SLURM_JOB_ID}: ${have} GiB of GPU ${CUDA_VISIBLE_DEVICES:-?}, need ${need} GiB"
if [ "$have" -lt "$need" ]; then
  cat >&2 <<MSG
Traceback (most recent call last):
  File "/home/user/train.py", line 57, in <module>
    loss.backward()
  File "/usr/lib/python3/dist-packages/torch/_tensor.py", line 647, in backward
    torch.autograd.backward(
  File "/usr/lib/python3/dist-packages/torch/autograd/graph.py", line 829, in _engine_run_backward
    return Variable._execution_engine.run_backward(  # Calls into the C++ engine to run the backward pass
           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.18 GiB of which 1.62 GiB is free. Including non-PyTorch memory, this process has ${have}.00 GiB memory in use. Of the allocated memory $((have > 0 ? have - 1 : 0)).02 GiB is allocated by PyTorch, and 7.50 MiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  (https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)
MSG
  exit 1
fi
echo "trained 10 steps with ${have} GiB"
