"""SpecDecLM pieces that need no lm_eval run."""

from __future__ import annotations


def test_stop_check_decodes_only_the_tail_and_fires_as_a_full_decode_would():
    """lm-eval's stop sequences: the incremental check fires at the same call as decoding everything would."""
    from types import SimpleNamespace

    from conftest import word_tokenizer

    from specdraft_eval.integration.lm_eval_model import SpecDecLM

    words = ["<unk>", "</s>", *[f"w{i}" for i in range(20)]]
    tokenizer = word_tokenizer(words)
    decoded = []
    spy = SimpleNamespace(tokenizer=SimpleNamespace(decode=lambda ids, **kw: decoded.append(len(ids)) or
                                                    tokenizer.decode(ids, **kw)))
    stops = ["w3 w4", "w9"]
    sequence = [7, 8, 9, 5, 7, 5, 6, 10, 4]  # "w5 w6 w7 w3 w5 w3 w4 w8 w2": "w3 w4" completes at the 7th token
    for step in (1, 2, 3):  # tokens arrive 1, 2 or 3 at a time, as speculative steps emit them
        check, decoded[:] = SpecDecLM._stop_check(spy, stops), []
        lengths = [*range(step, len(sequence), step), len(sequence)]
        fired = next(n for n in lengths if check(sequence[:n]))  # generation ends at the first
        assert fired == next(n for n in lengths if any(s in tokenizer.decode(sequence[:n]) for s in stops)) >= 7
        assert max(decoded) <= step + len(max(stops, key=len)) + 1  # never the whole generation
