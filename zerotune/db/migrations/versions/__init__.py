"""Hand-written revisions, one file each, named ``NNNN_<what>.py``."""
