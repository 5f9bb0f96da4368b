"""``score=draft``: log-likelihood requests scored by the draft's own model (a draft's language-modelling quality
for the leaderboard's TAR-vs-LM figure), checked against the same layers saved as a standalone model."""

from __future__ import annotations

import pytest
from lm_eval.api.instance import Instance
from support import run_cli

from specdraft_eval.errors import SpecdecError


def requests() -> list[Instance]:
    pairs = [("w1 w2 w3", " w4 w5"), ("w7 w8 w9 w10 w11", " w12"), ("w3", " w3 w3 w3 w3")]
    return [Instance("loglikelihood", {}, pair, i) for i, pair in enumerate(pairs)]


def test_score_draft_equals_the_same_layers_scored_as_a_target(tiny, tmp_path):
    from specdraft_eval.integration.lm_eval_model import SpecDecLM

    pruned = tmp_path / "pruned"
    done = run_cli("zoo", "prune", str(tiny), "--keep", "0,2", "--out", str(pruned))
    assert done.returncode == 0, done.stderr[-2000:]
    view = SpecDecLM(pretrained=str(tiny), draft="layers:0,2", score="draft", device="cpu")
    alone = SpecDecLM(pretrained=str(pruned), device="cpu")
    target = SpecDecLM(pretrained=str(tiny), draft="layers:0,2", device="cpu")
    scored = [ll for ll, _ in view.loglikelihood(requests())]
    assert scored == pytest.approx([ll for ll, _ in alone.loglikelihood(requests())], rel=1e-4, abs=1e-4)
    assert scored != pytest.approx([ll for ll, _ in target.loglikelihood(requests())], rel=1e-2)
    assert view.specdec_info()["runtime"]["score"] == "draft" and target.specdec_info()["runtime"]["score"] == "target"


@pytest.mark.parametrize("draft, score, message", [
    ("prompt-lookup", "draft", "score=draft needs a draft that is a language model"),
    ("layers:0,1", "drafts", "model_args score='drafts': use score=target or score=draft"),
])
def test_score_errors_say_the_fix(tiny, draft, score, message):
    from specdraft_eval.integration.lm_eval_model import SpecDecLM

    with pytest.raises(SpecdecError, match=message):
        SpecDecLM(pretrained=str(tiny), draft=draft, score=score, device="cpu")
