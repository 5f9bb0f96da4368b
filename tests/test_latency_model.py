"""The batch-1 latency model and ranking from configs alone (no weights, offline)."""

from __future__ import annotations

import json

import pytest
from support import assert_one_line_error, run_cli

from specdraft_eval.errors import SpecdecError
from specdraft_eval.models.structure import ModelShape, shape_from_config
from specdraft_eval.results.profiles import SweepRow
from zoo.measure import latency_model
from zoo.measure.latency_model import fit_sweep, forward_seconds
from zoo.measure.shapes import draft_shape, model_shape

A100 = latency_model.accelerator("a100-80gb")


def ms(shape: ModelShape, gpu=A100, runtime="eager", tokens=1) -> float:
    return forward_seconds(shape, tokens, gpu, runtime) * 1000


@pytest.mark.parametrize("runtime", latency_model.LAUNCH_MODES)
def test_latency_is_linear_in_depth_at_fixed_width(runtime):
    base = model_shape("llama-2-7b").shape
    times = [ms(base.with_layers(n), runtime=runtime) for n in (2, 4, 8, 16, 32)]
    steps = [(b - a) / (nb - na) for (a, na), (b, nb) in zip(zip(times, (2, 4, 8, 16)), zip(times[1:], (4, 8, 16, 32)))]
    assert max(steps) == pytest.approx(min(steps), rel=1e-9)  # the same cost for every added layer
    assert times[0] < times[-1]


def test_wide_shallow_draft_beats_deep_narrow_one_at_equal_size():
    """The founding paper: a 5-layer wide 1.3B draft has 49% less latency than a 24-layer one (A100)."""
    wide, deep = model_shape("wide-sheared-llama-1.3b").shape, model_shape("sheared-llama-1.3b").shape
    assert wide.parameters == pytest.approx(deep.parameters, rel=0.05)
    for runtime in latency_model.LAUNCH_MODES:
        saving = 1 - ms(wide, runtime=runtime) / ms(deep, runtime=runtime)
        assert saving > 0.4, runtime
    graphs = 1 - ms(wide, runtime="cuda-graphs") / ms(deep, runtime="cuda-graphs")
    assert graphs == pytest.approx(0.49, abs=0.1)


def test_width_costs_little_at_batch_one_on_a_gpu():
    narrow = ModelShape(8, 1024, 16, 16, 32000, 8 * 12 * 1024**2 + 2 * 32000 * 1024, 32000 * 1024)
    wide = ModelShape(8, 2048, 16, 16, 32000, 8 * 12 * 2048**2 + 2 * 32000 * 2048, 32000 * 2048)
    assert ms(wide) < 1.15 * ms(narrow)  # twice as wide, 4x the layer weights, barely slower (eager)


def test_shapes_from_catalog_config_and_layer_views(tmp_path):
    target = model_shape("meta-llama/Llama-2-70b-hf")
    assert target.source == "catalog" and target.shape.layers == 80 and target.shape.kv_heads == 8
    assert target.shape.parameters == pytest.approx(69e9, rel=0.01)
    view = draft_shape("layers:0-4", target.shape)
    assert view.name == "layers:0,1,2,3,4" and view.shape.layers == 5
    assert view.shape.parameters < target.shape.parameters / 10
    assert draft_shape("prompt-lookup", target.shape).shape is None
    config = {"num_hidden_layers": 4, "hidden_size": 256, "num_attention_heads": 4, "vocab_size": 1000,
              "intermediate_size": 512}
    (tmp_path / "config.json").write_text(json.dumps(config))
    from_dir = model_shape(str(tmp_path))
    expected = 4 * (4 * 256 * 256 + 3 * 256 * 512 + 2 * 256) + 2 * 1000 * 256 + 256
    assert from_dir.shape.parameters == expected and from_dir.source.startswith("config")
    assert model_shape(str(tmp_path / "config.json")).shape == from_dir.shape


SWEEP = [(1, 4e8), (2, 1e8), (4, 2e8), (8, 4e8), (16, 8e8), (4, 8e8), (4, 3e9), (32, 6e9)]


def test_sweep_fit_recovers_known_constants_with_a_per_step_term():
    rows = [SweepRow("depth", n, 64, b, 0.8 + 0.5 * n + b / 16e6) for n, b in SWEEP]
    fit = fit_sweep(rows, "test", "CPU: test", dtype_bytes=4)
    assert fit.step_ms == pytest.approx(0.8) and fit.per_layer_ms == pytest.approx(0.5)
    assert fit.bandwidth_gb_s == pytest.approx(16.0) and fit.note is None
    assert fit.max_relative_error < 1e-9 and [r.fitted_ms for r in fit.rows] == pytest.approx(
        [r.ms_per_token for r in rows])
    assert set(fit.uncertainty) == {"step_ms", "per_layer_ms", "bandwidth_gb_s"}


def test_sweep_fit_reports_uncertainty_and_refuses_a_bandwidth_below_the_noise():
    """A host-bound sweep (time set by depth alone, ±5% noise): the bandwidth term is noise, so none is stored."""
    import random

    noise = random.Random(0)
    rows = [SweepRow("depth", n, 64, b, (0.9 + 0.6 * n) * (1 + noise.uniform(-0.05, 0.05)))
            for n, b in SWEEP]
    fit = fit_sweep(rows, "test", "NVIDIA Test", dtype_bytes=2)
    assert fit.bandwidth_gb_s is None and "bandwidth not identified" in fit.note
    assert fit.per_layer_ms == pytest.approx(0.6, rel=0.1) and fit.uncertainty["per_layer_ms"] > 0
    assert "host-bound" in str(fit)
    gpu = latency_model.accelerator("test", fit)  # rank then takes the longer of the fixed cost and the roofline
    assert gpu.cost("eager").host_bound and gpu.bandwidth_gb_s == 1.0  # an unknown GPU: no datasheet either
    with pytest.raises(SpecdecError, match="fewer than 4 rows"):
        fit_sweep(rows[:3], "test", "NVIDIA Test", dtype_bytes=2)


def test_h200_model_reproduces_the_measured_step_times():
    """zoo rank's H200 eager constants against the 11 step times measured there (in-sample: fitted to them),
    each within 15%, and the wide/deep draft ratio within 10%."""
    measured = latency_model.MEASURED["h200"]
    predicted = {}
    for layers, hidden, inter, heads, ms_measured in measured["rows"]:
        shape = shape_from_config({"num_hidden_layers": layers, "hidden_size": hidden, "intermediate_size": inter,
                                   "num_attention_heads": heads, "vocab_size": 32000})
        predicted[(layers, hidden)] = ms(shape, latency_model.GPUS["h200"]), ms_measured
        assert predicted[(layers, hidden)][0] == pytest.approx(ms_measured, rel=0.15), (layers, hidden)
    (wide, wide_m), (deep, deep_m) = predicted[(5, 4096)], predicted[(24, 2048)]
    assert wide / deep == pytest.approx(wide_m / deep_m, rel=0.10)
    assert "max" in latency_model.model_error("h200") and latency_model.model_error("h200", "cuda-graphs") is None


PAPER_TARGETS = ["huggyllama/llama-65b", "facebook/opt-66b", "meta-llama/Llama-2-70b-hf", "meta-llama/Llama-3.1-8B",
                 "lmsys/vicuna-33b-v1.3"]


@pytest.mark.parametrize("target", PAPER_TARGETS)
def test_paper_targets_rank_offline_without_weights(target, tmp_path):
    env = {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hub"), "SPECDRAFT_EVAL_CACHE": str(tmp_path)}
    done = run_cli("zoo", "rank", "--target", target, "--gpu", "a100-80gb", "--results", str(tmp_path),
                   "--drafts", "prompt-lookup", "--drafts", "layers:0-4", "--json", env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    ranking = json.loads(done.stdout)
    rows = ranking["rows"]
    assert {r["draft"] for r in rows} == {"prompt-lookup:3", "layers:0,1,2,3,4"}
    assert ranking["target_ms_per_token"] > 0 and all(r["tar_source"].startswith("missing") for r in rows)


def test_rank_names_the_calibration_it_uses(tmp_path):
    from specdraft_eval.results.profiles import Calibration, write_calibration

    env = {"SPECDRAFT_EVAL_CACHE": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    import os

    os.environ["SPECDRAFT_EVAL_CACHE"] = str(tmp_path)
    try:
        write_calibration(Calibration("my-gpu", per_layer_ms=0.2, bandwidth_gb_s=900.0, hardware="NVIDIA Test"))
    finally:
        del os.environ["SPECDRAFT_EVAL_CACHE"]
    done = run_cli("zoo", "rank", "--target", "llama-2-7b", "--gpu", "my-gpu", "--drafts", "layers:0-1",
                   "--results", str(tmp_path), "--json", env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    row = json.loads(done.stdout)["rows"][0]
    assert row["latency_source"].startswith("calibration (NVIDIA Test, eager)")
    # 2 layers × 0.2 ms + (2 layers of 202.4 M + the 131 M output head) × 2 bytes / 900 GB/s
    assert row["draft_ms_per_token"] == pytest.approx(2 * 0.2 + (2 * 202.4e6 + 131e6) * 2 / 900e9 * 1000, rel=0.01)


def test_rank_unknown_offline_model_is_one_line(tmp_path):
    env = {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path)}
    assert_one_line_error(run_cli("zoo", "rank", "--target", "acme/unknown-70b", "--gpu", "h100", env=env),
                          "no shape known for 'acme/unknown-70b' offline")


def test_rank_counts_kv_reads_at_the_context_asked_for(tmp_path):
    """A longer context reads more KV cache per step: the target's step is slower at --context 4096 (cuda-graphs:
    not host-bound, so every byte shows)."""
    env = {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path)}

    def target_ms(context: str) -> float:
        done = run_cli("zoo", "rank", "--target", "llama-2-7b", "--gpu", "h200", "--runtime", "cuda-graphs",
                       "--drafts", "prompt-lookup", "--context", context, "--json", env=env)
        assert done.returncode == 0, done.stderr[-2000:]
        return json.loads(done.stdout)["target_ms_per_token"]

    # Llama-2-7B: 32 layers x 32 KV heads x 128 x 2 (K and V) x 2 bytes = 0.5 MB per token, at 4.8 TB/s
    assert target_ms("4096") - target_ms("0") == pytest.approx(4096 * 524288 / 4.8e12 * 1000, rel=0.01)
    assert_one_line_error(run_cli("zoo", "rank", "--target", "llama-2-7b", "--gpu", "h200", "--context", "-1",
                                  env=env), "--context -1 must be >= 0")


def test_rank_h200_on_the_catalogs_llama_shapes_reproduces_the_measured_figures(tmp_path):
    """`zoo rank --gpu h200` from the catalog's shapes (no weights): Llama-2-7B's step (21.21 ms measured) and the
    wide/deep draft pair (3.91 / 14.94 ms) as measured on one H200, eager, each within 15%, ratio within 10%."""
    done = run_cli("zoo", "rank", "--target", "llama-2-7b", "--gpu", "h200", "--drafts", "sheared-llama-1.3b",
                   "--drafts", "wide-sheared-llama-1.3b", "--json", env={"HF_HUB_OFFLINE": "1",
                                                                         "HF_HUB_CACHE": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-2000:]
    ranking = json.loads(done.stdout)
    rows = {r["draft"]: r for r in ranking["rows"]}
    assert ranking["target_ms_per_token"] == pytest.approx(21.21, rel=0.15)
    deep, wide = rows["sheared-llama-1.3b"]["draft_ms_per_token"], rows["wide-sheared-llama-1.3b"]["draft_ms_per_token"]
    assert deep == pytest.approx(14.94, rel=0.15) and wide == pytest.approx(3.91, rel=0.15)
    assert wide / deep == pytest.approx(3.91 / 14.94, rel=0.10)
    assert "in-sample" in ranking["latency_model_error"]


def test_a_tree_is_drafted_in_one_pass_per_depth_and_verified_at_its_width():
    from zoo.measure.rank import Candidate, rank, tree_depth

    head = "eagle:leaderboard/drafts/smollm2-eagle"
    assert tree_depth(f"{head}@4x5") == 5 and tree_depth(head) is None
    assert tree_depth(f"prompt-lookup|{head}@2") == 6 and tree_depth("suffix") is None  # default depth 6
    chain = Candidate("chain", 2.0, "x", tar={4: 2.0}, tar_source={4: "results"})
    tree = Candidate("tree", 2.0, "x", tar={12: 2.5}, tar_source={12: "results"}, tree_depth=3)
    result = rank([chain, tree], 10.0, {4: 12.0, 12: 14.0})
    by_name = {row.draft: row for row in result.rows}
    # chain: 2.0 / (4·2 + 12) ms; tree: 2.5 / (3·2 + 14) ms (charged per node it would be 2.5 / 38 ms)
    assert by_name["chain"].predicted_tokens_per_second == pytest.approx(2.0 / 0.020)
    assert by_name["tree"].predicted_tokens_per_second == pytest.approx(2.5 / 0.020)
    assert by_name["tree"].break_even_tar == pytest.approx({4: (3 * 2 + 12) / 10, 12: (3 * 2 + 14) / 10})


def test_a_target_sharded_over_gpus_reads_a_share_and_pays_two_all_reduces_per_layer():
    """--gpus N: the roofline (weights and KV cache read, compute) is divided by N, the fixed per-layer cost is not,
    and each layer adds two all-reduces (latency + ring traffic over the link); one GPU is unchanged."""
    shape = shape_from_config({"num_hidden_layers": 80, "hidden_size": 8192, "intermediate_size": 28672,
                               "num_attention_heads": 64, "num_key_value_heads": 8, "vocab_size": 32000})
    a100 = latency_model.GPUS["a100-80gb"]
    graphs = a100.cost("cuda-graphs")
    one, four = (forward_seconds(shape, 1, a100, "cuda-graphs", 128, gpus=n) for n in (1, 4))
    fixed = graphs.step_ms / 1000 + 80 * graphs.layer_ms / 1000
    roofline = one - fixed
    allreduce = 2 * 80 * (latency_model.ALLREDUCE_US / 1e6 + 1.5 * 8192 * 2 / (300 * 1e9))
    assert four == pytest.approx(fixed + roofline / 4 + allreduce, rel=1e-9)
    assert forward_seconds(shape, 1, a100, "cuda-graphs", 128) == one  # gpus=1: the same as before
    eager = a100.cost("eager")  # host-bound: the longer of the launches (all-reduces added) and the device's share
    eager_fixed = eager.step_ms / 1000 + 80 * eager.layer_ms / 1000
    assert forward_seconds(shape, 1, a100, "eager", 128, gpus=4) == pytest.approx(
        max(eager_fixed + allreduce, roofline / 4), rel=1e-9)


def test_rank_gpus_shards_a_named_gpus_target_and_refuses_this_machine(tmp_path):
    env = {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hub"), "SPECDRAFT_EVAL_CACHE": str(tmp_path)}
    args = ["zoo", "rank", "--target", "meta-llama/Llama-2-70b-hf", "--results", str(tmp_path), "--drafts",
            "layers:0-4", "--runtime", "cuda-graphs", "--json"]
    one, four = (run_cli(*args, "--gpu", "a100-80gb", "--gpus", n, env=env) for n in ("1", "4"))
    assert one.returncode == four.returncode == 0, four.stderr[-2000:]
    t_one, t_four = (json.loads(r.stdout)["target_ms_per_token"] for r in (one, four))
    assert t_four < t_one / 2  # a 70B target's weight read, split four ways, dominates with CUDA graphs
    (view_one,), (view_four,) = (json.loads(r.stdout)["rows"] for r in (one, four))
    assert view_four["draft_ms_per_token"] < view_one["draft_ms_per_token"]  # a layer view runs the sharded layers
    assert view_four["latency_source"].endswith("sharded over 4)")
    assert_one_line_error(run_cli(*args, "--gpu", "this", "--gpus", "2", env=env), "--gpus 2")


def test_rank_prints_the_papers_figures_beside_their_predictions_for_its_targets(tmp_path):
    """`zoo rank --target llama-2-70b --gpu a100 --gpus 4` (the paper's setting): every catalog draft of the family
    ranked (no TAR: fastest draft first, with the TAR each needs to break even), and the paper's published figures
    beside predictions worked by hand from the eager constants (host-bound: a draft's step is its fixed cost)."""
    env = {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hub"), "SPECDRAFT_EVAL_CACHE": str(tmp_path)}
    args = ["zoo", "rank", "--target", "llama-2-70b", "--gpus", "4", "--results", str(tmp_path)]
    done = run_cli(*args, "--gpu", "a100", "--json", env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    ranking = json.loads(done.stdout)
    rows = {r["draft"]: r for r in ranking["rows"]}
    assert {"wide-sheared-llama-796m", "sheared-llama-1.3b", "tinyllama-1.1b-chat"} <= set(rows)
    times = [r["draft_ms_per_token"] for r in ranking["rows"]]
    assert times == sorted(times)
    eager = latency_model.GPUS["a100-80gb"].cost("eager")
    step = lambda layers: eager.step_ms + layers * eager.layer_ms  # noqa: E731
    wide, deep, tiny = step(5), step(24), step(22)
    assert rows["wide-sheared-llama-796m"]["draft_ms_per_token"] == pytest.approx(wide)
    t_target = ranking["target_ms_per_token"]
    # break-even at γ 4: 4 draft passes and one verification of 5 tokens cost as much as TAR target steps
    t_verify = forward_seconds(model_shape("llama-2-70b").shape, 5, A100, "eager", 128, gpus=4) * 1000
    assert rows["sheared-llama-1.3b"]["break_even_tar"]["4"] == pytest.approx((4 * deep + t_verify) / t_target)
    published = {c["source"]: c for c in ranking["published"]}
    reduction = published["§4.1, Table 3"]
    assert reduction["published"] == "49%" and reduction["predicted"].startswith(f"{1 - wide / deep:.0%}")
    assert reduction["deviation"] == f"{(1 - wide / deep) / 0.49 - 1:+.0%}"
    ratio = published["§4.2, Table 8"]
    assert ratio["predicted"].startswith(f"{tiny / wide:.2f}x") and ratio["deviation"] == f"{tiny / wide / 4 - 1:+.0%}"
    share = published["§4.1"]
    verify = {g: forward_seconds(model_shape("llama-2-70b").shape, g + 1, A100, "eager", 128, gpus=4) * 1000
              for g in (1, 2, 4, 8)}
    holding = [g for g in verify if verify[g] / (g * wide + verify[g]) > 0.8]
    assert f"γ2: {verify[2] / (2 * wide + verify[2]):.0%}" in share["predicted"]
    assert share["deviation"] == f"holds at γ ≤ {max(holding)}"
    text = run_cli(*args, "--gpu", "a100-80gb", env=env)  # the alias names the 80 GB A100, as the paper ran
    assert text.returncode == 0 and "published figures" in text.stdout and "Table 11" in text.stdout
    other = run_cli("zoo", "rank", "--target", "llama-2-7b", "--gpu", "a100", "--results", str(tmp_path), "--json",
                    env=env)
    assert other.returncode == 0 and json.loads(other.stdout)["published"] == []  # not one of the paper's targets
