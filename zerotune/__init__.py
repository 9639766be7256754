"""zerotune: picks the partition strategy (ZeRO-3, ZeRO++, MiCS, 3-level) for sharded LLM training.

One import name for the whole project, in layers that import only downwards:

- ``zerotune.core`` — pure values: the specs (model, cluster, strategy), rank coordinates, bucket plans, volumes;
- ``zerotune.costmodel`` — the cost model, its calibrations and the presets (standard library only, no torch);
- ``zerotune.trainer`` — the built-in hierarchical ZeRO trainer (torch);
- ``zerotune.db`` — the tables and every query on them;
- ``zerotune.tuner`` — the Optuna search, the executors that run short trials, the exports;
- ``zerotune.api`` — the HTTP service, the dashboard, the CLI and the prologue client.

``docs/architecture.md`` is the map. This module imports nothing: the prologue client, which runs in
training environments, pays for what it uses only.
"""

__version__ = "0.1.0"
