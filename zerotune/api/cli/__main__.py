"""``python -m zerotune.api.cli``: the same as the ``zerotune`` command."""

from zerotune.api.cli import entry

entry()
