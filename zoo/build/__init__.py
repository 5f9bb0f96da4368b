"""Finding and building drafts: the catalog, ``zoo pull``, ``zoo prune``, ``zoo ngram``, ``zoo regenerate``,
``zoo train-head`` and ``zoo export``, the held-in documents they learn from, and what they hand back (``built``)."""
