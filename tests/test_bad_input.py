"""The bad-input matrix: every case ends in one line naming the problem and the fix (a non-zero exit for
commands), or in the documented behaviour. Python API and ``zoo`` cases run in this process (``zoo`` through
typer's runner, the same ``cli_errors`` wrapper); ``lm_eval`` cases run the real command.

Ends: ``error`` (SpecdecError / one ``zoo: error:`` or ``specdec: error:`` line, exit 1), ``behaviour``
(documented result, checked)."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest
from support import run_cli, save_tiny
from typer.testing import CliRunner

from specdraft_eval import SpecdecError, load_target, speculative_generate
from specdraft_eval.drafts import load_draft
from specdraft_eval.drafts.prompt_lookup import PromptLookupDrafter
from zoo.cli import app


@pytest.fixture(scope="module")
def loaded(tiny):
    return load_target(str(tiny))


def broken_weights(tiny: Path, folder: Path, kind: str) -> Path:
    """A copy of the tiny model directory whose weights are ``kind``: corrupt, truncated or missing."""
    folder.mkdir()
    for file in tiny.iterdir():
        if file.name != "model.safetensors":
            (folder / file.name).write_bytes(file.read_bytes())
    weights = (tiny / "model.safetensors").read_bytes()
    if kind == "corrupt":
        (folder / "model.safetensors").write_bytes(b"\x00garbage" * 64)
    elif kind == "truncated":
        (folder / "model.safetensors").write_bytes(weights[: len(weights) // 2])
    return folder


def without_tokenizer(tiny: Path, folder: Path) -> Path:
    """A copy of the tiny model directory holding the model's files but none of its tokenizer's."""
    folder.mkdir()
    for file in tiny.iterdir():
        if file.name in ("config.json", "model.safetensors", "generation_config.json"):
            (folder / file.name).write_bytes(file.read_bytes())
    return folder


# --- Python API --------------------------------------------------------------------------------------------

def _generate(loaded, **overrides):
    model = loaded.model
    kwargs = {"max_new_tokens": 4, **overrides}
    prompt = kwargs.pop("prompt", [5, 6, 7, 5, 6])
    return speculative_generate(model, PromptLookupDrafter(), prompt, **kwargs)


API_ERRORS = {
    "gamma 0": ({"num_draft_tokens": 0}, "num_draft_tokens must be an integer >= 1"),
    "gamma negative": ({"num_draft_tokens": -2}, "num_draft_tokens must be an integer >= 1"),
    "gamma non-numeric": ({"num_draft_tokens": "4x"}, "num_draft_tokens must be an integer >= 1"),
    "temperature below 0": ({"do_sample": True, "temperature": -0.5}, "temperature must be"),
    "top_p 0": ({"do_sample": True, "top_p": 0.0}, "top_p must be in (0, 1]"),
    "top_p above 1": ({"do_sample": True, "top_p": 1.5}, "top_p must be in (0, 1]"),
    "top_k negative": ({"do_sample": True, "top_k": -1}, "top_k must be >= 0"),
    "empty prompt": ({"prompt": []}, "empty prompt"),
    "prompt longer than the context": ({"prompt": [3] * 5000}, "exceeds the target's context"),
    "max_new_tokens negative": ({"max_new_tokens": -1}, "max_new_tokens must be >= 0"),
}


@pytest.mark.parametrize("case", list(API_ERRORS))
def test_api_errors(loaded, case):
    overrides, message = API_ERRORS[case]
    with pytest.raises(SpecdecError) as info:
        _generate(loaded, **overrides)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_api_behaviour_huge_gamma_is_capped_by_the_budget(loaded):
    out, stats = _generate(loaded, num_draft_tokens=10**6, max_new_tokens=6)
    assert len(out) == 6 and stats.draft_tokens <= 6 * 5


def test_api_behaviour_max_new_tokens_0_returns_nothing(loaded):
    out, stats = _generate(loaded, max_new_tokens=0)
    assert out == [] and stats.generated_tokens == 0


OTHER_WORDS = ["<unk>", "</s>", *[f"v{i}" for i in range(62)]]
"""A tokenizer's words that are not the tiny target's."""


@pytest.mark.parametrize("text", ["   \n\t ", "caf\udce9 \x00\x1b[31m\x07 bytes"], ids=["whitespace-only",
                                                                                        "non-UTF-8 and control"])
def test_api_behaviour_odd_prompt_text_generates(loaded, text):
    """Whitespace-only text, undecodable bytes (surrogate-escaped, as Python reads them) and control characters
    are just tokens: generation runs as for any prompt (an empty tokenization is the empty-prompt error)."""
    model, tok = loaded.model, loaded.tokenizer
    ids = tok(text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")).input_ids or [0]
    out, _ = speculative_generate(model, PromptLookupDrafter(), ids, 4)
    assert len(out) <= 4


LOAD_ERRORS = {
    "unknown target": (lambda tiny, tmp: load_target("no-such-target"), "unknown model 'no-such-target'"),
    "unknown draft": (lambda tiny, tmp: load_draft("no-such-draft", load_target(str(tiny))), "unknown model"),
    "unknown draft kind argument": (lambda tiny, tmp: load_draft("layers:x", load_target(str(tiny))), "layers"),
    "tokenizer mismatch": (lambda tiny, tmp: load_draft(str(save_tiny(tmp / "other", words=OTHER_WORDS)),
                                                        load_target(str(tiny))), "tokenizer mismatch"),
    "corrupt safetensors": (lambda tiny, tmp: load_target(str(broken_weights(tiny, tmp / "m", "corrupt"))),
                            "cannot load model"),
    "truncated safetensors": (lambda tiny, tmp: load_target(str(broken_weights(tiny, tmp / "m", "truncated"))),
                              "cannot load model"),
    "config but no weights": (lambda tiny, tmp: load_target(str(broken_weights(tiny, tmp / "m", "missing"))),
                              "cannot load model"),
    "weights but no tokenizer": (lambda tiny, tmp: load_target(str(without_tokenizer(tiny, tmp / "m"))),
                                 "tokenizer.save_pretrained"),
    "corrupt GGUF": (lambda tiny, tmp: load_target(str(_file(tmp / "m.gguf", b"GGUF" + b"\xff" * 64))), "GGUF"),
    "truncated GGUF": (lambda tiny, tmp: load_target(str(_file(tmp / "m.gguf", _gguf_head()))), "GGUF"),
}


def _file(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _gguf_head() -> bytes:
    """The first kilobyte of the embedded default's real GGUF file: a truncated download."""
    from specdraft_eval.models.targets import resolve

    source = resolve("smollm2-135m-instruct")
    with open(Path(source.path) / source.gguf_file, "rb") as f:
        return f.read(1024)


@pytest.mark.parametrize("case", list(LOAD_ERRORS))
def test_load_errors(tiny, tmp_path, case):
    action, message = LOAD_ERRORS[case]
    with pytest.raises(SpecdecError) as info:
        action(tiny, tmp_path)
    assert message in str(info.value) and "\n" not in str(info.value), str(info.value)


# --- zoo ---------------------------------------------------------------------------------------------------

def zoo(*args: str):
    return CliRunner().invoke(app, list(args))


def check_zoo_error(result, message: str) -> None:
    assert result.exit_code == 1, (result.exit_code, result.output)
    lines = [line for line in result.stderr.splitlines() if line.startswith("zoo:")]  # beside progress bars
    assert len(lines) == 1 and lines[0].startswith("zoo: error:") and message in lines[0], result.stderr
    assert "Traceback" not in result.stderr
    assert result.exception is None or isinstance(result.exception, SystemExit)


ZOO_ERRORS = {
    "profile unknown target": (["profile", "--target", "no-such-target"], "unknown model 'no-such-target'"),
    "bench gamma 0": (["bench", "--target", "{tiny}", "--drafts", "prompt-lookup", "--gamma", "0"], "bad --gamma"),
    "bench unknown draft": (["bench", "--target", "{tiny}", "--drafts", "no-such-draft"], "unknown model"),
    "bench batch size 0": (["bench", "--target", "{tiny}", "--batch-size", "0,2"], "bad --batch-size '0,2'"),
    "bench batch size non-numeric": (["bench", "--target", "{tiny}", "--batch-size", "two"], "bad --batch-size"),
    "rank gamma non-numeric": (["rank", "--target", "{tiny}", "--gpu", "h100", "--gamma", "x"], "bad --gamma"),
    "prune 0 layers": (["prune", "{tiny}", "--layers", "0", "--out", "{tmp}/d"], "outside 1.."),
    "ngram 0 new tokens": (["ngram", "{tiny}", "--new-tokens", "0", "--prompts", "specdec_humaneval", "--out",
                            "{tmp}/n"],
                           "--new-tokens 0 must be >= 1"),
    "recommend missing results": (["recommend", "--results", "{tmp}/nowhere"], "does not exist"),
    "leaderboard results not JSON": (["leaderboard", "{tmp}/results_x.json", "--out", "{tmp}/out"],
                                     "not readable JSON"),
    "leaderboard read-only output": (["leaderboard", "{results}", "--out", "{tmp}/ro/out"], "cannot write"),
    "pull unknown offline": (["pull", "no-such-org/no-such-draft"], "no-such-org/no-such-draft"),
}


@pytest.fixture()
def results(tmp_path) -> Path:
    from support import write_result

    write_result(tmp_path / "results", "prompt-lookup:3", 1.0)
    return tmp_path / "results"


@pytest.mark.parametrize("case", list(ZOO_ERRORS))
def test_zoo_errors(tiny, tmp_path, results, monkeypatch, case):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (tmp_path / "results_x.json").write_text("{not json")
    (tmp_path / "ro").mkdir()
    (tmp_path / "ro").chmod(0o500)
    if os.geteuid() == 0:  # root writes anywhere: refuse as the kernel would for another user
        import specdraft_eval.files as record

        def refuse(*args, dir=None, **kwargs):
            if str(dir).startswith(str(tmp_path / "ro")):
                raise PermissionError(errno.EACCES, "Permission denied", str(dir))
            return real(*args, dir=dir, **kwargs)

        real = record.tempfile.mkstemp
        monkeypatch.setattr(record.tempfile, "mkstemp", refuse)
        monkeypatch.setattr(record.tempfile, "mkdtemp", refuse)
    args, message = ZOO_ERRORS[case]
    try:
        result = zoo(*[a.format(tiny=tiny, tmp=tmp_path, results=results) for a in args])
    finally:
        (tmp_path / "ro").chmod(0o700)
    check_zoo_error(result, message)
    for leftover in ("d", "n", "out", "ro/out"):  # nothing written (an empty folder at most)
        assert not (tmp_path / leftover).exists() or not [p for p in (tmp_path / leftover).rglob("*") if p.is_file()]


def test_zoo_full_disk_is_one_line_and_leaves_nothing(results, tmp_path, monkeypatch):
    """ENOSPC while writing (simulated at the one atomic-write helper every file goes through)."""
    import specdraft_eval.files as record

    def full(self, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(record.Path, "write_bytes", full)
    result = zoo("leaderboard", str(results), "--out", str(tmp_path / "out"))
    check_zoo_error(result, "No space left on device")
    assert not (tmp_path / "out").exists() or list((tmp_path / "out").iterdir()) == []


# --- lm_eval --model specdec -------------------------------------------------------------------------------

LM_EVAL_ERRORS = {
    "unknown draft": ("pretrained={tiny},draft=no-such-draft", "specdec: error: draft 'no-such-draft': unknown model"),
    "gamma 0": ("pretrained={tiny},num_draft_tokens=0", "specdec: error: model_args num_draft_tokens=0 must be >= 1"),
    "gamma non-numeric": ("pretrained={tiny},num_draft_tokens=four", "is not an integer"),
    "unknown target": ("pretrained=no-such-target", "specdec: error: unknown model 'no-such-target'"),
    "boolean": ("pretrained={tiny},baseline=maybe", "is not a boolean"),
    "kernels": ("pretrained={tiny},kernels=fast", "specdec: error: kernels='fast' is unknown: use kernels=onednn"),
    "malformed model_args": ("pretrained={tiny},draft=layers:0,1", "expected `key=value`, got '1'"),  # lm-eval's parser
    "unknown model_arg": ("pretrained={tiny},no_such_arg=1", "no_such_arg"),
    "gamma huge": ("pretrained={tiny},num_draft_tokens=100000", None),  # behaviour: capped by the budget, runs
    "max_gen_toks 0": ("pretrained={tiny}", None),  # behaviour: empty generations, runs (--gen_kwargs below)
    "draft auto": ("pretrained={tiny},draft=auto", None),  # behaviour: no records for this target: prompt lookup
}


@pytest.fixture(scope="module")
def lm_eval_runs(tiny, tmp_path_factory) -> dict:
    """Every case's real ``lm_eval`` run (in this process: an argument error costs milliseconds)."""

    def run(case: str):
        out = tmp_path_factory.mktemp("lm_eval") / "out"
        extra = ["--gen_kwargs", "max_gen_toks=0"] if case == "max_gen_toks 0" else ["--gen_kwargs", "max_gen_toks=4"]
        done = run_cli("lm_eval", "--model", "specdec", "--model_args", LM_EVAL_ERRORS[case][0].format(tiny=tiny),
                       "--include_path", "tasks", "--tasks", "specdec_mmlu_cot", "--limit", "1", "--output_path",
                       str(out), *extra)
        return done, out

    return {case: run(case) for case in LM_EVAL_ERRORS}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(LM_EVAL_ERRORS))
def test_lm_eval(lm_eval_runs, case):
    message = LM_EVAL_ERRORS[case][1]
    done, out = lm_eval_runs[case]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    if message is None:
        assert done.returncode == 0, done.stderr[-3000:]
        results = json.loads(next(out.rglob("results_*.json")).read_text())
        assert results["config"]["specdec"]["generations"] == 1
    else:
        assert done.returncode != 0
        assert message in done.stderr.strip().splitlines()[-1], done.stderr[-3000:]
        assert not out.exists()
