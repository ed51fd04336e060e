#!/bin/bash
python main.py --accel --epochs 1 --model LSTM --emsize 650 --nhid 650 --dropout 0.5
