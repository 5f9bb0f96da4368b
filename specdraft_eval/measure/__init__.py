"""Measurement while decoding: generation counters and their derived figures (``stats``), the paper's analytical
model (``analytical``), the device and package facts a record carries (``environment``) and the one clock with its
timers (``timers``).

Imports only the foundation (``specdraft_eval.errors``, ``files``, ``published``): the engine counts into these,
and the results files (:mod:`specdraft_eval.results`) are made of them; nothing here runs a model."""
