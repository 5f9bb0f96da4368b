"""``--device``/``--dtype``/``--use-kernels`` on every model-loading ``zoo`` command, loading that never needs the
hub's kernels, and the GPU check's CPU rehearsal."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch
from support import ROOT, assert_one_line_error, run_cli, zoo_json

from specdraft_eval.errors import SpecdecError
from specdraft_eval.models.targets import LoadSettings, load_target
from zoo.measure.bench.result import NEAR_TIE_LOGIT_MARGIN


def commands(tiny: Path, tmp: Path) -> dict[str, list[str]]:
    """Every zoo command that loads a model, with the least work each takes."""
    return {
        "bench": ["bench", "--target", str(tiny), "--limit", "1", "--repeats", "1", "--max-new-tokens", "4"],
        "profile": ["profile", "--target", str(tiny), "--gamma", "1", "--repeats", "1", "--context", "8",
                    "--out", str(tmp / "profile.json")],
        "profile --sweep": ["profile", "--sweep", "--repeats", "1"],
        "validate": ["validate", "--target", str(tiny), "--prompts", "1", "--repeats", "1", "--gamma", "1",
                     "--max-new-tokens", "4", "--plot", str(tmp / "v.png")],
        "rank --gpu this": ["rank", "--target", str(tiny), "--gpu", "this", "--drafts", "prompt-lookup"],
        "prune": ["prune", str(tiny), "--layers", "1", "--distill-tokens", "64", "--out", str(tmp / "pruned")],
        "ngram": ["ngram", str(tiny), "--max-prompts", "2", "--new-tokens", "4", "--out", str(tmp / "ngram")],
    }


@pytest.mark.parametrize("command", ["bench", "profile", "profile --sweep", "validate", "rank --gpu this", "prune",
                                     "ngram"])
def test_every_loading_command_takes_device_and_dtype(tiny, tmp_path, command):
    """Each command routes --device and --dtype to LoadSettings before any work (the checks themselves:
    test_load_settings_defaults_and_errors; a run on the device: test_device_and_dtype_reach_the_measurement)."""
    args = commands(tiny, tmp_path)[command]
    if torch.cuda.is_available():
        assert_one_line_error(run_cli("zoo", *args, "--device", "cpu", "--dtype", "int4"), "bad --dtype 'int4'")
    else:
        assert_one_line_error(run_cli("zoo", *args, "--device", "cuda", "--dtype", "float16"),
                              "no CUDA device is visible here")
    assert not any(tmp_path.iterdir())  # refused before anything was written


@pytest.mark.slow  # a real CLI run of some length: the full suite runs it
def test_device_and_dtype_reach_the_measurement(tiny, tmp_path):
    """A CPU profile in bfloat16: keyed by the CPU's name, measured on the bfloat16 model."""
    path = tmp_path / "profile.json"
    data = zoo_json("profile", "--target", str(tiny), "--gamma", "1", "--repeats", "1", "--context", "8",
                    "--device", "cpu", "--dtype", "bfloat16", "--kernels", "plain", "--out", str(path))
    assert data["hardware"].startswith("CPU") and json.loads(path.read_text())["t_target_ms"] > 0
    bench = zoo_json("bench", "--target", str(tiny), "--limit", "1", "--repeats", "1", "--max-new-tokens", "4",
                     "--device", "cpu", "--dtype", "bfloat16", "--kernels", "plain", "--prompts",
                     str(prompts_file(tmp_path)))
    assert bench["dtype"] == "bfloat16"
    for row in bench["configs"]:  # it ran, so every divergence was a near-tie: counted as numerics, margins given
        assert row["numerics"] == len(row["mismatched_prompts"]) == len(row["mismatch_logit_margins"])
        assert all(abs(m) <= NEAR_TIE_LOGIT_MARGIN for m in row["mismatch_logit_margins"])
    numerics = sum(row["numerics"] for row in bench["configs"])
    assert bench["lossless"] == (f"{numerics} divergence(s), each a bfloat16 near-tie (|logit margin| <= "
                                 f"{NEAR_TIE_LOGIT_MARGIN})" if numerics
                                 else "every output identical to the target's greedy generate")


def prompts_file(tmp_path: Path) -> Path:
    path = tmp_path / "prompts.json"
    path.write_text(json.dumps(["w3 w4 w5 w3 w4 w5 w3 w4"]))
    return path


def test_load_settings_defaults_and_errors():
    here = LoadSettings.of()
    assert here.device == ("cuda" if torch.cuda.is_available() else "cpu")
    assert here.dtype == ("bfloat16" if here.device == "cuda" else "float32") and not here.use_kernels
    assert LoadSettings.of("cpu", "float16").dtype == "float16"
    for device, dtype, message in (("tpu", "auto", "bad --device"), ("cpu", "int8", "bad --dtype")):
        with pytest.raises(SpecdecError, match=message):
            LoadSettings.of(device, dtype)


def test_loading_never_asks_for_hub_kernels_unless_told(tiny, monkeypatch):
    """transformers 5.25 defaults to use_kernels=True, which fetches kernels from the hub on CUDA: every load
    passes use_kernels explicitly, False unless the user asks, and the Target remembers which (a model draft loads
    with the same settings)."""
    from transformers import AutoModelForCausalLM

    seen = []
    real = AutoModelForCausalLM.from_pretrained.__func__

    def spy(cls, *args, **kwargs):
        seen.append(kwargs.get("use_kernels", "absent"))
        return real(cls, *args, **{k: v for k, v in kwargs.items() if k != "use_kernels"})

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", classmethod(spy))
    assert load_target(str(tiny)).settings.use_kernels is False and seen == [False]
    assert LoadSettings(use_kernels=True).load(str(tiny)).settings.use_kernels is True and seen[-1] is True


def test_specdec_record_says_dtype_and_hub_kernels(tiny):
    from specdraft_eval.integration import lm_eval_model

    lm = lm_eval_model.SpecDecLM(pretrained=str(tiny), draft="prompt-lookup", device="cpu", use_kernels="false")
    block = lm.specdec_info()
    assert block["use_kernels"] is False and block["dtype"] == "float32"


def _threads() -> dict:
    """The suite's thread setting (``pytest -n``: the cores shared between workers), passed on."""
    return {"OMP_NUM_THREADS": os.environ["OMP_NUM_THREADS"]} if "OMP_NUM_THREADS" in os.environ else {}


@pytest.mark.slow
def test_gpu_check_small_rehearsal(tmp_path):
    """scripts/gpu_check.py --small: every part runs on the CPU with tiny shapes and writes its figures (part 5
    without its compiled runtime, which tests/test_static.py covers)."""
    import subprocess

    env = {"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "HOME": str(Path.home()), **_threads()}
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--small", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    results = json.loads((tmp_path / "gpu_check.json").read_text())
    assert {"step_latency", "verify_cost", "bench", "lm_eval", "steady", "sharded", "batch_sweep"} <= set(results)
    sweep = results["batch_sweep"]["rows"]
    assert len({r["draft"] for r in sweep}) == 2 and "eagle-head" in {r["draft"] for r in sweep}
    assert sorted((r["draft"], r["gamma"], r["batch_size"]) for r in sweep) == sorted(
        (d, g, b) for d in {r["draft"] for r in sweep} for g in ("4", "dynamic") for b in (1, 2, 4))
    assert [r["runtime"] for r in results["steady"]["rows"]] == ["eager", "static cache"]
    ks = {*range(9), 16, 32, 64}
    assert len(results["step_latency"]["rows"]) == 14
    assert {(r["shape"], r["k"]) for r in results["verify_cost"]["rows"]} == {(s, k) for s in ("chain",
                                                                                               "tree") for k in ks}
    assert all(r["returncode"] == 0 and r["specdec"]["baseline_mismatches"] == 0 for r in results["lm_eval"]["runs"])
    assert results["bench"]["lossless"].startswith("every output identical")
    parallelize = results["sharded"]["runs"]["parallelize"]  # no GPU here: it runs on the CPU
    assert parallelize["returncode"] == 0 and parallelize["results_files"] == 1
    assert parallelize["specdec"]["baseline_mismatches"] == 0 and parallelize["specdec"]["tensor_parallel"] == 1
    report = (tmp_path / "gpu.md").read_text()
    assert report.count("\n## ") == 7
    if "1 no fit:" not in done.stdout:  # part 1 as a sweep file for the leaderboard's latency figure
        from specdraft_eval.results.profiles import read_calibration_file

        sweep = read_calibration_file(tmp_path / "sweep.json")
        assert len(sweep.rows) == 14 and {"depth", "width", "named"} == {r.group for r in sweep.rows}
