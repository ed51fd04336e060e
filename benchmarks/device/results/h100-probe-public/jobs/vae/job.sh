#!/bin/bash
python main.py --epochs 1
