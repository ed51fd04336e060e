#!/bin/bash
python generate_sine_wave.py
python train.py --steps 2
