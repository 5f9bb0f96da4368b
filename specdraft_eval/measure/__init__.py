"""Measurement: generation counters and their derived figures (``stats``), the paper's analytical model
(``analytical``), the device and package facts a record carries (``environment``), the results block and its
files (``record``), latency profiles and calibrations (``profiles``) and the printed table (``report``).

Imports only the foundation (``specdraft_eval.errors``, ``files``, ``published``): everything above reads these
values, nothing here runs a model."""
