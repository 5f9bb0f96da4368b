"""`zoo regenerate`: the target's own answers (token for token what it decodes alone), held-in prompts only (never
the documents the evaluations use, in any source or in the committed data), resumable chunks written atomically
with their provenance, and `zoo train-head --data` learning from them (features equal to a teacher-forced pass; the
head's metadata names its data; EAGLE-3 with the target's output layer frozen)."""

from __future__ import annotations

import gzip
import json
import random
import subprocess
from pathlib import Path

import pytest
import torch
from support import ROOT, run_cli

from specdraft_eval import autoregressive_generate
from specdraft_eval.errors import SpecdecError
from specdraft_eval.integration.offline_data import task_prompts
from specdraft_eval.models.targets import LoadSettings
from zoo.build.held_in import HELD_OUT, held_in_prompts
from zoo.build.regenerate import PROVENANCE, Regeneration, read_rows, regenerate
from zoo.build.train_head import HeadTraining, forced_features, train_head

TARGET_LAYERS = 6  # the `target` and `tiny` fixtures' depth

SHIPPED_DATA = ROOT / "leaderboard" / "drafts" / "data"


def _held_out_texts() -> dict[str, str]:
    return {" ".join(text.split()): f"{task}#{i}" for task, held in HELD_OUT.items()
            for i, text in enumerate(task_prompts(task)[:held])}


def _held_in_source(source: str) -> bool:
    task, _, index = source.partition("#")
    return task not in HELD_OUT or int(index) >= HELD_OUT[task]


@pytest.mark.parametrize("spec", ["default", "specdec_humaneval", "specdec_mmlu_cot", "specdec_humaneval,python"])
def test_prompt_sources_never_hold_the_evaluations_documents(spec):
    held_out = _held_out_texts()
    prompts = held_in_prompts(spec, 400)
    assert prompts and all(_held_in_source(p.source) for p in prompts)
    assert not [p.source for p in prompts if " ".join(p.text.split()) in held_out]
    assert len({p.source for p in prompts}) == len(prompts)
    if spec == "default":  # the bundled tasks' held-in documents, every one of them, nothing else
        assert len(held_in_prompts(spec)) == sum(len(task_prompts(t)) - n for t, n in HELD_OUT.items())


def test_a_users_file_with_an_evaluation_document_is_refused(tmp_path):
    humaneval = task_prompts("specdec_humaneval")
    path = tmp_path / "mine.txt"
    path.write_text("def f():\n    pass\n\n" + humaneval[3].replace("    ", "  ") + "\n\n" + humaneval[50])
    with pytest.raises(SpecdecError, match=r"prompt file .*mine.txt holds part of specdec_humaneval#3, a document "
                                           "the evaluations use"):
        held_in_prompts(str(path))
    path.write_text("def f():\n    pass\n\n" + humaneval[50])  # a held-in document is fine
    assert [p.source for p in held_in_prompts(str(path))][:2] == [f"{path}#0", f"{path}#1"]


@pytest.mark.parametrize("task,index", [("specdec_humaneval", 7), ("specdec_mmlu_cot", 42)])
def test_any_long_window_of_an_evaluation_document_is_refused_by_every_builder(tmp_path, task, index):
    """Not only a document's end: its middle, re-spaced and cut by a blank line, is found in a prompt file, a
    calibration file or text (zoo prune) and a training text (train-head --text); held-in text passes."""
    from zoo.build.held_in import HELD_OUT_WORDS, check_held_in
    from zoo.build.prune import calibration_texts

    words = task_prompts(task)[index].split()
    middle = len(words) // 2 - HELD_OUT_WORDS  # a window from the middle, whatever the document's end is
    piece = " ".join(words[middle: middle + HELD_OUT_WORDS]) + "\n\n" + " ".join(words[middle + HELD_OUT_WORDS:
                                                                                    middle + 2 * HELD_OUT_WORDS])
    path = tmp_path / "mine.txt"
    path.write_text("held-in text first\n\n" + "  ".join(piece.split(" ")) + "\n")
    with pytest.raises(SpecdecError, match=rf"holds part of {task}#\d+, a document the evaluations use"):
        held_in_prompts(str(path))
    with pytest.raises(SpecdecError, match=rf"calibration file {path} holds part of {task}#"):
        calibration_texts(str(path))
    with pytest.raises(SpecdecError, match=rf"calibration text .* holds part of {task}#"):
        calibration_texts(piece)
    assert calibration_texts(task) == task_prompts(task)[HELD_OUT[task]:]  # a task: its held-in documents only
    for held_in in task_prompts(task)[HELD_OUT[task]:]:  # no false alarm on any held-in document
        check_held_in(held_in, "held-in")
    with pytest.raises(SpecdecError, match="unknown calibration task"):
        calibration_texts("specdec_nope")


def test_train_head_text_refuses_an_evaluation_document(tmp_path):
    from support import word_tokenizer

    from zoo.build.train_head import HeadTraining, teacher_forced

    (tmp_path / "notes.md").write_text("notes " + task_prompts("specdec_humaneval")[12])
    settings = HeadTraining(text=str(tmp_path), text_tokens=64)
    with pytest.raises(SpecdecError, match=r"--text file .*notes.md holds part of specdec_humaneval#12"):
        teacher_forced(None, word_tokenizer(["<unk>", "</s>"]), settings, lambda *a, **k: None, ())


def test_python_prompts_are_functions_with_their_docstrings():
    prompts = held_in_prompts("python", 50)
    assert len(prompts) == 50 and all(p.source.startswith("python:") for p in prompts)
    for prompt in prompts:
        body = prompt.text.rstrip()
        assert "def " in body and body.endswith(('"', "'")), prompt.source


def _prompt_file(tmp: Path, count: int = 12) -> Path:
    rng = random.Random(1)
    path = tmp / "prompts.txt"
    path.write_text("\n\n".join(" ".join(f"w{rng.randrange(2, 62)}" for _ in range(rng.randrange(4, 20)))
                                for _ in range(count)))
    return path


def _chunks(out: Path) -> dict[str, bytes]:
    return {p.name: gzip.decompress(p.read_bytes()) for p in sorted(out.glob("chunk-*.json.gz"))}


def test_answers_are_the_targets_own_and_a_stopped_run_continues(tmp_path, tiny):
    prompts = _prompt_file(tmp_path)
    settings = Regeneration(str(prompts), new_tokens=24, draft="prompt-lookup", num_draft_tokens=3, batch_size=5,
                            chunk_prompts=5, context=16)
    out = tmp_path / "answers"
    seen = {"rows": 0}

    def stop_in_the_second_chunk(advance=1, total=None):
        seen["rows"] += advance
        if seen["rows"] > 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        regenerate(str(tiny), out, settings, tick=stop_in_the_second_chunk)
    assert list(_chunks(out)) == ["chunk-00000.json.gz"]  # the chunk in flight left nothing
    assert [c["file"] for c in json.loads((out / PROVENANCE).read_text())["chunks"]] == ["chunk-00000.json.gz"]
    result = regenerate(str(tiny), out, settings)
    assert (result.chunks, result.new_chunks, result.rows, result.complete) == (3, 2, 12, True)
    whole = regenerate(str(tiny), tmp_path / "whole", settings)
    assert _chunks(out) == _chunks(tmp_path / "whole") and whole.answer_tokens == result.answer_tokens

    loaded = LoadSettings().load(str(tiny))
    rows, provenance = read_rows(out)
    assert [r.source for r in rows] == [f"{prompts}#{i}" for i in range(12)]
    for row, text in zip(rows, prompts.read_text().split("\n\n"), strict=True):
        assert row.prompt == loaded.tokenizer(text).input_ids[-16:]
        assert row.answer == autoregressive_generate(loaded.model, row.prompt, 24)[0]  # the target's, token for token
    assert provenance["settings"]["target"] == str(tiny) and provenance["held_out"] == HELD_OUT
    assert provenance["answer_tokens"] == sum(len(r.answer) for r in rows) > 0

    more = regenerate(str(tiny), out, Regeneration(**{**settings.__dict__, "max_prompts": 14}))
    assert more.new_chunks == 0 and more.rows == 12  # the prompt file has 12: nothing more to do
    with pytest.raises(SpecdecError, match=r"regenerated with other settings \(new_tokens\)"):
        regenerate(str(tiny), out, Regeneration(**{**settings.__dict__, "new_tokens": 30}))


def test_sampled_answers_differ_and_repeat_with_the_seed(tmp_path, tiny):
    settings = Regeneration(str(_prompt_file(tmp_path, 4)), new_tokens=16, temperature=1.0, samples=2,
                            draft="none", batch_size=4, chunk_prompts=2)
    regenerate(str(tiny), tmp_path / "a", settings)
    regenerate(str(tiny), tmp_path / "b", settings)
    rows = read_rows(tmp_path / "a")[0]
    assert [(r.source[-2:], r.sample) for r in rows][:4] == [("#0", 0), ("#1", 0), ("#0", 1), ("#1", 1)]
    assert rows[0].answer != rows[2].answer and _chunks(tmp_path / "a") == _chunks(tmp_path / "b")


@pytest.mark.parametrize("settings, message", [
    (dict(samples=3), "repeats one answer: give --temperature"),
    (dict(temperature=-1.0), "--temperature -1.0 must be >= 0"),
    (dict(batch_size=0), "--batch-size 0 must be >= 1"),
])
def test_bad_settings_are_one_line(settings, message):
    with pytest.raises(SpecdecError, match=message):
        Regeneration(**settings).check()


def test_cli_continues_and_refuses_a_foreign_folder(tmp_path, tiny):
    out = tmp_path / "cli"
    args = ["zoo", "regenerate", str(tiny), "--out", str(out), "--prompts", str(_prompt_file(tmp_path, 3)),
            "--new-tokens", "8", "--draft", "none", "--json"]
    done = run_cli(*args)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["rows"] == 3 and json.loads(run_cli(*args).stdout)["new_chunks"] == 0
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    bad = run_cli("zoo", "regenerate", str(tiny), "--out", str(foreign), "--prompts", "specdec_humaneval")
    assert bad.returncode != 0 and bad.stderr.strip().splitlines()[-1] == (
        f"zoo: error: {foreign} exists and holds no {PROVENANCE}: choose a new --out")


def test_a_head_learns_from_regenerated_answers(tmp_path, tiny):
    """`train-head --data`: the answers' features are a teacher-forced pass's, the head learns (agreement above an
    untrained head's), its metadata names the data; EAGLE-3 with `--output-layer target` keeps the target's rows."""
    data = tmp_path / "answers"
    regenerate(str(tiny), data, Regeneration(str(_prompt_file(tmp_path, 40)), new_tokens=40, draft="none",
                                             context=64, chunk_prompts=20))
    loaded = LoadSettings().load(str(tiny))
    rows, _ = read_rows(data)
    sequences = [r.prompt + r.answer for r in rows[:5]]
    features = forced_features(loaded.model, sequences, (2, -1), 0, lambda *a, **k: None)
    for tokens, seen in zip(sequences, features, strict=True):
        with torch.inference_mode():
            states = loaded.model(torch.tensor([tokens]), output_hidden_states=True).hidden_states
        torch.testing.assert_close(seen.float(), torch.cat([states[2][0], states[-1][0]], -1), rtol=0, atol=3e-3)

    small = dict(vocab_top=0, batch_size=8, window=32, lr=3e-3, data=str(data))
    trained = train_head(str(tiny), tmp_path / "head", HeadTraining(steps=300, **small))
    untrained = train_head(str(tiny), tmp_path / "untrained", HeadTraining(steps=1, **{**small, "lr": 0.0}))
    agreement = trained.record["top1_agreement_by_step"]
    assert agreement[0] > untrained.record["top1_agreement_by_step"][0] + 0.2, agreement
    meta = json.loads((tmp_path / "head" / "eagle.json").read_text())["training"]
    assert meta["data"] == [{"data": str(data), "target": str(tiny), "prompts": {"spec": str(tmp_path / "prompts.txt"),
                                                                                "count": 40},
                             "temperature": 0.0, "rows": 40, "answer_tokens": sum(len(r.answer) for r in rows),
                             "held_out": HELD_OUT}]
    assert meta["generated_tokens"] == meta["data"][0]["answer_tokens"] and meta["steps_done"] == 300

    frozen = train_head(str(tiny), tmp_path / "head3", HeadTraining(steps=20, kind="eagle3", output_layer="target",
                                                                     **small))
    own = train_head(str(tiny), tmp_path / "head3own", HeadTraining(steps=20, kind="eagle3", **small))
    assert own.record["parameters"] - frozen.record["parameters"] == loaded.model.lm_head.weight.numel()
    from safetensors.torch import load_file
    saved = load_file(str(tmp_path / "head3" / "model.safetensors"))["lm_head.weight"]
    torch.testing.assert_close(saved.float(), loaded.model.lm_head.weight.detach(), rtol=0, atol=1e-3)
    with pytest.raises(SpecdecError, match="--output-layer 'target': use trained or target, with --kind eagle3"):
        HeadTraining(output_layer="target").check()
    with pytest.raises(SpecdecError, match="--data replaces --prompts"):
        HeadTraining(prompts="default", data=str(data)).check()


def test_the_committed_data_holds_only_held_in_prompts(smollm2):
    """Every regenerated directory shipped under leaderboard/drafts/data: each row's prompt is a held-in document or
    another held-in source, and no prompt holds a document the evaluations use."""
    folders = sorted(p.parent for p in SHIPPED_DATA.glob(f"*/{PROVENANCE}"))
    assert folders, "no regenerated data is shipped"
    held_out = [" ".join(t.split())[-160:] for t in _held_out_texts()]
    tokenizer = smollm2.tokenizer
    for folder in folders:
        rows, provenance = read_rows(folder)
        assert provenance["held_out"] == HELD_OUT and rows
        assert all(_held_in_source(r.source) for r in rows)
        texts = tokenizer.batch_decode([r.prompt for r in rows])
        assert not [r.source for r, text in zip(rows, texts) if any(t in " ".join(text.split()) for t in held_out)]


def _shipped_training_data(folder: Path) -> list[dict]:
    """A shipped draft's own account of what it learnt from (each format keeps it in its metadata)."""
    if (folder / "ngram.json").is_file():
        return json.loads((folder / "ngram.json").read_text())["meta"]["data"]
    if (folder / "eagle.json").is_file():
        return json.loads((folder / "eagle.json").read_text())["training"]["data"]
    return json.loads((folder / "config.json").read_text())["specdraft_eval"]["training"]["data"]


def test_every_shipped_draft_lists_its_training_data_and_none_is_held_out():
    tracked = subprocess.run(["git", "ls-files", "leaderboard/drafts"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()  # shipped: committed, not what reproduce.sh built beside them
    folders = sorted({ROOT / Path(path).parents[-4] for path in tracked} - {SHIPPED_DATA})
    assert {p.name for p in folders} >= {"smollm2-ngram", "smollm2-eagle", "smollm2-eagle3"}
    for folder in folders:
        data = _shipped_training_data(folder)
        assert data, folder
        for source in data:
            if "text" in source:  # read teacher-forced: the standard library, never a task's documents
                assert source["text"] == "python" and source["tokens"] > 0
                continue
            assert source["held_out"] == HELD_OUT and source["answer_tokens"] > 0
            for name in source["prompts"]["spec"].split(","):
                assert name in ("default", "python", *HELD_OUT), (folder, name)  # held_in_prompts' own sources
            if "data" in source:  # regenerated: shipped beside it, checked row by row above
                assert (ROOT / source["data"]).parent == SHIPPED_DATA and (ROOT / source["data"] / PROVENANCE).is_file()
