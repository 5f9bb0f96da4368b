"""Results: what a run leaves behind and what the zoo, the leaderboard and ``draft=auto`` read back. The results
record and its files (``record``), this machine's results store (``store``), latency profiles and calibrations
(``profiles``) and the printed table (``report``).

Imports the foundation and :mod:`specdraft_eval.measure` (the counters a record holds): one module owns each
schema, writes atomically and reads with a version check."""
