"""Fixtures and hooks; the helpers tests share live in ``support.py`` (no test imports another test module)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from support import index_tasks_once, save_tiny, tiny_llama


def pytest_configure(config) -> None:
    index_tasks_once()
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:  # pytest -n N: the cores shared, so N processes' threads never outnumber them
        threads = max(1, (os.cpu_count() or 1) // workers)
        torch.set_num_threads(threads)
        os.environ["OMP_NUM_THREADS"] = str(threads)  # and the commands tests start


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


@pytest.fixture(scope="module")
def target(request):
    """A tiny random-weight Llama (seed 0; ``TARGET_LAYERS`` of the test module, else 4 layers)."""
    return tiny_llama(seed=0, layers=getattr(request.module, "TARGET_LAYERS", 4))


@pytest.fixture(scope="module")
def tiny(request, tmp_path_factory) -> Path:
    """That model saved as an HF directory with a word-level tokenizer (``TARGET_LAYERS`` layers, else 4)."""
    return save_tiny(tmp_path_factory.mktemp("tiny") / "model", layers=getattr(request.module, "TARGET_LAYERS", 4))


@pytest.fixture(scope="session")
def smollm2():
    """The real embedded default target and its tokenizer (loaded once)."""
    from specdraft_eval import load_target

    return load_target("smollm2-135m-instruct")
