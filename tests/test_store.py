"""This machine's results store: atomic, versioned files of the one record schema; listed, pruned, read first."""

from __future__ import annotations

import json

import pytest
from support import write_result

from specdraft_eval.errors import SpecdecError
from specdraft_eval.files import RecordWarning
from specdraft_eval.results import store
from specdraft_eval.results.record import SpecdecRecord, read_results


def _record(tmp_path, draft: str = "prompt-lookup:3", version: str | None = None) -> SpecdecRecord:
    record = read_results(write_result(tmp_path / draft.replace(":", "_"), draft, 1.5)).record
    if version:
        record.versions = {**record.versions, "specdraft-eval": version}
    return record


def test_saved_records_read_back_as_results_files(tmp_path, results_store):
    """A saved record is a results file of lm-eval's shape under the store (SPECDRAFT_EVAL_STORE), per target, read
    back equal (its block), with what wrote it; two saves never overwrite each other."""
    record = _record(tmp_path)
    first, second = store.save(record, "lm_eval"), store.save(record, "zoo tune")
    assert first != second and first.parent == results_store / "smollm2-135m-instruct"
    assert store.store_dir() == results_store
    entries = store.entries()
    assert [e.origin for e in entries] == ["lm_eval", "zoo tune"]
    assert entries[0].record.to_block() == record.to_block()
    assert json.loads(first.read_text())["store"]["version"] == store.STORE_VERSION
    assert not list(results_store.rglob(".*"))  # no temporary files left behind
    assert store.save(record, "lm_eval", replacing=first) == first and len(store.entries()) == 2


def test_unusable_files_are_skipped_with_one_warning_and_newer_ones_named(tmp_path, results_store):
    store.save(_record(tmp_path), "lm_eval")
    folder = results_store / "smollm2-135m-instruct"
    (folder / "results_truncated.json").write_text('{"config": ')
    newer = json.loads(next(folder.glob("results_*.json")).read_text())
    newer["store"]["version"] = store.STORE_VERSION + 1
    (folder / "results_newer.json").write_text(json.dumps(newer))
    with pytest.warns(RecordWarning) as caught:
        assert len(store.entries()) == 1
    messages = [str(w.message) for w in caught]
    assert any("results_truncated.json" in m and "corrupt or truncated" in m for m in messages)
    assert any("results_newer.json" in m and "upgrade specdraft-eval" in m for m in messages)


def test_prune_removes_what_it_is_told_and_nothing_without_a_selection(tmp_path, results_store):
    old = store.save(_record(tmp_path, "layers:0-1", version="0.0.1"), "lm_eval")
    today = store.save(_record(tmp_path), "zoo tune")
    with pytest.raises(SpecdecError, match="needs --target, --draft, --stale or --all"):
        store.prune()
    assert store.prune(stale=True) == [old] and [e.path for e in store.entries()] == [today]
    assert store.prune(target="another-target") == [] and store.prune(draft="prompt-lookup:3") == [today]
    store.save(_record(tmp_path), "lm_eval")
    assert len(store.prune(everything=True)) == 1 and store.entries() == []
    with pytest.raises(SpecdecError, match="unknown results-store origin"):
        store.save(_record(tmp_path), "somewhere")


def test_the_store_moves_with_the_cache(monkeypatch, tmp_path):
    monkeypatch.delenv("SPECDRAFT_EVAL_STORE")
    monkeypatch.setenv("SPECDRAFT_EVAL_CACHE", str(tmp_path / "cache"))
    assert store.store_dir() == tmp_path / "cache" / "results"


def test_records_of_a_replaced_kind_implementation_are_stale_and_never_chosen(tmp_path, results_store, monkeypatch):
    """A kind whose implementation changed raises its version: records measured before (no version recorded: 1)
    are listed by `zoo results --stale`, pruned by `--prune --stale` and left out of draft=auto's candidates;
    a record of today's implementation is none of these, and records of one configuration measured by two
    implementations never merge."""
    from typer.testing import CliRunner

    from specdraft_eval.drafts.spec import draft_kinds, kind_versions, replaced
    from specdraft_eval.integration.recommend import candidates
    from zoo.cli import app

    old = store.save(_record(tmp_path), "lm_eval")
    assert replaced("prompt-lookup:3", {}) == [] and kind_versions("prompt-lookup:3") == {}
    monkeypatch.setattr(draft_kinds()["prompt-lookup"], "version", 2)
    assert replaced("prompt-lookup:3", {}) == ["prompt-lookup v1 (now v2)"]
    record = _record(tmp_path)
    record.kind_versions = kind_versions("prompt-lookup:3")
    assert record.kind_versions == {"prompt-lookup": 2}
    assert SpecdecRecord.from_block(record.to_block()).kind_versions == {"prompt-lookup": 2}
    assert record.key() != store.entries()[0].record.key()  # two implementations: two configurations
    today = store.save(record, "lm_eval")
    listed = json.loads(CliRunner().invoke(app, ["results", "--stale", "--json"]).output)["results"]
    assert [row["file"] for row in listed] == [old.name] and listed[0]["stale"] == "prompt-lookup v1 (now v2)"
    found = candidates("smollm2-135m-instruct", [], [old, today])
    assert [c.files for c in found] == [[str(today)]]
    assert store.prune(stale=True) == []  # the store knows no kinds: the CLI says which are replaced
    assert CliRunner().invoke(app, ["results", "--prune", "--stale", "--json"]).exit_code == 0
    assert [e.path for e in store.entries()] == [today]
