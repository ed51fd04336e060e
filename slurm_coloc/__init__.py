"""slurm-coloc: pack small deep-learning training jobs onto shared GPUs under Slurm.

See README.md for the quick start and docs/design.md for the layout.
"""
__version__ = "0.1.0"
__all__ = ["__version__"]
