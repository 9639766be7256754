"""zerotune: picks the partition strategy (ZeRO-3, ZeRO++, MiCS, 3-level) for sharded LLM training.

One import name for the whole project. Its parts live at the top of the repository and are installed
under this package:

- ``zerotune.strategies`` — the specs (model, cluster, strategy), the cost model and the trainer;
- ``zerotune.tuner`` — the Optuna search, the executors that run short trials, the exports;
- ``zerotune.db`` — the tables and every query on them;
- ``zerotune.api`` — the HTTP service, the dashboard, the CLI and the prologue client.

``docs/architecture.md`` is the map. This module imports nothing: the prologue client, which runs in
training environments, pays for what it uses only.
"""

__version__ = "0.1.0"
