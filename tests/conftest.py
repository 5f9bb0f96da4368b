"""Shared fixtures: tiny random-weight Llama models, a tiny tokenizer, and the real SmolLM2 target."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from specdraft_eval.measure.record import Runtime

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def pytest_collection_modifyitems(config, items) -> None:
    """Tests marked ``gpu`` skip, saying why, where no CUDA device is visible."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU: what only a GPU checks (docs/development.md, Tests); run "
                                   "pytest -m gpu there")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def results_store(tmp_path_factory, monkeypatch) -> Path:
    """Every test gets an empty results store of its own (``$SPECDRAFT_EVAL_STORE``, inherited by the commands it
    runs): the user's store never leaks into a test, nor one test's runs into another's ``draft=auto``."""
    folder = tmp_path_factory.mktemp("store")
    monkeypatch.setenv("SPECDRAFT_EVAL_STORE", str(folder))
    return folder


def tiny_llama(seed: int = 0, vocab: int = 64, layers: int = 4, hidden: int = 32) -> LlamaForCausalLM:
    """A random-weight Llama small enough for thousands of generations a second."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    return LlamaForCausalLM(config).eval()


def observed(drafter) -> list:
    """The features the engine hands ``drafter``'s rows (every ``observe``), recorded in order into the list
    returned (``drafter.rows`` is wrapped: the rows the engine drafts with)."""
    seen: list = []
    rows = drafter.rows

    def recording(count):
        batch = rows(count)
        observe = batch.observe
        batch.observe = lambda row, features: (seen.append(features.clone()), observe(row, features))
        return batch

    drafter.rows = recording
    return seen


def word_tokenizer(words: list[str]) -> PreTrainedTokenizerFast:
    """A whitespace word-level tokenizer over ``words`` (no hub needed)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {w: i for i, w in enumerate(words)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=words[0]))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token=words[0], eos_token=words[1], pad_token=words[1])


def save_tiny(path: Path, seed: int = 0, words: list[str] | None = None, layers: int = 4) -> Path:
    """Write a tiny model plus tokenizer as a normal HF directory."""
    words = words or ["<unk>", "</s>", *[f"w{i}" for i in range(62)]]
    model = tiny_llama(seed, vocab=len(words), layers=layers)
    model.config.eos_token_id = 1
    model.generation_config.eos_token_id = 1
    model.save_pretrained(path)
    word_tokenizer(words).save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def smollm2():
    """The real embedded default target and its tokenizer (loaded once)."""
    from specdraft_eval import load_target

    return load_target("smollm2-135m-instruct")


def run_cli(*args: str, timeout: int = 900, env: dict | None = None, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """Run a console script of this environment (``lm_eval``, ``zoo``) as a user would (from ``cwd``)."""
    full_env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", **(env or {})}
    return subprocess.run(
        [str(BIN / args[0]), *args[1:]],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
    )


RUNTIME = Runtime("float32", "onednn", attention="sdpa")
"""A complete runtime, as today's code records it (records without one are left out of boards and auto)."""
