"""Models as values: names to files and loaded targets (``targets``: :class:`~specdraft_eval.models.targets.Target`,
``LoadSettings``), CPU linear kernels (``kernels``) and where a causal LM keeps its decoder layers
(``structure``). Imports only the foundation."""
