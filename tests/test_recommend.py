"""``draft=auto`` / ``zoo recommend``: the fastest measured configuration that loads here, else prompt lookup."""

from __future__ import annotations

import json

import pytest
from support import run_cli, save_tiny, write_result

from specdraft_eval.integration.recommend import recommend
from specdraft_eval.measure.environment import hardware
from specdraft_eval.results.record import Runtime

TARGET = "smollm2-135m-instruct"  # the target write_result records


@pytest.fixture()
def results(tmp_path):
    root = tmp_path / "results"
    # speedups (humaneval, mmlu_cot): prompt lookup 1.2x/1.11x, the layer view 2.4x/1.11x, a missing draft 3.6x/1.11x
    for i, draft in enumerate(["prompt-lookup:3", "layers:0,1,2,3,4", "drafts/missing"]):
        write_result(root / str(i), draft, 1.0 + i)
    return root


def test_the_fastest_loadable_configuration_wins(results):
    choice = recommend(TARGET, results=[results])
    assert (choice.draft, choice.num_draft_tokens, choice.dynamic_gamma) == ("layers:0,1,2,3,4", 3, False)
    assert "1.63x plain decoding (geometric mean" in choice.reason  # sqrt(2.4 * 1.11)
    missing = next(c for c in choice.candidates if c.key.draft == "drafts/missing")
    assert not missing.loadable and missing.score > 1.63  # faster, but it does not load here
    assert recommend(TARGET, "specdec_mmlu_cot", [results]).draft == "prompt-lookup:3"  # ties: the first scanned


def test_measurements_from_this_hardware_come_first(results):
    """The records say "CPU: ..." (write_result runs on the CPU): on another machine they still answer, but say so."""
    from specdraft_eval.measure.environment import hardware

    here = recommend(TARGET, results=[results], hardware=hardware("cpu"))
    assert here.draft == "layers:0,1,2,3,4" and "not this machine" not in here.reason
    elsewhere = recommend(TARGET, results=[results], hardware="NVIDIA H100 80GB HBM3")
    assert elsewhere.draft == "layers:0,1,2,3,4" and "not this machine (NVIDIA H100 80GB HBM3)" in elsewhere.reason
    write_result(results / "h100", "prompt-lookup:3", 1.0)  # slower, but measured on the H100
    data = next((results / "h100").glob("*.json"))
    data.write_text(data.read_text().replace(hardware("cpu"), "NVIDIA H100 80GB HBM3"))
    assert recommend(TARGET, "specdec_humaneval", [results], "NVIDIA H100 80GB HBM3").draft == "prompt-lookup:3"


def test_a_configuration_measured_in_vllm_is_never_our_engines_choice_and_is_vllms(tmp_path):
    """vLLM's speed says nothing of ours: engine=vllm's records (the engine in their runtime) are candidates only
    for engine=vllm, even where nothing of ours was measured with the runtime asked for."""
    ours, vllm = Runtime("float32", "onednn", False, False, "sdpa"), Runtime("float32", "vllm", attention="vllm",
                                                                             engine="vllm 0.32.0")
    write_result(tmp_path / "ours", "layers:0,1,2,3,4", 2.0, runtime=ours)
    write_result(tmp_path / "vllm", "prompt-lookup:3", 4.0, runtime=vllm)  # faster, in vLLM
    here = hardware("cpu")
    for runtime in (ours, Runtime("bfloat16", "plain", False, False, "sdpa")):
        assert recommend(TARGET, results=[tmp_path], hardware=here, runtime=runtime).draft == "layers:0,1,2,3,4"
    theirs = recommend(TARGET, results=[tmp_path], hardware=here, engine="vllm")
    assert (theirs.draft, theirs.runtime) == ("prompt-lookup:3", vllm)
    assert [c.key.runtime.engine for c in theirs.candidates] == ["vllm 0.32.0"]
    (tmp_path / "vllm").rename(tmp_path.parent / "elsewhere")
    nothing = recommend(TARGET, results=[tmp_path], hardware=here, engine="vllm")
    assert nothing.draft == "prompt-lookup" and not nothing.dynamic_gamma  # (vLLM has no dynamic γ)
    assert "no configuration measured in vllm" in nothing.reason


def test_auto_picks_the_run_of_the_runtime_it_runs_else_says_which_it_used(tmp_path):
    """A compiled run measured faster than an eager one: eager ``auto`` takes the eager run; a runtime nobody
    measured takes the fastest and names the runtime it was measured with."""
    eager, compiled = Runtime("float32", "onednn", False, False, "sdpa"), Runtime("float32", "plain", True, True,
                                                                                  "sdpa")
    write_result(tmp_path / "eager", "layers:0,1,2,3,4", 2.0, runtime=eager)
    write_result(tmp_path / "compiled", "prompt-lookup:3", 4.0, runtime=compiled)
    here = hardware("cpu")
    choice = recommend(TARGET, results=[tmp_path], hardware=here, runtime=eager)
    assert (choice.draft, choice.runtime) == ("layers:0,1,2,3,4",
                                              eager) and "not the one asked for" not in choice.reason
    assert recommend(TARGET, results=[tmp_path], hardware=here, runtime=compiled).draft == "prompt-lookup:3"
    bf16 = Runtime("bfloat16", "onednn", False, False, "sdpa")
    other = recommend(TARGET, results=[tmp_path], hardware=here, runtime=bf16)
    assert other.draft == "prompt-lookup:3"
    assert f"runtime {compiled}, not the one asked for ({bf16}): none measured with it" in other.reason


def test_results_of_one_configuration_merge_across_files(results):
    """Two files of one configuration: one candidate, the median speedup with its spread, both files named
    (the last file read does not replace the first)."""
    write_result(results / "rerun", "layers:0,1,2,3,4", 3.0)  # 3.6x on HumanEval where the first run had 2.4x
    [layers] = [c for c in recommend(TARGET, results=[results]).candidates if c.key.draft == "layers:0,1,2,3,4"]
    assert len(layers.files) == 2
    assert layers.speedup["specdec_humaneval"] == pytest.approx(3.0)  # the median of 2.4 and 3.6
    assert layers.speedup_spread["specdec_humaneval"] == pytest.approx((2.4, 3.6))


def test_without_a_winner_it_is_prompt_lookup_with_dynamic_gamma(results, tmp_path):
    for choice in (recommend("another-target", results=[results]), recommend(TARGET, results=[tmp_path / "none"])):
        assert (choice.draft, choice.dynamic_gamma) == ("prompt-lookup", True)
        assert "beats plain decoding" in choice.reason


def test_zoo_recommend_cli(results, tmp_path):
    done = run_cli("zoo", "recommend", "--target", TARGET, "--results", str(results), "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["draft"] == "layers:0,1,2,3,4"
    table = run_cli("zoo", "recommend", "--target", TARGET, "--results", str(results), "--task", "specdec_humaneval")
    assert table.returncode == 0 and "draft=auto for smollm2-135m-instruct: draft=layers:0,1,2,3,4" in table.stdout
    assert "loads here" in table.stdout
    bad = run_cli("zoo", "recommend", "--results", str(tmp_path / "nowhere"))
    assert bad.returncode == 1 and "Traceback" not in bad.stderr
    assert bad.stderr.strip().splitlines()[-1].startswith("zoo: error: --results")


def asked_for_auto(monkeypatch, dynamic: bool) -> list[tuple]:
    """``recommend.recommend`` replaced: every (target, task, hardware, runtime, batch size) it is asked, in the list
    returned; it answers ``layers:0`` at γ 2 (dynamic as given)."""
    from specdraft_eval.integration import recommend
    from specdraft_eval.integration.recommend import Recommendation

    asked: list[tuple] = []
    monkeypatch.setattr(recommend, "recommend", lambda target, task, hardware, runtime, batch_size: asked.append(
        (target, task, hardware, runtime, batch_size)) or Recommendation(target, task, "layers:0", 2, dynamic, "test",
                                                                        on_task=True))
    return asked


def test_lm_eval_model_resolves_auto(tmp_path, monkeypatch):
    """draft=auto takes the recommendation's draft, γ and dynamic γ for each task; explicit model_args win."""
    from specdraft_eval.engine.params import GammaPolicy
    from specdraft_eval.integration import lm_eval_model

    tiny = save_tiny(tmp_path / "tiny")
    asked = asked_for_auto(monkeypatch, dynamic=True)
    lm = lm_eval_model.SpecDecLM(pretrained=str(tiny), draft="auto", device="cpu", kernels="plain", static_cache=True)
    lm._task = "t"
    lm.plan.auto.start("t", 4, 1)
    gamma = lm.session.run.gamma
    assert (lm.session.drafter.name, gamma.num_draft_tokens, gamma.dynamic_gamma) == ("layers:0", 2, True)
    # looked up by the target's name and the task on the hardware it runs on, with the runtime it runs
    assert asked == [(str(tiny), "t", hardware("cpu"), Runtime("float32", "plain", True, False, "sdpa"), 1)]
    lm = lm_eval_model.SpecDecLM(pretrained=str(tiny), draft="auto", num_draft_tokens=5, dynamic_gamma="false",
                                 device="cpu")
    lm._task = "t"
    lm.plan.auto.start("t", 4, 1)
    assert lm.session.run.gamma == GammaPolicy(5, False)


def test_zoo_and_lm_eval_resolve_auto_through_the_same_rule(tmp_path, monkeypatch):
    """One rule in one place: ``zoo``'s loading (``zoo.measure.loading.load_one``) and ``lm_eval``'s plan of a run
    (``AutoRun.start``) both reach ``recommend.recommend`` through ``resolve_auto``, the same target name, hardware
    and runtime; zoo asks across tasks at batch 1, lm_eval per task at its batch size (and applies γ)."""
    from specdraft_eval import load_target
    from specdraft_eval.integration import lm_eval_model
    from zoo.measure.loading import load_one

    tiny = save_tiny(tmp_path / "tiny")
    asked = asked_for_auto(monkeypatch, dynamic=False)
    assert load_one(load_target(str(tiny)), "auto").name == "layers:0"
    lm = lm_eval_model.SpecDecLM(pretrained=str(tiny), draft="auto", device="cpu", kernels="plain")
    lm._task = "t"
    lm.plan.auto.start("t", 4, 2)
    assert lm.session.drafter.name == "layers:0"
    (zoo_target, zoo_task, zoo_hw, zoo_runtime, zoo_batch), (lm_target, lm_task, lm_hw, lm_runtime, lm_batch) = asked
    assert zoo_target == lm_target == str(tiny) and zoo_hw == lm_hw == hardware("cpu")
    assert (zoo_task, zoo_batch, lm_task, lm_batch) == (None, 1, "t", 2)
    assert (zoo_runtime.dtype, zoo_runtime.attention) == (lm_runtime.dtype, lm_runtime.attention)


def test_auto_is_resolved_before_loading_and_needs_a_named_target(tmp_path):
    """load_draft never resolves auto itself (one rule, in one place: resolve_auto); a target built in code has no
    name to look results up by: one line each, saying what to do."""
    from specdraft_eval import load_draft, load_target
    from specdraft_eval.errors import SpecdecError
    from specdraft_eval.integration.recommend import resolve_auto, resolve_draft
    from specdraft_eval.models.targets import Target

    target = load_target(str(save_tiny(tmp_path / "tiny")))
    with pytest.raises(SpecdecError, match="resolve it with .*resolve_auto"):
        load_draft("auto", target)
    with pytest.raises(SpecdecError, match="needs a target loaded by name"):
        resolve_auto(Target(target.model, target.tokenizer))
    assert resolve_draft("prompt-lookup", target) == "prompt-lookup"  # anything but auto passes through
    assert resolve_draft("auto", target) == resolve_auto(target).draft  # a tiny target with no results: the fallback


def test_a_published_tree_draft_localises_with_its_shape(tmp_path, monkeypatch):
    """`eagle:leaderboard/drafts/…@2x4` (relative to the published base) resolves to an absolute head directory
    that keeps its tree shape; a missing directory does not load."""
    from specdraft_eval import published
    from specdraft_eval.integration.recommend import localised

    monkeypatch.chdir(tmp_path)
    head = "leaderboard/drafts/smollm2-eagle"
    assert localised(f"eagle:{head}@2x4") == f"eagle:{published.base() / head}@2x4"
    assert localised(f"suffix|eagle:{head}@2x4") == f"suffix|eagle:{published.base() / head}@2x4"
    ngram = "leaderboard/drafts/smollm2-ngram"  # a suffix draft's mode and settings stay
    assert localised(f"suffix:tree:{ngram}?max_spec_factor=2.0") == \
        f"suffix:tree:{published.base() / ngram}?max_spec_factor=2.0"
    assert localised("eagle:nowhere/head@2x4") is None


def _published_and_own(tmp_path, monkeypatch):
    """A published folder and this machine's store (the fixture's empty one) for the tests below."""
    published, mine = tmp_path / "published", tmp_path / "store"
    monkeypatch.setenv("SPECDRAFT_EVAL_STORE", str(mine))
    return published, mine


def test_the_users_own_result_outranks_a_published_row_from_another_machine(tmp_path, monkeypatch):
    """Published: 3x on an H100; the user's store: 1.2x measured here. Here, the user's own result wins and the
    reason names its source; asked for the H100, the published row does."""
    from specdraft_eval.results import store
    from specdraft_eval.results.record import read_results

    published, _ = _published_and_own(tmp_path, monkeypatch)
    elsewhere = write_result(published / "h100", "layers:0,1,2,3,4", 3.0)
    elsewhere.write_text(elsewhere.read_text().replace(hardware("cpu"), "NVIDIA H100 80GB HBM3"))
    mine = write_result(tmp_path / "mine", "prompt-lookup:3", 1.0)
    store.save(read_results(mine).record, "lm_eval")
    choice = recommend(TARGET, results=[published], hardware=hardware("cpu"))
    assert choice.draft == "prompt-lookup:3" and "from this machine's results" in choice.reason
    assert not choice.tune  # measured here: nothing to tune
    assert recommend(TARGET, results=[published], hardware="NVIDIA H100 80GB HBM3").draft == "layers:0,1,2,3,4"
    empty = tmp_path / "empty"
    monkeypatch.setenv("SPECDRAFT_EVAL_STORE", str(empty))
    nothing_here = recommend(TARGET, results=[published], hardware=hardware("cpu"))
    assert nothing_here.tune and nothing_here.draft == "layers:0,1,2,3,4"  # auto:fixed takes it; auto tunes


def test_a_published_row_from_older_code_never_outranks_one_from_todays(tmp_path, monkeypatch):
    """Two published rows on this machine: 3x by specdraft-eval 0.0.1, 1.2x by today's: today's wins; with today's
    measured elsewhere, the older one here does (a speedup on another machine says little about this one)."""
    import json

    from specdraft_eval.measure.environment import versions

    published, _ = _published_and_own(tmp_path, monkeypatch)
    older = write_result(published / "old", "layers:0,1,2,3,4", 3.0)
    data = json.loads(older.read_text())
    data["config"]["specdec"]["versions"]["specdraft-eval"] = "0.0.1"
    older.write_text(json.dumps(data))
    today = write_result(published / "new", "prompt-lookup:3", 1.0)
    assert json.loads(today.read_text())["config"]["specdec"]["versions"]["specdraft-eval"] == versions()[
        "specdraft-eval"]
    choice = recommend(TARGET, results=[published], hardware=hardware("cpu"))
    assert choice.draft == "prompt-lookup:3"
    today.write_text(today.read_text().replace(hardware("cpu"), "NVIDIA H100 80GB HBM3"))
    assert recommend(TARGET, results=[published], hardware=hardware("cpu")).draft == "layers:0,1,2,3,4"
    [old] = [c for c in recommend(TARGET, results=[published]).candidates if c.code_version == "0.0.1"]
    assert old.score > 1.5  # faster, but older code


def test_zoo_rank_takes_tar_from_this_machines_results_first(tmp_path, monkeypatch):
    """Published TAR 2.2 for prompt-lookup:3 at γ 3; the user's store: TAR 1.6 measured here. zoo rank's TAR is
    the user's, and its source says so; without a store entry, the published one."""
    from specdraft_eval.results import store
    from specdraft_eval.results.record import read_results, scan_results
    from zoo.measure.rank import tar_from_results

    published, _ = _published_and_own(tmp_path, monkeypatch)
    write_result(published, "prompt-lookup:3", 1.0, accepted=12)
    mine = store.save(read_results(write_result(tmp_path / "mine", "prompt-lookup:3", 1.0, accepted=6)).record,
                      "lm_eval")
    files = scan_results([mine, published])
    tar, source = tar_from_results(files, TARGET, "specdec_humaneval", "prompt-lookup:3", frozenset([mine]))
    assert tar[3] == pytest.approx(1.6) and source[3].startswith("this machine's results γ=3")
    tar, source = tar_from_results(files, TARGET, "specdec_humaneval", "prompt-lookup:3")
    assert tar[3] == pytest.approx(1.9) and source[3].startswith("results γ=3")  # both merged: (12 + 6) / 20 + 1


def test_evidence_not_source_ranks_the_users_figure_replacing_the_published_one(tmp_path, monkeypatch):
    """Published on this machine: prompt-lookup:3 at 2.4x and a layer view at 1.8x on HumanEval. The user measured
    prompt-lookup:3 here at 1.08x: that replaces its published figure (same configuration), and the faster layer
    view wins, where the user's own result used to outrank every published row whatever its speed."""
    from specdraft_eval.results import store
    from specdraft_eval.results.record import read_results

    published, _ = _published_and_own(tmp_path, monkeypatch)
    write_result(published / "a", "prompt-lookup:3", 2.0)
    write_result(published / "b", "layers:0,1,2,3,4", 1.5)
    task = "specdec_humaneval"
    assert recommend(TARGET, task, results=[published], hardware=hardware("cpu")).draft == "prompt-lookup:3"
    store.save(read_results(write_result(tmp_path / "mine", "prompt-lookup:3", 0.9)).record, "lm_eval")
    choice = recommend(TARGET, task, results=[published], hardware=hardware("cpu"))
    assert choice.draft == "layers:0,1,2,3,4" and choice.on_task and "published" in choice.reason
    [mine] = [c for c in choice.candidates if c.key.draft == "prompt-lookup:3"]
    assert mine.own and mine.speedup[task] == pytest.approx(1.08) and len(mine.files) == 1  # the published one gone


def test_a_task_nobody_measured_takes_the_best_across_the_tasks_measured_and_says_so(tmp_path, monkeypatch):
    published, _ = _published_and_own(tmp_path, monkeypatch)
    write_result(published / "a", "prompt-lookup:3", 2.0)
    choice = recommend(TARGET, "gsm8k", results=[published], hardware=hardware("cpu"))
    assert choice.draft == "prompt-lookup:3" and not choice.on_task and choice.tune
    assert "geometric mean over the tasks measured (gsm8k: measured by none)" in choice.reason
    measured = recommend(TARGET, "specdec_humaneval", results=[published], hardware=hardware("cpu"))
    assert measured.on_task and not measured.tune and "on specdec_humaneval" in measured.reason
