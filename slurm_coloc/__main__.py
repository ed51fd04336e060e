"""``python -m slurm_coloc`` runs ``coloc-sbatch``'s sibling group ``coloc``."""
from slurm_coloc.cli.main import main

if __name__ == "__main__":
    main()
