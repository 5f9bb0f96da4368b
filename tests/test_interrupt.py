"""Ctrl-C and SIGTERM sent to real subprocesses: one line, a non-zero exit, nothing half-written, a rerun works."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from conftest import BIN, ROOT, run_cli, save_tiny


def interrupt(args: list[str], ready: str, sig: signal.Signals, timeout: float = 120) -> subprocess.CompletedProcess:
    """Start ``args``, wait until its stderr shows ``ready`` (the work has begun), send ``sig``, collect."""
    proc = subprocess.Popen([str(BIN / args[0]), *args[1:]], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    chunks: list[bytes] = []
    reader = threading.Thread(target=lambda: chunks.extend(iter(lambda: proc.stderr.read1(4096), b"")), daemon=True)
    reader.start()
    deadline = time.monotonic() + timeout
    while ready.encode() not in b"".join(chunks):
        assert proc.poll() is None, f"ended before {ready!r} appeared: {b''.join(chunks)[-2000:]!r}"
        assert time.monotonic() < deadline, f"{ready!r} never appeared: {b''.join(chunks)[-2000:]!r}"
        time.sleep(0.05)
    time.sleep(0.5)
    proc.send_signal(sig)
    out = proc.stdout.read()
    proc.wait(timeout=timeout)
    reader.join(timeout=10)
    return subprocess.CompletedProcess(args, proc.returncode, out.decode(), b"".join(chunks).decode(errors="replace"))


def leftovers(folder: Path) -> list[str]:
    """Temporary files or folders an atomic write would leave behind (names starting with a dot)."""
    return [str(p) for p in folder.rglob(".*")]


def check_one_line(done: subprocess.CompletedProcess, prefix: str) -> None:
    assert done.returncode != 0
    ours = [line for line in done.stderr.splitlines() if line.startswith(prefix)]  # beside progress-bar lines
    assert len(ours) == 1 and "interrupted" in ours[0] and "rerun" in ours[0], done.stderr[-2000:]
    assert "Traceback" not in done.stderr


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return save_tiny(tmp_path_factory.mktemp("tiny") / "model", layers=4)


@pytest.mark.parametrize("sig", [signal.SIGTERM], ids=["SIGTERM"])  # SIGINT: the lm_eval case below
def test_zoo_prune_with_distillation(tiny, tmp_path, sig):
    out = tmp_path / "draft"
    done = interrupt(["zoo", "prune", str(tiny), "--layers", "2", "--distill-tokens", "100000000",
                      "--calibration", "w1 w2 w3 w4 w5 w6 w7", "--out", str(out)], "Loading weights", sig)
    check_one_line(done, "zoo:")
    assert done.returncode == 128 + sig
    assert not out.exists() and leftovers(tmp_path) == []
    again = run_cli("zoo", "prune", str(tiny), "--layers", "2", "--distill-tokens", "64", "--calibration", "w1 w2 w3",
                    "--out", str(out))
    assert again.returncode == 0, again.stderr
    assert (out / "config.json").is_file()


def test_zoo_profile(tiny, tmp_path):
    out = tmp_path / "profile.json"
    args = ["zoo", "profile", "--target", str(tiny), "--drafts", "layers:0", "--gamma", "1", "--out", str(out)]
    done = interrupt([*args, "--repeats", "100000000"], "Loading weights", signal.SIGTERM)
    check_one_line(done, "zoo:")
    assert not out.exists() and leftovers(tmp_path) == []
    again = run_cli(*args, "--repeats", "2")
    assert again.returncode == 0, again.stderr
    assert out.is_file()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_lm_eval_run(tiny, tmp_path, sig):
    out = tmp_path / "results"
    args = ["lm_eval", "--model", "specdec", "--model_args", f"pretrained={tiny},draft=layers:0,baseline=true",
            "--include_path", "tasks", "--tasks", "specdec_mmlu_cot", "--output_path", str(out), "--log_samples"]
    done = interrupt([*args, "--limit", "200", "--gen_kwargs", "max_gen_toks=256"], "Running generate_until", sig)
    check_one_line(done, "specdec:")
    assert not out.exists() or [p for p in out.rglob("*") if p.is_file()] == []
    again = run_cli(*args, "--limit", "2", "--gen_kwargs", "max_gen_toks=4")
    assert again.returncode == 0, again.stderr[-2000:]
    assert len(list(out.rglob("results_*.json"))) == 1
