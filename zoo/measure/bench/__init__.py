"""``zoo bench``: our engine against transformers' generate and assisted generation (:mod:`.run`), its typed
result and the losslessness rule (:mod:`.result`), the text tables (:mod:`.render`), and with ``--batch-size`` the
batch study (:mod:`.batch`)."""
