"""The decoding engine: one loop for batch 1, batch N and plain decoding (``loop``), one request's settings
(``params``), the KV caches (``kv_cache``), the verifier and sampling (``sampling``), dynamic γ (``gamma``),
compiled steps (``graphs``), the target's features for drafts that read them (``taps``) and the contract every
drafter implements (``drafter``). Imports the foundation, ``measure`` and ``models``; never a concrete draft."""
