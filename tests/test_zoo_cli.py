"""The real ``zoo`` command on tiny random-weight models (and the catalog)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import assert_one_line_error, run_cli, save_tiny, zoo_json

from specdraft_eval import load_draft, load_target


def test_list_catalog():
    data = zoo_json("list")
    families = {d["family"] for d in data["drafts"]}
    assert {"llama2", "llama3", "vicuna", "opt", "qwen2.5", "smollm2", "gemma2"} <= families
    assert {d["name"] for d in data["kinds"]} >= {"prompt-lookup[:[MIN-]N][xB]", "layers:SPEC", "suffix[:tree][:DIR]"}
    only = zoo_json("list", "--target", "meta-llama/Llama-3.1-8B-Instruct")["drafts"]
    assert {d["family"] for d in only} == {"llama3"}
    table = run_cli("zoo", "list", "--target", "smollm2-135m-instruct")
    assert table.returncode == 0 and "HuggingFaceTB/SmolLM2-360M-Instruct" in table.stdout


def test_prune_writes_a_loadable_draft(tiny, tmp_path):
    out = tmp_path / "d2"
    result = zoo_json("prune", str(tiny), "--layers", "2", "--select", "uniform", "--out", str(out))
    assert result["kept_layers"] == [0, 3]
    meta = json.loads((out / "zoo.json").read_text())
    assert meta["kept_layers"] == [0, 3] and meta["source_layers"] == 4
    loaded = load_target(str(tiny))
    draft = load_draft(str(out), loaded)
    assert draft.model.config.num_hidden_layers == 2


def test_prune_vocab_top_gives_a_reduced_head(tiny, tmp_path):
    out = tmp_path / "small-head"
    result = zoo_json("prune", str(tiny), "--layers", "1", "--vocab-top", "5", "--calibration", "w1 w2 w2 w3 w3 w3 w9",
                      "--out", str(out))
    assert result["vocab_top"] == 5
    ids = json.loads((out / "draft_vocab.json").read_text())
    loaded = load_target(str(tiny))
    tokenizer = loaded.tokenizer
    assert set(tokenizer.convert_tokens_to_ids(["w1", "w2", "w3"])) <= set(ids)
    draft = load_draft(str(out), loaded)
    assert draft.model.lm_head.out_features == len(ids)


def test_prune_block_influence_and_distillation_lower_the_kl(tiny, tmp_path):
    result = zoo_json("prune", str(tiny), "--layers", "2", "--select", "block-influence", "--calibration",
                      "specdec_humaneval", "--distill-tokens", "2048", "--out", str(tmp_path / "d"))
    assert len(result["kept_layers"]) == 2
    assert result["kl_last"] < result["kl_first"]


@pytest.mark.parametrize(
    "args,message",
    [
        (["--layers", "9"], "--layers 9 is outside 1..4"),
        (["--layers", "0"], "--layers 0 is outside 1..4"),
        (["--keep", "0,7"], "layer 7 is out of range"),
        ([], "give exactly one of --layers N or --keep"),
        (["--layers", "2", "--calibration", "/no/such/file.txt"], "cannot read calibration file /no/such/file.txt"),
    ],
)
def test_prune_bad_input(tiny, tmp_path, args, message):
    out = tmp_path / "never"
    assert_one_line_error(run_cli("zoo", "prune", str(tiny), *args, "--out", str(out)), message)
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_prune_refuses_existing_output_and_unknown_model(tiny, tmp_path):
    assert_one_line_error(run_cli("zoo", "prune", str(tiny), "--layers", "1", "--out", str(tmp_path)), "exists")
    assert_one_line_error(run_cli("zoo", "prune", "no-such-model", "--layers", "1", "--out", str(tmp_path / "x")),
                          "unknown model 'no-such-model'")


def test_profile_writes_a_profile(tiny, tmp_path):
    path = tmp_path / "profile.json"
    data = zoo_json("profile", "--target", str(tiny), "--drafts", "prompt-lookup", "--drafts", "layers:0-1",
                    "--gamma", "1,2", "--repeats", "2", "--context", "16", "--out", str(path))
    saved = json.loads(path.read_text())
    assert saved["t_target_ms"] > 0 and set(saved["t_verify_ms"]) == {"0", "1", "2"}
    assert saved["t_target_ms"] == saved["t_verify_ms"]["0"]
    for k, figures in saved["t_verify_spread"].items():
        assert figures["min"] <= figures["median"] == saved["t_verify_ms"][k] <= figures["max"] and figures["n"] == 2
    assert set(saved["drafts"]) == {"prompt-lookup:3", "layers:0,1"}
    assert data["drafts"]["layers:0,1"]["kv_bytes_per_token"] > 0


@pytest.mark.slow  # a real CLI run of some length: the full suite runs it
def test_profile_sweep_covers_depth_and_width_and_is_fitted(tmp_path):
    sweep_file = tmp_path / "sweeps" / "sweep_cpu.json"
    out = zoo_json("profile", "--sweep", "--repeats", "3", "--calibrate", "test-cpu", "--out", str(sweep_file),
                   env={"SPECDRAFT_EVAL_CACHE": str(tmp_path)})
    rows, fit = out["rows"], out["fit"]
    assert {r["group"] for r in rows} == {"equal params", "depth", "width"}
    assert all(r["ms_per_token"] > 0 and r["weight_bytes"] > 0 for r in rows)
    assert fit["per_layer_ms"] > 0 and set(fit["uncertainty"]) >= {"step_ms", "per_layer_ms"}
    # the fitted line, row by row (how close it comes is a measurement, reported, never pass/fail); a bandwidth
    # the sweep could not identify is not stored, and its term is then left out of the fit
    bandwidth = fit["bandwidth_gb_s"]
    assert (bandwidth is None) == (fit["note"] is not None) and (bandwidth is None or bandwidth > 0)
    for r in rows:
        memory = r["weight_bytes"] / bandwidth / 1e6 if bandwidth else 0.0
        assert r["fitted_ms"] == pytest.approx(fit["step_ms"] + fit["per_layer_ms"] * r["layers"] + memory)
    calibration, written = map(Path, fit["paths"])
    assert written == sweep_file and json.loads(written.read_text()) == json.loads(calibration.read_text())
    saved = json.loads(calibration.read_text())
    assert saved["per_layer_ms"] == fit["per_layer_ms"] and saved["kind"] == "specdraft_eval.calibration"
    assert_one_line_error(run_cli("zoo", "profile", "--calibrate", "x"), "--calibrate needs --sweep")


@pytest.mark.parametrize("gpu", ["h100", "this"])
def test_rank_measures_and_orders(tiny, gpu, tmp_path):
    rows = zoo_json("rank", "--target", str(tiny), "--gpu", gpu, "--drafts", "prompt-lookup", "--drafts", "layers:0-1",
                    "--measure", "2", "--gamma", "1,2", "--max-new-tokens", "8",
                    env={"SPECDRAFT_EVAL_CACHE": str(tmp_path)})["rows"]
    assert [r["draft"] for r in rows] != [] and len(rows) == 2
    predicted = [r["predicted_tokens_per_second"] for r in rows]
    assert predicted == sorted(predicted, reverse=True)
    assert all(r["tar_source"] == "measured (2 prompts)" for r in rows)
    assert all(r["best_gamma"] in (1, 2) for r in rows)
    if gpu == "h100":
        assert any("h100" in r["latency_source"] for r in rows)  # the latency model, not this machine's profile


def test_rank_bad_gpu_and_gamma(tiny):
    assert_one_line_error(run_cli("zoo", "rank", "--target", str(tiny), "--gpu", "tpu9"), "unknown GPU 'tpu9'")
    assert_one_line_error(run_cli("zoo", "rank", "--target", str(tiny), "--gamma", "0,2"), "bad --gamma")


def _hub_cache(root: Path) -> Path:
    snapshot = root / "models--acme--tiny" / "snapshots" / ("b" * 40)
    save_tiny(snapshot)
    (root / "models--acme--tiny" / "refs").mkdir()
    (root / "models--acme--tiny" / "refs" / "main").write_text("b" * 40)
    return snapshot


def test_pull_offline_answers_from_cache_and_checks_tokenizer(tiny, tmp_path):
    snapshot = _hub_cache(tmp_path)
    env = {"HF_HUB_CACHE": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    result = zoo_json("pull", "acme/tiny", "--target", str(tiny), env=env)
    assert Path(result["path"]) == snapshot and result["tokenizer_check"] == f"matches {tiny}"
    assert_one_line_error(run_cli("zoo", "pull", "acme/absent", env=env),
                          "not in the Hugging Face cache and HF_HUB_OFFLINE is set")
    assert_one_line_error(run_cli("zoo", "pull", "nonsense", env=env), "unknown draft 'nonsense'")


def test_text_tables_fit_a_120_column_terminal(tiny, tmp_path):
    """As a new user sees them: zoo rank's default table and zoo validate --quick (which says up front what it will
    generate) fit 120 columns; the details are under --verbose or --json."""
    from typer.testing import CliRunner

    from zoo.cli import app

    ranked = CliRunner().invoke(app, ["rank", "--target", "smollm2-135m-instruct", "--gpu", "h100"])
    assert ranked.exit_code == 0 and "| draft" in ranked.output, ranked.output
    assert max(map(len, ranked.output.splitlines())) <= 120
    verbose = CliRunner().invoke(app, ["rank", "--target", "smollm2-135m-instruct", "--gpu", "h100", "--verbose"])
    assert "break_even_tar" in verbose.output and "tar_source" not in ranked.output
    checked = CliRunner().invoke(app, ["validate", "--target", str(tiny), "--quick", "--drafts", "prompt-lookup",
                                       "--plot", str(tmp_path / "v.png")])
    assert checked.exit_code == 0, checked.output
    lines = [line for line in checked.output.splitlines() if not line.startswith("Loading")]
    assert lines[0].startswith("zoo validate: 1 configuration(s) x 1 repeat(s) x 1 prompt(s)")
    assert lines[1].strip().startswith("2 generations of up to 32 tokens")
    assert [line for line in lines if len(line) > 120] == [] and "| task" in checked.output


def test_zoo_compare_dynamic_gamma_and_static_cache_reach_our_engine_only(monkeypatch, tmp_path):
    """`zoo compare --dynamic-gamma --static-cache` hands both to the comparison (ours chooses γ per step over a
    preallocated cache; vLLM's run keeps γ): the JSON says so. Control: without the flags, it is told False."""
    from typer.testing import CliRunner

    from zoo.cli import app
    from zoo.measure import engines

    told = []

    def fake(target, draft, prompts, gamma, max_new_tokens, sizes, repeats, tick, dynamic_gamma=False,
             static_cache=False):
        told.append((dynamic_gamma, static_cache))
        return engines.EngineComparison(target, draft, gamma, max_new_tokens, len(prompts), "0",
                                        dynamic_gamma=dynamic_gamma, static_cache=static_cache)

    monkeypatch.setattr(engines, "compare_engines", fake)
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps(["def f():", "def g():"]))
    for flags in (["--dynamic-gamma", "--static-cache"], []):
        result = CliRunner().invoke(app, ["compare", "--prompts", str(prompts), "--limit", "2", "--json", *flags])
        assert result.exit_code == 0, result.output
        data = json.loads(result.output[result.output.index("{"):])
        assert data["dynamic_gamma"] is data["static_cache"] is bool(flags)
    assert told == [(True, True), (False, False)]
