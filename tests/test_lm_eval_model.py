"""SpecDecLM pieces that need no lm_eval run."""

from __future__ import annotations


def test_stop_check_decodes_only_the_tail_and_fires_as_a_full_decode_would():
    """lm-eval's stop sequences: the incremental check fires at the same call as decoding everything would."""
    from types import SimpleNamespace

    from support import word_tokenizer

    from specdraft_eval.engine.params import text_stop

    words = ["<unk>", "</s>", *[f"w{i}" for i in range(20)]]
    tokenizer = word_tokenizer(words)
    decoded = []
    spy = SimpleNamespace(decode=lambda ids, **kw: decoded.append(len(ids)) or tokenizer.decode(ids, **kw))
    stops = ["w3 w4", "w9"]
    sequence = [7, 8, 9, 5, 7, 5, 6, 10, 4]  # "w5 w6 w7 w3 w5 w3 w4 w8 w2": "w3 w4" completes at the 7th token
    for step in (1, 2, 3):  # tokens arrive 1, 2 or 3 at a time, as speculative steps emit them
        check, decoded[:] = text_stop(spy, stops), []
        lengths = [*range(step, len(sequence), step), len(sequence)]
        fired, kept = next((n, k) for n in lengths if (k := check(sequence[:n])) is not None)  # ends at the first
        assert fired == next(n for n in lengths if any(s in tokenizer.decode(sequence[:n]) for s in stops)) >= 7
        assert kept == 7  # where "w3 w4" completes, whichever step brought it: the row is cut there
        assert max(decoded) <= step + len(max(stops, key=len)) + 1  # never the whole generation


def test_the_baseline_runs_first_every_other_batch(tmp_path, monkeypatch):
    """Neither side of the speedup always runs on the warmer machine: the order alternates per generation batch,
    and each request's own figures (its baseline's beside them) are kept for --log_samples."""
    import torch
    from support import save_tiny

    from specdraft_eval.engine import session
    from specdraft_eval.integration.lm_eval_model import SpecDecLM

    model = SpecDecLM(pretrained=str(save_tiny(tmp_path / "tiny")), draft="prompt-lookup", baseline=True,
                      device="cpu")
    order = []
    for name in ("speculative_generate_batch", "autoregressive_generate_batch"):
        real = getattr(session, name)
        monkeypatch.setattr(session, name, lambda *a, _real=real, _name=name, **k: order.append(_name[0])
                            or _real(*a, **k))
    model._contexts = ["w1 w2", "w3"]
    context = torch.tensor([[5, 6, 7], [0, 8, 9]])
    for _ in range(3):
        model._model_generate(context, 8, [], attention_mask=torch.tensor([[1, 1, 1], [0, 1, 1]]))
    assert order == ["s", "a", "a", "s", "s", "a"]
    figures = model._request_figures["w1 w2"]
    assert len(figures) == 3 and all(f["baseline_tokens"] == f["generated_tokens"] == 5 for f in figures)


def test_a_suffix_draft_reports_its_cache_and_takes_its_settings_as_model_args(tmp_path):
    """``max_tree_depth=...`` as model_args lands in the draft string the record names, and the record's
    ``draft_state`` gives the suffix cache's tokens at the run's start and end (a run starts empty)."""
    import torch
    from support import save_tiny

    from specdraft_eval.integration.lm_eval_model import SpecDecLM
    from specdraft_eval.results.record import SpecdecRecord

    model = SpecDecLM(pretrained=str(save_tiny(tmp_path / "tiny")), draft="suffix", max_tree_depth=16,
                      num_draft_tokens=4, device="cpu")
    model._contexts = ["w1 w2", "w3"]
    model._model_generate(torch.tensor([[5, 6, 7], [0, 8, 9]]), 12, [], attention_mask=torch.tensor([[1, 1, 1],
                                                                                                    [0, 1, 1]]))
    block = model.specdec_info()
    assert block["draft"] == "suffix?max_tree_depth=16"
    state = block["draft_state"]["suffix_cache"]
    assert state["tokens_at_start"] == 0 and state["tokens_at_end"] > 0 and state["warm"] is False
    record = SpecdecRecord.from_block(block)
    assert record.draft_state == block["draft_state"]
    merged = record.merge(record).draft_state["suffix_cache"]  # two runs (or ranks): their caches' tokens added
    assert merged["tokens_at_end"] == 2 * state["tokens_at_end"] and merged["warm"] is False
