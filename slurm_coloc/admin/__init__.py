"""``coloc-admin``: checks that a node and the cluster config are set up for slurm-coloc."""
