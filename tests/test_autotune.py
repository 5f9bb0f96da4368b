"""``draft=auto`` that measures here: successive halving, tuning inside a run, the results store it reads first."""

from __future__ import annotations

import pytest
from conftest import save_tiny
from lm_eval.api.instance import Instance

from specdraft_eval.drafts.kind import Candidate
from specdraft_eval.integration.autotune import Contender, Halving, halving_cost, most_contenders
from specdraft_eval.measure import store
from specdraft_eval.measure.stats import GenerationStats


def test_halving_costs_and_budgets():
    """Every survivor one batch, then the better half two each, ...: 4 contenders take 4 + 2x2 batches."""
    assert [halving_cost(n) for n in (1, 2, 3, 4, 8)] == [0, 2, 7, 8, 24]
    assert [most_contenders(b) for b in (0, 2, 7, 8, 10, 24)] == [1, 2, 3, 4, 4, 8]


def _contender(name: str, seconds: float) -> Contender:
    return Contender(Candidate(name, (4,)), drafter=None,
                     stats=GenerationStats(generated_tokens=10, decode_seconds=seconds, baseline_tokens=10,
                                           baseline_seconds=1.0), requests=1)


def test_halving_keeps_the_faster_half_until_one_is_left():
    contenders = [_contender(name, s) for name, s in (("a", 1.0), ("b", 0.5), ("c", 0.8), ("d", 2.0))]
    halving = Halving(contenders)
    rounds = [[c.candidate.draft for c in alive] for alive in halving.rounds()]
    assert rounds == [["a", "b", "c", "d"], ["b", "c"]]  # speedups 1, 2, 1.25, 0.5: b and c go on, then b wins
    assert halving.winner.candidate.draft == "b" and [c.rounds for c in contenders] == [1, 2, 2, 1]


CONTEXTS = [" ".join(f"w{(i + j) % 7 + 2}" for j in range(12 + i % 5)) for i in range(16)]  # repetitive: lookup pays


def _requests(contexts=CONTEXTS) -> list[Instance]:
    requests = [Instance("generate_until", {}, (c, {"until": ["w63"], "max_gen_toks": 16}), i, ("t", i, 0))
                for i, c in enumerate(contexts)]
    for request in requests:
        request.task_name = "t"
    return requests


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("tiny") / "tiny-target")


def test_auto_tunes_inside_the_run_then_reads_its_own_result(tiny):
    """A target nothing was measured for: the run's first requests (at most a quarter) try the contenders, the rest
    go to the winner; outputs equal a named draft's (lossless whatever is tried); the record states the trials; the
    result lands in the store, and the next ``auto`` run reads it instead of tuning."""
    from specdraft_eval.integration.lm_eval_model import SpecDecLM

    lm = SpecDecLM(pretrained=str(tiny), draft="auto", device="cpu", kernels="plain", baseline="true")
    assert lm._tuner is not None and len(lm._tuner.contenders) >= 3
    outputs = lm.generate_until(_requests(), disable_tqdm=True)
    block = lm.specdec_info()
    tuning = block["tuning"]
    assert 2 <= len(tuning["trials"]) <= 4 and tuning["requests"] <= len(CONTEXTS) // 4
    [chosen] = [t for t in tuning["trials"] if t["chosen"]]
    assert block["draft"] == chosen["draft"] and block["dynamic_gamma"] is True
    assert block["generations"] == len(CONTEXTS) - tuning["requests"]  # the chosen one's own requests
    assert block["baseline_mismatches"] == 0 and tuning["speedup_with_tuning"] > 0
    plain = SpecDecLM(pretrained=str(tiny), draft="layers:0", device="cpu", kernels="plain")
    assert outputs == plain.generate_until(_requests(), disable_tqdm=True)
    [stored] = store.entries()
    assert stored.origin == "lm_eval" and stored.record.draft == block["draft"] and stored.record.tuning
    again = SpecDecLM(pretrained=str(tiny), draft="auto", device="cpu", kernels="plain")
    paid = block["speedup"] > 1  # a random tiny model: the winner may still not beat plain decoding
    assert again._tuner is None and again.session.drafter.name == (block["draft"] if paid else "prompt-lookup:3")


def test_auto_fixed_never_tunes(tiny):
    from specdraft_eval.integration.lm_eval_model import SpecDecLM

    lm = SpecDecLM(pretrained=str(tiny), draft="auto:fixed", device="cpu", kernels="plain")
    assert lm._tuner is None and lm.session.drafter.name == "prompt-lookup:3" and lm.session.run.gamma.dynamic


def test_zoo_tune_measures_halves_stores_and_auto_reads_it(tiny, tmp_path):
    """``zoo tune`` on a target nothing was measured for: every contender that loads, halving on held-in prompts
    (the same prompts for every survivor of a round, outputs checked against plain decoding), the winners stored,
    the exhaustive evaluation beside; ``zoo results`` lists them; then ``draft=auto`` reads them instead of tuning."""
    import json

    from conftest import run_cli

    from specdraft_eval.integration.recommend import recommend
    from specdraft_eval.measure.environment import hardware

    done = run_cli("zoo", "tune", "--target", str(tiny), "--budget", "5", "--first-prompts", "1", "--evaluate", "3",
                   "--kernels", "plain", "--plot", str(tmp_path / "tune.png"), "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    rows = result["rows"]
    assert len(rows) >= 3 and sum(r["chosen"] for r in rows) == 1 and rows[0]["chosen"]
    assert max(r["rounds"] for r in rows) >= 2 and all(r["evaluated_speedup"] for r in rows)
    assert any("leaderboard/drafts" in line for line in result["skipped"])  # shipped drafts of another target
    assert (tmp_path / "tune.png").stat().st_size > 1000
    listed = json.loads(run_cli("zoo", "results", "--json").stdout)["results"]
    assert {r["origin"] for r in listed} == {"zoo tune"} and len(listed) == len(result["stored"])
    assert result["chosen"]["draft"] in {r["draft"] for r in listed}
    choice = recommend(str(tiny), hardware=hardware("cpu"))
    assert not choice.tune and all(c.own for c in choice.candidates)
    pruned = run_cli("zoo", "results", "--prune", "--target", str(tiny), "--json")
    assert pruned.returncode == 0 and len(json.loads(pruned.stdout)["removed"]) == len(listed)
    assert recommend(str(tiny), hardware=hardware("cpu")).tune


def test_zoo_tune_and_results_refuse_bad_input_in_one_line(tiny):
    from conftest import run_cli

    for args in (["tune", "--target", str(tiny), "--task", "nope"], ["tune", "--target", str(tiny), "--budget", "0"],
                 ["results", "--stale"], ["results", "--prune"]):
        done = run_cli("zoo", *args)
        assert done.returncode == 1 and "Traceback" not in done.stderr, args
        assert done.stderr.strip().splitlines()[-1].startswith("zoo: error:"), args


def test_task_stops_are_the_task_yamls_until():
    """zoo tune stops where lm_eval does: the bundled tasks' own ``until`` lists."""
    import yaml
    from conftest import ROOT

    from specdraft_eval.integration.offline_data import TASK_STOPS

    class Loader(yaml.SafeLoader):  # the YAMLs' `!function` tags name lm-eval's hooks; their values are not read here
        pass

    Loader.add_constructor("!function", lambda loader, node: None)
    for task, stops in TASK_STOPS.items():
        config = yaml.load((ROOT / "tasks" / f"{task}.yaml").read_text(), Loader=Loader)  # noqa: S506
        assert config["generation_kwargs"]["until"] == stops


def test_zoo_tune_finds_catalog_drafts_in_the_hf_cache(tmp_path, monkeypatch):
    """A catalog draft of the target's family in the Hugging Face cache (its layout: models--ORG--NAME/refs/main and
    snapshots/REV/) becomes a contender by hub id; the target itself and drafts not downloaded do not."""
    import huggingface_hub.constants as hub

    from zoo.tune import cached_catalog_drafts

    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(tmp_path))
    for repo in ("HuggingFaceTB/SmolLM2-135M-Instruct", "HuggingFaceTB/SmolLM2-360M-Instruct"):
        folder = tmp_path / f"models--{repo.replace('/', '--')}"
        (folder / "refs").mkdir(parents=True)
        (folder / "refs" / "main").write_text("abc123")
        (folder / "snapshots" / "abc123").mkdir(parents=True)
        (folder / "snapshots" / "abc123" / "config.json").write_text("{}")
    assert cached_catalog_drafts("smollm2-135m-instruct") == ["HuggingFaceTB/SmolLM2-360M-Instruct"]
    assert cached_catalog_drafts("/some/unknown-model") == []
    (tmp_path / "models--HuggingFaceTB--SmolLM2-360M-Instruct" / "snapshots" / "abc123" / "config.json").unlink()
    assert cached_catalog_drafts("smollm2-135m-instruct") == []


def test_every_draft_found_is_tried_before_any_drafts_variants():
    """The shipped drafts are two heads and an n-gram table: the first three contenders pair each with prompt lookup
    (the heads as trees), and the heads' chains come after (a run that can try four tries all three drafts)."""
    from specdraft_eval.integration.autotune import MODEL_FREE_PARTNER, candidate_set

    drafts = [c.draft for c in candidate_set(30)]
    first = [d.removeprefix(MODEL_FREE_PARTNER + "|") for d in drafts[:3]]
    assert all(d.startswith(MODEL_FREE_PARTNER + "|") for d in drafts[:5])
    assert [d.rsplit("/", 1)[-1] for d in first] == ["smollm2-eagle@2x4", "smollm2-eagle3@2x4", "smollm2-ngram"]
    assert drafts[-4:] == ["layers:0-4", "prompt-lookup", "suffix", "suffix:tree"]
