"""``draft=auto`` that measures here: successive halving, tuning inside a run, the results store it reads first."""

from __future__ import annotations

from pathlib import Path

import pytest
from lm_eval.api.instance import Instance
from support import ROOT, save_tiny

from specdraft_eval.drafts.kind import Candidate
from specdraft_eval.integration.autotune import Contender, Halving, halving_cost, most_contenders
from specdraft_eval.measure.stats import GenerationStats
from specdraft_eval.results import store


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


def test_auto_tunes_inside_the_run_then_reads_its_own_result(tiny):
    """A target nothing was measured for: the run's first requests (at most a quarter) try the contenders, the rest
    go to the winner; outputs equal a named draft's (lossless whatever is tried); the record states the trials; the
    result lands in the store, and the next ``auto`` run reads it instead of tuning."""
    from specdraft_eval.integration.lm_eval_model import SpecDecLM

    lm = SpecDecLM(pretrained=str(tiny), draft="auto", device="cpu", kernels="plain", baseline="true")
    outputs = lm.generate_until(_requests(), disable_tqdm=True)
    assert len(lm.plan.auto.tuners["t"].contenders) >= 2
    block = lm.specdec_info()
    tuning = block["tuning"]
    assert 2 <= len(tuning["trials"]) <= 4 and tuning["requests"] <= len(CONTEXTS) // 4
    [chosen] = [t for t in tuning["trials"] if t["chosen"]]
    assert block["draft"] == chosen["draft"] and block["dynamic_gamma"] is True
    assert block["generations"] == len(CONTEXTS) - tuning["requests"]  # the chosen one's own requests
    assert block["baseline_mismatches"] == 0
    trials = [GenerationStats(**t["counters"]) for t in tuning["trials"]]
    whole = sum(trials, GenerationStats(**block["counters"]))  # the run's requests, the tuning's included
    assert tuning["speedup_with_tuning"] == pytest.approx(
        whole.generated_tokens / whole.decode_seconds / (whole.baseline_tokens / whole.baseline_seconds))
    plain = SpecDecLM(pretrained=str(tiny), draft="layers:0", device="cpu", kernels="plain")
    assert outputs == plain.generate_until(_requests(), disable_tqdm=True)
    [stored] = store.entries()
    assert stored.origin == "lm_eval" and stored.record.draft == block["draft"] and stored.record.tuning
    choice = block["auto"]["tasks"]["t"]
    assert choice["draft"] == block["draft"] and "tuned on" in choice["reason"]
    again = SpecDecLM(pretrained=str(tiny), draft="auto", device="cpu", kernels="plain")
    again.generate_until(_requests()[:2], disable_tqdm=True)
    paid = block["speedup"] > 1  # a random tiny model: the winner may still not beat plain decoding
    assert not again.plan.auto.tuners and again.session.drafter.name == (block["draft"] if paid else "prompt-lookup:3")


def test_in_run_tuning_compares_contenders_on_their_own_requests_in_alternating_order(tiny, monkeypatch):
    """Without ``baseline``, the tuning batches are still decoded plainly too, so each contender is scored by its
    speedup on its own requests (not tokens/s of other documents), plain decoding first in every other tuning
    batch whichever contender decodes it; after the decision the run decodes without the baseline it did not ask
    for."""
    from specdraft_eval.engine import session as session_module
    from specdraft_eval.integration.lm_eval_model import SpecDecLM

    order = []
    real = session_module.autoregressive_generate_batch
    for name in ("speculative_generate_batch", "autoregressive_generate_batch"):
        spied = getattr(session_module, name)
        monkeypatch.setattr(session_module, name, lambda *a, _spied=spied, _name=name, **k: order.append(_name[0])
                            or _spied(*a, **k))
    lm = SpecDecLM(pretrained=str(tiny), draft="auto", device="cpu", kernels="plain")
    lm.generate_until(_requests(), disable_tqdm=True)
    block = lm.specdec_info()
    trials = block["tuning"]["trials"]
    assert all(t["speedup"] is not None for t in trials)  # measured against plain decoding of the same requests
    tuned = sum(t["requests"] for t in trials)  # batch size 1: one batch per request
    firsts = order[: 2 * tuned: 2]
    assert firsts == ["s", "a"] * (tuned // 2) + ["s"] * (tuned % 2), order
    assert order[2 * tuned:] == ["s"] * (len(CONTEXTS) - tuned) and block["speedup"] is None
    assert real is not session_module.autoregressive_generate_batch


def test_auto_fixed_never_tunes(tiny):
    from specdraft_eval.integration.lm_eval_model import SpecDecLM

    lm = SpecDecLM(pretrained=str(tiny), draft="auto:fixed", device="cpu", kernels="plain")
    lm.generate_until(_requests(), disable_tqdm=True)
    assert not lm.plan.auto.tuners and lm.session.drafter.name == "prompt-lookup:3"
    assert lm.session.run.gamma.dynamic_gamma


def test_zoo_tune_measures_halves_stores_and_auto_reads_it(tiny, tmp_path):
    """``zoo tune`` on a target nothing was measured for: every contender that loads, halving on held-in prompts
    (the same prompts for every survivor of a round, outputs checked against plain decoding), the winners stored,
    the exhaustive evaluation beside; ``zoo results`` lists them; then ``draft=auto`` reads them instead of tuning."""
    import json

    from support import run_cli

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
    from support import run_cli

    for args in (["tune", "--target", str(tiny), "--task", "nope"], ["tune", "--target", str(tiny), "--budget", "0"],
                 ["results", "--all"], ["results", "--prune"]):
        done = run_cli("zoo", *args)
        assert done.returncode == 1 and "Traceback" not in done.stderr, args
        assert done.stderr.strip().splitlines()[-1].startswith("zoo: error:"), args


def test_task_stops_are_the_task_yamls_until():
    """zoo tune stops where lm_eval does: the bundled tasks' own ``until`` lists."""
    import yaml
    from support import ROOT

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

    from zoo.measure.tune import cached_catalog_drafts

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


def shipped_only(base: Path) -> Path:
    """A package base whose drafts' folder holds the shipped drafts only (not those leaderboard/reproduce.sh built)."""
    for name in ("smollm2-eagle", "smollm2-eagle3", "smollm2-ngram", "data"):
        (base / "leaderboard" / "drafts").mkdir(parents=True, exist_ok=True)
        (base / "leaderboard" / "drafts" / name).symlink_to(ROOT / "leaderboard" / "drafts" / name)
    return base


def test_every_draft_found_is_tried_before_any_drafts_variants(tmp_path, monkeypatch):
    """The shipped drafts are two heads and an n-gram table: the first three contenders pair each with prompt lookup
    (the heads as trees), and the heads' chains come after (a run that can try four tries all three drafts)."""
    from specdraft_eval import published
    from specdraft_eval.integration.autotune import MODEL_FREE_PARTNER, candidate_set

    monkeypatch.setattr(published, "base", lambda: shipped_only(tmp_path))
    drafts = [c.draft for c in candidate_set(30)]
    first = [d.removeprefix(MODEL_FREE_PARTNER + "|") for d in drafts[:3]]
    assert all(d.startswith(MODEL_FREE_PARTNER + "|") for d in drafts[:5])
    assert [d.rsplit("/", 1)[-1] for d in first] == ["smollm2-eagle@2x4", "smollm2-eagle3@2x4", "smollm2-ngram"]
    assert drafts[-4:] == ["layers:0-4", "prompt-lookup", "suffix", "suffix:tree"]


def test_a_whole_model_in_the_drafts_folder_is_found_as_a_draft_model_and_a_bare_head_as_eagle(tmp_path, monkeypatch):
    """What leaderboard/reproduce.sh builds there: a pruned model (tokenizer included) is a draft model, a folder of
    a config and weights only (an EAGLE head, e.g. ``zoo export``'s) a head."""
    from specdraft_eval import published
    from specdraft_eval.integration.autotune import found_drafts

    base = shipped_only(tmp_path)
    pruned = save_tiny(base / "leaderboard" / "drafts" / "pruned")
    head = base / "leaderboard" / "drafts" / "smollm2-eagle-exported"
    head.mkdir()
    (head / "config.json").write_text("{}")
    monkeypatch.setattr(published, "base", lambda: base)
    found = found_drafts()
    assert str(pruned) in found and f"eagle:{pruned}" not in found
    assert f"eagle:{head}" in found


def test_zoo_tune_alternates_which_side_decodes_a_batch_first(tiny, monkeypatch):
    """zoo tune's rounds: plain decoding before the survivors in one batch, after them in the next, across rounds."""
    from support import word_tokenizer
    from transformers import AutoModelForCausalLM

    from specdraft_eval.engine import session as session_module
    from specdraft_eval.engine.params import RunSettings
    from specdraft_eval.engine.session import Session
    from specdraft_eval.integration.autotune import contenders
    from specdraft_eval.models.targets import Target
    from zoo.measure import tune

    order = []
    for module, name in ((tune, "autoregressive_generate_batch"), (session_module, "speculative_generate_batch")):
        spied = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, _spied=spied, _name=name, **k: order.append(_name[0])
                            or _spied(*a, **k))
    model = AutoModelForCausalLM.from_pretrained(tiny)
    target = Target(model, word_tokenizer(["<unk>", "</s>", *[f"w{i}" for i in range(62)]]))
    found, _ = contenders(target, [Candidate("prompt-lookup", (3,)), Candidate("prompt-lookup:2", (3,))])
    sessions = {id(c): Session(model, c.drafter, RunSettings(c.policy)) for c in found}
    prompts = tune._Prompts([[2 + i, 3, 4, 2 + i, 3] for i in range(6)])
    tune._decode_round(model, target.tokenizer, found, sessions, prompts, [0, 1, 2, 3], 2, "specdec_humaneval",
                       lambda *a, **k: None)
    tune._decode_round(model, target.tokenizer, found[:1], sessions, prompts, [4, 5], 2, "specdec_humaneval",
                       lambda *a, **k: None)
    assert order == ["a", "s", "s", "s", "s", "a", "a", "s"]
    assert all(c.stats.speedup for c in found)


def test_auto_decodes_each_task_with_the_configuration_measured_best_on_it(tiny):
    """Measured here (this machine's store): prompt lookup best on one task, a layer view on the other. One run of
    both: each task decodes with its own; the record names each task's choice and holds each configuration's
    counters (one record each, as the store keeps them); a task nobody measured, with too few requests to tune on,
    takes the best across the tasks measured and says so."""
    from specdraft_eval.integration.lm_eval_model import SpecDecLM
    from specdraft_eval.measure.environment import hardware
    from specdraft_eval.results.record import Runtime, SpecdecRecord

    def measured(draft: str, speedups: dict[str, float]) -> None:
        per_task = {task: GenerationStats(generations=4, steps=10, draft_tokens=20, accepted_tokens=8,
                                          generated_tokens=18, decode_seconds=1.0, baseline_tokens=18,
                                          baseline_seconds=speedup) for task, speedup in speedups.items()}
        record = SpecdecRecord.new(str(tiny), draft, 4, True, "cpu", per_task,
                                   runtime=Runtime("float32", "plain", False, False, "sdpa"))
        assert record.hardware == hardware("cpu")
        store.save(record, "zoo tune")

    measured("prompt-lookup:3", {"he": 1.6, "mmlu": 1.1})
    measured("layers:0", {"he": 1.2, "mmlu": 1.3})
    requests = [*_requests(CONTEXTS[:3]), *_requests(CONTEXTS[3:6]), *_requests(CONTEXTS[6:8])]
    for request, task in zip(requests, ["he"] * 3 + ["mmlu"] * 3 + ["new"] * 2, strict=True):
        request.task_name = task
    lm = SpecDecLM(pretrained=str(tiny), draft="auto", device="cpu", kernels="plain")
    lm.generate_until(requests, disable_tqdm=True)
    block = lm.specdec_info()
    chosen = {task: choice["draft"] for task, choice in block["auto"]["tasks"].items()}
    assert chosen == {"he": "prompt-lookup:3", "mmlu": "layers:0", "new": "prompt-lookup:3"}
    assert "on he" in block["auto"]["tasks"]["he"]["reason"]
    assert "new: measured by none" in block["auto"]["tasks"]["new"]["reason"] and "too few" in \
        block["auto"]["tasks"]["new"]["reason"]
    records = SpecdecRecord.from_block(block).flat()
    assert {r.draft: sorted(r.per_task) for r in records} == {"prompt-lookup:3": ["he", "new"], "layers:0": ["mmlu"]}
    assert sum(r.total.generations for r in records) == 8


def test_a_group_of_subtasks_is_one_task():
    """lm-eval's own index: MMLU's 57 subtasks, all in the run, are the task ``mmlu``; a group the run holds only
    part of is not, and tasks of no group (or an --include_path's) are their own."""
    from specdraft_eval.integration.task_groups import groups_of

    subjects = ["abstract_algebra", "anatomy", "astronomy", "business_ethics", "clinical_knowledge",
                "college_biology", "college_chemistry", "college_computer_science", "college_mathematics",
                "college_medicine", "college_physics", "computer_security", "conceptual_physics", "econometrics",
                "electrical_engineering", "elementary_mathematics", "formal_logic", "global_facts",
                "high_school_biology", "high_school_chemistry", "high_school_computer_science",
                "high_school_european_history", "high_school_geography", "high_school_government_and_politics",
                "high_school_macroeconomics", "high_school_mathematics", "high_school_microeconomics",
                "high_school_physics", "high_school_psychology", "high_school_statistics", "high_school_us_history",
                "high_school_world_history", "human_aging", "human_sexuality", "international_law", "jurisprudence",
                "logical_fallacies", "machine_learning", "management", "marketing", "medical_genetics",
                "miscellaneous", "moral_disputes", "moral_scenarios", "nutrition", "philosophy", "prehistory",
                "professional_accounting", "professional_law", "professional_medicine", "professional_psychology",
                "public_relations", "security_studies", "sociology", "us_foreign_policy", "virology",
                "world_religions"]
    mmlu = [f"mmlu_{s}" for s in subjects]
    groups = groups_of([*mmlu, "gsm8k", "specdec_humaneval"])
    assert {groups[t] for t in mmlu} == {"mmlu"} and groups["gsm8k"] == "gsm8k"
    assert groups["specdec_humaneval"] == "specdec_humaneval"
    assert set(groups_of([*mmlu[:5], "gsm8k"]).values()) == {*mmlu[:5], "gsm8k"}
    assert groups_of(["mmlu_anatomy"]) == {"mmlu_anatomy": "mmlu_anatomy"}


def test_batch_size_auto_plans_with_the_batch_size_it_will_run(tiny, monkeypatch):
    """--batch_size auto: draft=auto looks up and plans its tuning with the size lm-eval's detection finds (the CPU
    rule: what fits in half the memory, at most 64), not with 1."""
    from specdraft_eval.integration import auto
    from specdraft_eval.integration.lm_eval_model import SpecDecLM

    planned = []
    monkeypatch.setattr(auto.AutoRun, "start", lambda self, task, requests, batch_size: planned.append(batch_size)
                        or self._choose(task, auto.Choice("prompt-lookup:3", 4, True, "test")))
    lm = SpecDecLM(pretrained=str(tiny), draft="auto", device="cpu", kernels="plain", batch_size="auto")
    lm.generate_until(_requests(CONTEXTS[:2]), disable_tqdm=True)
    assert planned == [lm._detect_batch_size()] and planned[0] == 64
