"""Utilization-aware placement of shared GPU jobs (coloc-placer): policy, intensity prediction, the loop."""
