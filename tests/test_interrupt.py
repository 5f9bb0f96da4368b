"""Ctrl-C and SIGTERM sent to real subprocesses: one line, a non-zero exit, nothing half-written, a rerun works."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from fake_hub import FakeHub
from support import BIN, ROOT, run_cli


def _as_in_a_terminal() -> None:
    """Ctrl-C's default action, as in a terminal: a suite started in the background (``... &``) hands its
    children SIGINT ignored, and Python then never raises KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def interrupt(args: list[str], ready: str | Callable[[], bool], sig: signal.Signals, timeout: float = 120,
              env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Start ``args``, wait until its stderr shows ``ready`` (or ``ready()`` holds: the work has begun), send
    ``sig``, collect."""
    proc = subprocess.Popen([str(BIN / args[0]), *args[1:]], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "TOKENIZERS_PARALLELISM": "false", **(env or {})},
                            preexec_fn=_as_in_a_terminal)
    chunks: list[bytes] = []
    reader = threading.Thread(target=lambda: chunks.extend(iter(lambda: proc.stderr.read1(4096), b"")), daemon=True)
    reader.start()
    deadline = time.monotonic() + timeout
    started = ready if callable(ready) else lambda: ready.encode() in b"".join(chunks)
    while not started():
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


def test_zoo_pull(tiny, tmp_path):
    """A download stopped mid-file leaves no snapshot pointing at a partial file; the rerun completes it."""
    env = {"HF_ENDPOINT": "", "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "0", "HF_HUB_DISABLE_XET": "1"}
    hub = FakeHub("org/tiny-draft", tiny, slow=True)
    try:
        env["HF_ENDPOINT"] = hub.endpoint
        done = interrupt(["zoo", "pull", "org/tiny-draft"], hub.sending.is_set, signal.SIGTERM, env=env)
    finally:
        hub.close()
    check_one_line(done, "zoo:")
    assert done.returncode == 128 + signal.SIGTERM
    cached = tmp_path / "hf" / "hub" / "models--org--tiny-draft"
    snapshot = cached / "snapshots"
    assert not (snapshot.exists() and list(snapshot.rglob(hub.largest))), "a snapshot points at a partial file"
    assert not list(cached.rglob("*.incomplete")), "a partial download was left behind"
    hub = FakeHub("org/tiny-draft", tiny)
    try:
        env["HF_ENDPOINT"] = hub.endpoint
        again = run_cli("zoo", "pull", "org/tiny-draft", "--json", env=env)
    finally:
        hub.close()
    assert again.returncode == 0, again.stderr[-2000:]
    pulled = Path(json.loads(again.stdout)["path"])
    assert {p.name: p.read_bytes() for p in pulled.iterdir()} == hub.files
    assert not list(cached.rglob("*.incomplete"))


def test_zoo_profile(tiny, tmp_path):
    out = tmp_path / "profile.json"
    args = ["zoo", "profile", "--target", str(tiny), "--drafts", "layers:0", "--gamma", "1", "--out", str(out)]
    done = interrupt([*args, "--repeats", "100000000"], "Loading weights", signal.SIGTERM)
    check_one_line(done, "zoo:")
    assert not out.exists() and leftovers(tmp_path) == []
    again = run_cli(*args, "--repeats", "2")
    assert again.returncode == 0, again.stderr
    assert out.is_file()


@pytest.mark.slow
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
