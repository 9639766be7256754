"""A throwaway one-node Slurm cluster on this machine for the Slurm executor tests (see cluster.py)."""
