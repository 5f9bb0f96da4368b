"""Where the engine meets the outside: lm-eval's ``specdec`` model and its start-up hook (``lm_eval_model``,
``lm_eval_hook``), ``draft=auto`` and ``zoo recommend`` from published results (``recommend``), vLLM's
speculative config and counters (``serving``) and the tasks' offline data (``offline_data``). The top layer of
the library: nothing in ``specdraft_eval`` imports it back (``zoo`` and ``tasks`` sit above)."""
