"""What the test files share: the repository root, PostgreSQL databases made and dropped for a test, and
real torchrun jobs under a hard timeout (``postgres``, ``ranks``)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
"""The repository's root (the checkout under test)."""
