"""Measuring drafts on this machine and predicting them elsewhere: ``zoo bench``, ``zoo compare`` (``engines``),
``zoo profile`` (``timing``), ``zoo validate``, ``zoo tune``, ``zoo rank`` (``ranking_run``, ``latency_model``,
``shapes``, ``paper``), and what they load (``loading``, ``prompts``)."""
