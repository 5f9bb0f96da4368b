"""A draft kind touches its own module and nothing else: one registered from this file, with a server mapping and a
tuner candidate set, appears in ``zoo list``, ``zoo rank``, vLLM's and SGLang's mappings and the lm-eval wrapper."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from specdraft_eval.drafts.kind import Candidate, DraftKind, all_candidates, draft_kinds, register
from specdraft_eval.drafts.spec import DraftSpec
from specdraft_eval.engine.drafter import DrafterBase, Proposal
from specdraft_eval.errors import SpecdecError

NAME = "echo-test"


class Echo(DrafterBase):
    """Drafts the last token again ``times`` times at most."""

    def __init__(self, times: int) -> None:
        self.times, self.name = times, f"{NAME}:{times}"

    def propose(self, tokens, num_tokens, sampler):
        return Proposal([tokens[-1]] * min(num_tokens, self.times))


class EchoKind(DraftKind):
    name = NAME
    usage = f"{NAME}[:N]"
    summary = "the last token again, N times (a kind registered by a test)"

    def parse(self, arg):
        if arg not in (None, "") and not arg.isdigit():
            raise SpecdecError(f"bad {NAME} count {arg!r}: use {NAME}:N, e.g. {NAME}:2")
        return int(arg or 1)

    def build(self, value, target):
        return Echo(value)

    def candidates(self, target_layers):
        return (Candidate(f"{NAME}:2", (2, 4)),)

    def vllm_config(self, value, num_draft_tokens, written):
        return {"method": "ngram", "num_speculative_tokens": num_draft_tokens, "prompt_lookup_max": 1,
                "prompt_lookup_min": 1}


@pytest.fixture
def echo():
    from specdraft_eval.drafts.kind import REGISTRY

    register(EchoKind())
    yield
    REGISTRY.remove(NAME)


def zoo(*args: str):
    from zoo.cli import app

    done = CliRunner().invoke(app, list(args))
    assert done.exit_code == 0, done.output
    return json.loads(done.output)


def test_a_kind_registered_here_is_parsed_listed_ranked_and_served(echo):
    assert NAME in draft_kinds() and DraftSpec.parse(f"{NAME}:3").value == 3
    with pytest.raises(SpecdecError, match=f"use {NAME}:N"):
        DraftSpec.parse(f"{NAME}:x")  # its own grammar, validated when the string is parsed
    assert Candidate(f"{NAME}:2", (2, 4)) in all_candidates(30)
    assert {"name": f"{NAME}[:N]", "family": "any", "source": EchoKind.summary} in zoo("list", "--json")["kinds"]
    rows = zoo("rank", "--target", "smollm2-135m-instruct", "--gpu", "h100", "--json")["rows"]
    assert f"{NAME}:2" in {row["draft"] for row in rows}  # a default draft of rank: its candidate set
    from specdraft_eval.integration.serving import sglang_args, speculative_config

    assert speculative_config(f"{NAME}:2", 3)["method"] == "ngram"
    with pytest.raises(SpecdecError, match="SGLang has no counterpart"):  # the default refusal, in one line
        sglang_args(f"{NAME}:2", 3)


def test_a_kind_registered_here_drafts_losslessly_in_the_lm_eval_wrapper(echo, tmp_path):
    from support import save_tiny

    from specdraft_eval.integration.lm_eval_model import SpecDecLM

    model = SpecDecLM(pretrained=str(save_tiny(tmp_path / "tiny")), draft=f"{NAME}:2", baseline=True, device="cpu")
    model._model_generate(torch.tensor([[5, 6, 7, 7, 7]]), 5 + 16, [])
    record = model.specdec_info()
    assert record["draft"] == f"{NAME}:2" and record["draft_tokens"] > 0 and record["baseline_mismatches"] == 0


def test_a_kind_must_be_a_draft_kind():
    with pytest.raises(SpecdecError, match="DraftKind subclass"):
        register(lambda arg, target: None)  # the old protocol: a bare build function
