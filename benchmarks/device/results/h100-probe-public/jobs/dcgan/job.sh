#!/bin/bash
python main.py --dataset fake --batchSize 128 --niter 1 --accel --outf out
