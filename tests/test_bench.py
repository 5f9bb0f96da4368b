"""``zoo bench`` on a tiny random-weight model: every configuration's tokens and the result's schema."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import run_cli

from specdraft_eval import load_draft, load_target
from specdraft_eval.errors import SpecdecError
from specdraft_eval.results.profiles import Spread
from zoo.measure.bench import render
from zoo.measure.bench import result as bench_result
from zoo.measure.bench import run as bench_run
from zoo.measure.prompts import load_prompts

WORDS = ["<unk>", "</s>", *[f"w{i}" for i in range(62)]]


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    lines = [{"prompt": " ".join(WORDS[2 + (i * 7 + j) % 20] for j in range(12))} for i in range(3)]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    return path


def test_bench_runs_every_configuration_with_identical_tokens(tiny, prompts_file):
    loaded = load_target(str(tiny))
    target, tokenizer = loaded.model, loaded.tokenizer
    drafters = [load_draft(name, loaded) for name in ("prompt-lookup", "layers:0-1")]
    prompts = load_prompts(None, prompts_file, 3)
    result = bench_run.run_bench(target, str(tiny), tokenizer, drafters, prompts, bench_result.BenchPlan(3, 2, 10))
    data = result.to_json()
    rows = data["configs"]
    assert [(r["engine"], r["draft"]) for r in rows] == [
        (bench_result.AUTOREGRESSIVE, None), (bench_result.OURS_PLAIN, None),
        *[(engine, name) for name in ("prompt-lookup:3", "layers:0,1")
          for engine in (bench_result.ASSISTED, bench_result.OURS, bench_result.OURS_DYNAMIC)],
    ]
    assert all(r["identical"] for r in rows)
    assert {r["generated_tokens"] for r in rows} == {rows[0]["generated_tokens"]}
    assert data["prompts"] == 3 and data["repeats"] == 2 and data["gamma"] == 3
    for row in rows:
        spread = row["tokens_per_second"]
        assert spread["min"] <= spread["median"] <= spread["max"] and spread["min"] > 0
        assert 0 <= row["overhead"] < 1 and row["peak_mb"] > 0
    ours = [r for r in rows if r["engine"] in (bench_result.OURS, bench_result.OURS_DYNAMIC)]
    assert all(r["vs_assisted"] is not None and "predicted_tokens_per_second" not in r for r in ours)
    layered = next(r for r in rows if r["engine"] == bench_result.OURS and r["draft"] == "layers:0,1")
    assert layered["draft_ms_per_token"] > 0 and layered["mean_gamma"] == pytest.approx(3, abs=1)
    assert layered["draft_weights_mb"] == 0.0  # a layer view shares the target's weights
    assert set(layered["acceptance"]) == {"mean_acceptance_length", "acceptance_rate_per_position",
                                          "conditional_acceptance_per_position", "accept_length",
                                          "mean_accepted_tokens"}
    assert layered["acceptance"]["mean_accepted_tokens"] == layered["tar"]
    assert rows[0]["tar"] == 1  # autoregressive: one token per target call
    assert rows[1]["vs_ours_plain"]["median"] == 1.0 and all(r["vs_ours_plain"]["median"] > 0 for r in rows)


def test_bench_catches_a_draft_that_changes_the_output(tiny, prompts_file, monkeypatch):
    """A broken verifier (accepting every draft token) must be reported, not hidden."""
    from specdraft_eval.engine import verify

    monkeypatch.setattr(verify, "accept", lambda logits, proposals, samplers: [(list(range(len(p.tokens))), 5)
                                                                               for p in proposals])
    loaded = load_target(str(tiny))
    target, tokenizer = loaded.model, loaded.tokenizer
    drafter = load_draft("layers:0", loaded)
    result = bench_run.run_bench(target, str(tiny), tokenizer, [drafter], load_prompts(None, prompts_file, 1),
                                 bench_result.BenchPlan(2, 1, 8))
    identical = {r.engine: r.identical for r in result.configs}
    assert identical[bench_result.AUTOREGRESSIVE] and identical[bench_result.ASSISTED]
    assert not identical[bench_result.OURS]
    assert not identical[bench_result.OURS_PLAIN]  # our plain decoding goes through the same (broken) verifier
    with pytest.raises(SpecdecError, match=r"specdraft plain \(None, plain kernels\) differs .* on prompt 0 \('w"):
        bench_result.check_lossless(result, load_prompts(None, prompts_file, 1))


def test_bench_compile_runs_compiled_configurations_beside_the_eager_ones(tiny, prompts_file, monkeypatch):
    """``--compile``: ours and transformers' generate also compiled (dynamo with its eager backend here: the same
    guards and counts as inductor, quickly), on the plain-kernel copy; the warm-up compiled every width of ours, so
    its timed runs compile nothing; tokens identical throughout."""
    import torch

    from specdraft_eval.engine import graphs
    from specdraft_eval.models.targets import LoadSettings

    real = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: real(fn, **{**kw, "backend": "eager", "mode": None}))
    monkeypatch.setattr(graphs, "STATIC_CACHES", graphs.StaticCachesByModel())  # fresh ones, the old back after
    torch._dynamo.reset()
    plan = bench_result.BenchPlan(2, 1, 8, compile=True)
    result = bench_run.bench(str(tiny), ["prompt-lookup"], load_prompts(None, prompts_file, 2), plan,
                             LoadSettings.of("cpu", "float32", "onednn"))
    compiled = [r for r in result.configs if r.compiled]
    assert [(r.engine, r.kernels) for r in compiled] == [
        (bench_result.AUTOREGRESSIVE, "plain"), (bench_result.OURS_PLAIN, "plain"), (bench_result.OURS, "plain"),
        (bench_result.OURS_DYNAMIC, "plain")]
    assert all(r.identical for r in result.configs) and result.lossless.startswith("every output identical")
    ours = [r for r in compiled if r.engine != bench_result.AUTOREGRESSIVE]
    assert all(r.timed_compiles == 0 and r.warm_up_seconds > 0 for r in ours)
    assert next(r for r in ours if r.engine == bench_result.OURS_PLAIN).vs_ours_plain.median == 1.0
    eager = {(r.engine, r.draft): r for r in result.configs if not r.compiled and r.kernels == "plain"}
    for row in ours:  # timed by the engine's clock, not the module hooks a compiled step bypasses (issue 39)
        twin = eager.get((row.engine, row.draft)) or next(r for r in result.configs
                                                          if not r.compiled and r.engine == row.engine)
        # fixed γ drafts the same steps compiled or not; dynamic γ chooses γ from the measured (different) latencies
        assert row.engine == bench_result.OURS_DYNAMIC or row.steps.tar == twin.steps.tar, row.engine
        assert row.steps.verify_ms_per_step > 0, row.engine
        assert 0 <= row.overhead < 1, row.engine  # plain decoding's too: the engine's split, not the hooks'
        drafted = row.steps.mean_gamma is not None  # dynamic γ may back off entirely on measured latencies
        assert drafted == (row.engine != bench_result.OURS_PLAIN) or row.engine == bench_result.OURS_DYNAMIC
        assert (row.steps.draft_ms_per_token is None) == (not drafted), row.engine
    rows = render.table_rows(result)
    assert {"compiled", "warm-up s", "timed compiles"} <= set(rows[0])
    torch._dynamo.reset()


@pytest.mark.slow  # a real CLI run of some length: the full suite runs it
def test_bench_cli_json_and_table(tiny, prompts_file):
    done = run_cli("zoo", "bench", "--target", str(tiny), "--prompts", str(prompts_file), "--limit", "2",
                   "--repeats", "1", "--max-new-tokens", "6", "--gamma", "2", "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    data = json.loads(done.stdout)
    assert data["schema_version"] == bench_result.SCHEMA_VERSION and data["task"] is None
    # same kernels: autoregressive, assisted, ours, ours dynamic; then transformers on plain kernels
    assert [(r["engine"], r["kernels"]) for r in data["configs"]] == [
        (bench_result.AUTOREGRESSIVE, "onednn"), (bench_result.OURS_PLAIN, "onednn"), (bench_result.ASSISTED,
                                                                                       "onednn"), (bench_result.OURS,
                                                                                                   "onednn"),
        (bench_result.OURS_DYNAMIC, "onednn"), (bench_result.AUTOREGRESSIVE, "plain"), (bench_result.ASSISTED, "plain")]
    assert not any(r["compiled"] for r in data["configs"])
    assert all(r["identical"] for r in data["configs"])
    assert all(r["vs_plain_assisted"] for r in data["configs"] if r["engine"] == bench_result.OURS)
    table = run_cli("zoo", "bench", "--target", str(tiny), "--prompts", str(prompts_file), "--limit", "1",
                    "--repeats", "1", "--max-new-tokens", "4", "--drafts", "layers:0")
    assert table.returncode == 0, table.stderr[-2000:]
    assert "×assisted" in table.stdout and "specdraft dynamic γ" in table.stdout


@pytest.mark.parametrize("content,message", [
    ("not json", "is not JSON/JSONL"),
    ("[]", "must hold non-empty strings"),
    ('[{"text": "a"}]', "must hold non-empty strings"),
])
def test_bench_bad_prompts_file(tiny, tmp_path, content, message):
    path = tmp_path / "prompts.json"
    path.write_text(content)
    done = run_cli("zoo", "bench", "--target", str(tiny), "--prompts", str(path))
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("zoo: error:") and message in done.stderr


def test_bench_bad_options(tiny, prompts_file):
    for args, message in [(["--gamma", "0"], "bad --gamma"), (["--gamma", "2,4"], "runs one γ"), (["--limit", "0"],
                                                                                                  "--limit 0"),
                          (["--dtype", "int8"], "bad --dtype"), (["--task", "specdec_humaneval"], "not both"),
                          (["--compile", "--batch-size", "1,2"], "drop --batch-size or --compile")]:
        done = run_cli("zoo", "bench", "--target", str(tiny), "--prompts", str(prompts_file), *args)
        assert done.returncode == 1 and message in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_transformers_assistant_gets_constant_gamma_from_its_own_config(tiny):
    """transformers reads the assistant's schedule from the assistant's generation config: bench sets it there
    for the run (constant γ, no confidence stop) and restores the draft's own afterwards."""
    loaded = load_target(str(tiny))
    drafter = load_draft(str(tiny), loaded)
    own = drafter.model.generation_config
    kwargs = bench_run.assisted_kwargs(drafter, 3)
    with bench_run._assistant_settings(kwargs):
        config = drafter.model.generation_config
        assert config is not own
        assert (config.num_assistant_tokens, config.num_assistant_tokens_schedule,
                config.assistant_confidence_threshold) == (3, "constant", 0.0)
    assert drafter.model.generation_config is own


def test_reduced_precision_near_ties_are_numerics_and_everything_else_fails():
    """The rule: in bfloat16/float16 a divergence within NEAR_TIE_LOGIT_MARGIN is counted as numerics; a larger
    margin, an unknown one, or any divergence in float32 is a losslessness failure."""

    assert bench_result.near_tie(0.2, "bfloat16") and bench_result.near_tie(-0.2, "float16")
    assert not bench_result.near_tie(2.0, "bfloat16") and not bench_result.near_tie(0.01, "float32")
    assert not bench_result.near_tie(None, "bfloat16")

    def result(dtype: str, margin: float | None) -> bench_result.BenchResult:
        one = Spread.of([1.0])
        row = bench_result.BenchRow(bench_result.OURS, "plain", "prompt-lookup:3", 3, False, [0], [margin],
                                    int(bench_result.near_tie(margin, dtype)), 8, one, one, one, 0.0,
                                    None, 0.0, bench_result.StepFigures(None, None, None, None))
        return bench_result.BenchResult("t", dtype, False, "cpu", 3, 8, 1, 1, [row])

    assert "1 divergence(s), each a bfloat16 near-tie" in bench_result.check_lossless(result("bfloat16", 0.25), ["p"])
    for dtype, margin in (("bfloat16", 3.0), ("bfloat16", None), ("float32", 0.01)):
        with pytest.raises(SpecdecError, match="losslessness bug"):
            bench_result.check_lossless(result(dtype, margin), ["p"])


def test_batch_study_cli_json_and_table(tiny, prompts_file):
    """``zoo bench --batch-size``: a row per draft and batch size, spreads as median/min/max/n, the largest batch
    that paid, and the table, from the typed study."""
    from zoo.measure.bench.batch import SCHEMA_VERSION

    args = ["zoo", "bench", "--target", str(tiny), "--prompts", str(prompts_file), "--limit", "2", "--repeats", "1",
            "--max-new-tokens", "6", "--batch-size", "1,2"]
    done = run_cli(*args, "--gamma", "4,dynamic", "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    data = json.loads(done.stdout)
    assert data["schema_version"] == SCHEMA_VERSION and data["task"] is None and data["dtype"] == "float32"
    assert [(r["draft"], r["gamma"], r["batch_size"]) for r in data["rows"]] == [
        ("prompt-lookup:3", "4", 1), ("prompt-lookup:3", "4", 2),
        ("prompt-lookup:3", "dynamic", 1), ("prompt-lookup:3", "dynamic", 2)]
    for row in data["rows"]:
        assert set(row["tokens_per_second"]) == {"median", "min", "max", "n"} and row["tokens_per_second"]["n"] == 1
        assert row["speedup"] > 0 and row["peak_mb"] > 0 and row["host_reads_per_pass"] > 0
    for label in ("4", "dynamic"):
        paying = [r["batch_size"] for r in data["rows"] if r["gamma"] == label and r["speedup"] > 1]
        assert data["pays_up_to_batch"][f"prompt-lookup:3 γ={label}"] == (max(paying) if paying else None)
    from specdraft_eval.results import store  # each configuration measured went to this machine's results store

    stored = [(s.origin, s.record.draft, s.record.num_draft_tokens, s.record.dynamic_gamma, s.record.batch_size)
              for s in store.entries()]
    assert stored == [("zoo bench", "prompt-lookup:3", 4, dynamic, size) for dynamic in (False, True)
                      for size in (1, 2)]
    assert all(s.record.total.speedup for s in store.entries())
    table = run_cli(*args)
    assert table.returncode == 0, table.stderr[-2000:]
    assert "plain tok/s" in table.stdout and "prompt-lookup:3 γ=4: speculation pays" in table.stdout
