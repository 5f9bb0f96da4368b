"""Reporting: the leaderboard (markdown, CSV, HTML, figures), ``zoo samples`` and deterministic PNGs (``plotting``)."""
