"""The project's prepared GPU check: one command, no network, figures written after each part.

    python scripts/gpu_check.py [--small] [--out DIR] [--parts 1,2,4,3,5,6,7] [--tokenizer DIR] [--compile]

Random-weight Llama shapes (no weights are needed; the output head is scaled so greedy choices are not
near-ties everywhere), bf16 on the GPU (float32 with ``--small``, which runs the same code on the CPU with tiny
shapes in under 2 minutes):

1. batch-1 step latency (the engine's ``verify_step`` at k = 0, context 128) vs depth (1-32 layers at width 4096)
   and width (1024-8192 at 4 layers), the paper's draft shapes and Llama-2-7B/13B shapes: every shape built
   first, warmed up, then measured in interleaved rounds (median, min, max over rounds);
2. verification cost of k = 0..64 draft tokens on the 7B shape at contexts 128 and 1024, as a chain and as a
   token tree (EAGLE-2-like, the engine's 4D ancestor mask: what a tree of 16, 32, 64 nodes costs);
3. ``zoo bench`` on the 7B shape: transformers ``generate`` and assisted generation, our plain decoding and ours at
   fixed and dynamic γ, prompt lookup, a 5-layer view and an EAGLE head (one layer + the target's output head)
   (with ``--compile``: every configuration also compiled, beside the eager ones, warm-up apart);
4. ``lm_eval --model specdec --device DEVICE`` on a small model saved to disk, batch 1 and 4, ``baseline=true``
   (with ``--compile``: ``compile=true``);
5. steady decoding on the 7B shape: per-step times of plain steps and of verifying 4 tokens over a long decode,
   with a growing cache, a static cache and compiled steps (max/median shows stalls at new lengths), each width
   compiled and warmed up before the clock starts (warm-up seconds and graphs compiled in timed steps apart);
6. the 7B shape through ``lm_eval`` with ``parallelize=true`` (accelerate spreading it over the visible GPUs) and,
   with more than one GPU, ``tp_plan=auto`` under ``torchrun`` over all of them (exit codes, TAR, speedup,
   mismatches, one results file, the record's ``tensor_parallel``);
7. the batch study on the 7B shape (batch 1, 4, 16, 64): an EAGLE head and prompt lookup at γ 4 and dynamic γ,
   speculative against plain decoding of the same batches, draft milliseconds and host reads per pass.

Writes ``gpu_check.json`` after each part and ``gpu.md`` (the tables) into ``--out``, and part 1's rows with their
latency-model fit as ``sweep.json`` (the schema of ``zoo profile --sweep --out``: copy it beside the leaderboard's
results as ``sweep_NAME.json`` for its latency figure); a part that fails is
recorded with its error and the next one runs. Exit code 0 when every part ran.
"""

from __future__ import annotations

import argparse
import gc
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specdraft_eval.files import atomic_write, write_json  # noqa: E402
from specdraft_eval.measure.environment import dtype_name, hardware, versions  # noqa: E402

DEPTHS = (1, 2, 4, 8, 16, 32)
WIDTHS = (1024, 2048, 4096, 8192)
NAMED = [("Sheared-LLaMA-1.3B (24 x 2048)", 24, 2048, 5504, 16, 16), ("TinyLlama-1.1B (22 x 2048, GQA 4)", 22, 2048,
         5632, 32, 4), ("wide 1.3B (5 x 4096)", 5, 4096, 11008, 32, 32), ("Llama-2-7B shape (32 x 4096)", 32, 4096,
         11008, 32, 32), ("Llama-2-13B shape (40 x 5120)", 40, 5120, 13824, 40, 40)]


class Check:
    """Settings of one run, the figures so far, and where they go."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.small, self.out, self.args = args.small, Path(args.out), args
        self.device = "cpu" if args.small else "cuda"
        self.dtype = torch.float32 if args.small else torch.bfloat16
        self.start = time.perf_counter()
        self.results: dict = {"small": self.small, "device": hardware(self.device), "versions": versions(),
                              "torch_cuda": torch.version.cuda, "dtype": dtype_name(self.dtype)}
        self._tokenizer = None
        self._target = None

    def log(self, *parts) -> None:
        print(f"[{time.perf_counter() - self.start:6.1f}s]", *parts, flush=True)

    def save(self) -> None:
        self.results["elapsed_s"] = round(time.perf_counter() - self.start, 1)
        write_json(self.out / "gpu_check.json", self.results)
        atomic_write(self.out / "gpu.md", report(self.results))

    def model(self, layers: int, hidden: int, inter: int, heads: int, kv_heads: int, vocab: int = 32000):
        """A random-weight Llama of this shape on the device (tiny proportions with ``--small``)."""
        from transformers import LlamaConfig, LlamaForCausalLM

        if self.small:
            hidden, inter, heads, kv_heads = max(hidden // 64, 32), max(inter // 64, 64), 2, 2
            vocab = vocab if vocab == self.tokenizer.vocab_size else 512
        config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                             num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=4096,
                             tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None)
        torch.manual_seed(0)
        previous = torch.get_default_dtype()
        torch.set_default_dtype(self.dtype)
        try:
            with torch.device(self.device):
                model = LlamaForCausalLM(config).eval()
        finally:
            torch.set_default_dtype(previous)
        with torch.no_grad():
            model.lm_head.weight.mul_(8.0)  # peaky next-token distributions: greedy choices are not near-ties
        model.generation_config.eos_token_id = None
        return model

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            path = self.args.tokenizer
            if path is None:
                from specdraft_eval.models.targets import (
                    DEFAULT_TARGET,
                    local_dir,
                    resolve,
                )

                path = local_dir(resolve(DEFAULT_TARGET)).path
            self._tokenizer = AutoTokenizer.from_pretrained(path)
        return self._tokenizer

    def target(self):
        """The 7B-shaped target (vocabulary of the tokenizer), built once."""
        if self._target is None:
            self._target = self.model(32, 4096, 11008, 32, 32, vocab=len(self.tokenizer))
        return self._target

    def free(self) -> None:
        gc.collect()
        if self.device == "cuda":
            torch.cuda.empty_cache()


def step_latency(check: Check) -> None:
    """Part 1: ms per batch-1 step by shape, interleaved rounds after a warm-up per shape."""
    from zoo.measure.timing import context_tokens, engine_latency

    shapes = [(f"depth {n}", n, 4096, 11008, 32, 32) for n in DEPTHS]
    shapes += [(f"width {w}", 4, w, int(w * 2.6875), w // 128, w // 128) for w in WIDTHS if w != 4096]
    shapes += NAMED
    models = [check.model(*shape[1:]) for shape in shapes]
    prompts = [context_tokens(128, m.config.vocab_size) for m in models]
    for model, prompt in zip(models, prompts):  # warm-up per shape: first use of a shape is not measured
        engine_latency(model, [], [], [prompt], 2)
    rounds: list[list[float]] = [[] for _ in shapes]
    for _ in range(check.args.rounds):
        for i, (model, prompt) in enumerate(zip(models, prompts)):
            rounds[i].append(engine_latency(model, [], [], [prompt], check.args.steps)[0][0].median)
    rows = []
    for (name, layers, *_), model, samples in zip(shapes, models, rounds):
        weights = sum(p.numel() for p in model.parameters()) - model.get_input_embeddings().weight.numel()
        rows.append({"shape": name, "layers": layers, "hidden_size": model.config.hidden_size,
                     "params_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 1),
                     "weight_bytes": weights * model.dtype.itemsize, "ms_median": statistics.median(samples),
                     "ms_min": min(samples), "ms_max": max(samples), "rounds_ms": samples})
        check.log(f"1 {name:36s} {rows[-1]['ms_median']:8.2f} ms ({min(samples):.2f}-{max(samples):.2f})")
    check.results["step_latency"] = {"context": 128, "rounds": check.args.rounds, "steps": check.args.steps,
                                     "attention": models[0].config._attn_implementation, "rows": rows}
    write_sweep(check, rows)
    del models
    check.free()


def verify_cost(check: Check) -> None:
    """Part 2: ms to verify k = 0..64 draft tokens on the 7B shape, as a chain and as an EAGLE-2-like token tree
    (the engine's 4D ancestor mask), at contexts 128 and 1024 (rows: k up to 8, then 16, 32, 64)."""
    from zoo.measure.timing import context_tokens, engine_latency

    target, rows = check.target(), []
    for shape in ("chain", "tree"):
        for context in (128, 1024):
            verify, _ = engine_latency(target, [], [64], [context_tokens(context, target.config.vocab_size)],
                                       check.args.steps, trees=shape == "tree")
            kept = {k: s for k, s in sorted(verify.items()) if k <= 8 or k in (16, 32, 64)}
            for k, spread in kept.items():
                rows.append({"shape": shape, "context": context, "k": k, "ms_median": spread.median,
                             "ms_min": spread.min, "ms_max": spread.max, "vs_step": spread.median / verify[0].median})
            check.log(f"2 {shape} context {context}: " + " ".join(f"{k}:{s.median / verify[0].median:.2f}"
                                                                  for k, s in kept.items()))
    check.results["verify_cost"] = {"rows": rows}


def bench(check: Check) -> None:
    """Part 3: zoo bench's comparison on the 7B shape."""
    from specdraft_eval.drafts import load_draft
    from specdraft_eval.errors import SpecdecError
    from specdraft_eval.integration.offline_data import task_prompts
    from zoo.measure.bench.result import BenchPlan, check_lossless
    from zoo.measure.bench.run import run_bench

    target = check.target()
    prompts = task_prompts("specdec_humaneval")[:3] + task_prompts("specdec_mmlu_cot")[:1]
    from specdraft_eval.drafts.eagle import EagleDrafter, new_head
    from specdraft_eval.models.targets import Target

    loaded = Target(target, check.tokenizer)
    drafters = [load_draft("prompt-lookup", loaded), load_draft("layers:0-4", loaded),
                EagleDrafter(new_head(target), target, "eagle-head", None)]  # one layer + the target's head
    result = run_bench(target, "random-weight Llama-2-7B shape", check.tokenizer, drafters, prompts,
                       BenchPlan(4, check.args.repeats, check.args.new_tokens, check.args.compile))
    try:
        result.lossless = check_lossless(result, prompts)
    except SpecdecError as exc:  # a finding to publish, not a crash
        result.lossless = f"FAILED: {exc}"
    check.results["bench"] = result.to_json()
    for row in result.configs:
        check.log(f"3 {row.engine:32s} {row.draft or '-':18s} {row.tokens_per_second.median:8.1f} tok/s "
                  f"x{row.vs_autoregressive.median:.2f} TAR {row.steps.tar}")


def _saved(check: Check, *shape: int) -> Path:
    """A random-weight model of ``shape`` (layers, hidden, intermediate, heads, kv heads) saved with the tokenizer."""
    model = check.model(*shape, vocab=len(check.tokenizer))
    folder = Path(tempfile.mkdtemp(prefix="gpu-check-model-"))
    model.save_pretrained(folder)
    check.tokenizer.save_pretrained(folder)
    del model
    check.free()
    return folder


def _lm_eval(check: Check, folder: Path, model_args: str, out: Path, batch: int = 1, device: bool = True,
             launcher: tuple[str, ...] = ()) -> dict:
    """``lm_eval --model specdec`` on ``folder`` (prompt lookup, baseline timing on), by ``launcher`` (e.g. torchrun)
    or this Python; its exit code, seconds, stderr's tail on failure and the specdec block."""
    code = ("import sys, specdraft_eval.integration.lm_eval_hook; from lm_eval.__main__ import cli_evaluate; "
            "sys.argv = ['lm_eval'] + sys.argv[1:]; cli_evaluate()")
    args = ["--model", "specdec", "--model_args",
            f"pretrained={folder},draft=prompt-lookup,baseline=true,dtype={dtype_name(check.dtype)}{model_args}",
            *(["--device", check.device] if device else []), "--include_path", str(ROOT / "tasks"),
            "--tasks", "specdec_humaneval", "--limit", str(check.args.lm_eval_limit), "--confirm_run_unsafe_code",
            "--gen_kwargs", f"max_gen_toks={check.args.new_tokens}", "--batch_size", str(batch), "--output_path",
            str(out)]
    started = time.perf_counter()
    script = [sys.executable, "-c", code] if not launcher else [*launcher, "-m", "lm_eval"]
    done = subprocess.run([*script, *args], capture_output=True, text=True, timeout=480,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": os.pathsep.join(sys.path)})
    files = sorted(glob.glob(str(out / "**" / "results_*.json"), recursive=True))
    block = json.loads(Path(files[-1]).read_text())["config"]["specdec"] if files else None
    return {"returncode": done.returncode, "seconds": time.perf_counter() - started, "results_files": len(files),
            "stderr_tail": done.stderr[-1500:] if done.returncode else "", "specdec": block}


def _summary(run: dict) -> str:
    block = run["specdec"]
    return f"exit {run['returncode']}" + (f", TAR {block['tar']:.2f}, speedup {block['speedup']}, mismatches "
                                          f"{block['baseline_mismatches']}" if block else "")


def lm_eval_run(check: Check) -> None:
    """Part 4: the user's command on the device, a small saved model, batch 1 and 4, baseline=true."""
    folder = _saved(check, 4, 1024, 2816, 8, 8)
    compiled = ",compile=true" if check.args.compile else ""
    runs = [{"batch_size": batch, **_lm_eval(check, folder, compiled, folder / f"results-{batch}", batch)}
            for batch in (1, 4)]
    for run in runs:
        check.log(f"4 batch {run['batch_size']}: {_summary(run)}")
    check.results["lm_eval"] = {"runs": runs}
    if any(r["returncode"] for r in runs):
        raise RuntimeError("lm_eval failed: " + next(r["stderr_tail"] for r in runs if r["returncode"])[-400:])


def sharded(check: Check) -> None:
    """Part 6: the 7B shape spread by ``parallelize=true`` (accelerate's device_map over the visible GPUs) and, with
    more than one GPU, sharded by ``tp_plan=auto`` over all of them under torchrun: exit codes, TAR, speedup,
    mismatches against plain decoding, one results file, the record's tensor_parallel."""
    folder = _saved(check, *((4, 256, 688, 8, 8) if check.small else (32, 4096, 11008, 32, 32)))
    gpus = torch.cuda.device_count() if check.device == "cuda" else 0
    runs = {"parallelize": _lm_eval(check, folder, ",parallelize=true", folder / "parallelize", device=False)}
    if gpus > 1:
        runs["tp_plan"] = _lm_eval(check, folder, ",tp_plan=auto", folder / "tp", device=False,
                                   launcher=(sys.executable, "-m", "torch.distributed.run", "--nproc_per_node",
                                             str(gpus)))
    for name, run in runs.items():
        check.log(f"6 {name}: {_summary(run)}, results files {run['results_files']}"
                  + (f", tensor_parallel {run['specdec'].get('tensor_parallel')}" if run["specdec"] else ""))
    check.results["sharded"] = {"gpus": gpus, "runs": runs}
    if any(r["returncode"] for r in runs.values()):
        raise RuntimeError("sharded lm_eval failed: " + next(r["stderr_tail"] for r in runs.values()
                                                             if r["returncode"])[-400:])


def steady_steps(check: Check) -> None:
    """Part 5: per-step times over a long decode on the 7B shape (context 128), plain steps and verification of
    4 draft tokens, with a growing cache (eager), a static cache, and compiled steps over it (CUDA graphs on a GPU):
    median, max/median (stalls at new lengths show as the max) and verification / plain step."""
    from specdraft_eval.engine import graphs
    from specdraft_eval.engine.drafter import Proposal
    from specdraft_eval.engine.probe import StepProbe
    from zoo.measure.timing import context_tokens

    target, steps = check.target(), check.args.steady_steps
    runtimes = {"eager": (False, False), "static cache": (True, False), "compiled": (True, True)}
    if check.small:  # inductor's C++ build of 32 layers takes over a minute on 2 cores: tests/test_static.py covers it
        del runtimes["compiled"]
    rows = []
    for runtime, (static, compiled) in runtimes.items():
        tokens = context_tokens(128, target.config.vocab_size)
        engine = graphs.static_caches(target, len(tokens) + steps + 8 + 5, compiled) if static else None
        probe = StepProbe(target, tokens, runtime=engine, widths=range(1, 6))  # widths 1 and 5 warmed up
        warm_up, compiles = probe.warm_up_seconds, graphs.compiled_graphs()
        times: dict[int, list[float]] = {0: [], 4: []}
        for step in range(8 + steps):  # 8 untimed steps more, then the timed ones
            verify = probe.verify(Proposal([probe.tokens[-1]] * 4))  # 4 tokens, rolled back
            plain = probe.advance()  # the plain step that grows the cache
            if step >= 8:
                times[4].append(verify * 1000)
                times[0].append(plain * 1000)
        plain, verify = times[0], times[4]
        rows.append({"runtime": runtime, "steps": steps, "plain_ms_median": statistics.median(plain),
                     "plain_max_over_median": max(plain) / statistics.median(plain),
                     "verify4_ms_median": statistics.median(verify),
                     "verify4_over_plain": statistics.median(verify) / statistics.median(plain),
                     "warm_up_s": warm_up, "timed_compiles": graphs.compiled_graphs() - compiles})
        check.log(f"5 {runtime:14s} plain {rows[-1]['plain_ms_median']:.2f} ms (max/median "
                  f"{rows[-1]['plain_max_over_median']:.2f}), verify 4: x{rows[-1]['verify4_over_plain']:.2f}, "
                  f"warm-up {warm_up:.1f} s, compiles in timed steps {rows[-1]['timed_compiles']}")
    check.results["steady"] = {"context": 128, "rows": rows}


def batch_sweep(check: Check) -> None:
    """Part 7: the batch study on the 7B shape: batch 1, 4, 16, 64 (1, 2, 4 with ``--small``), an EAGLE head (one
    layer + the target's output head) and prompt lookup, γ 4 and dynamic γ, speculative and plain interleaved."""
    from specdraft_eval.drafts import load_draft
    from specdraft_eval.drafts.eagle import EagleDrafter, new_head
    from specdraft_eval.engine.params import GammaPolicy
    from specdraft_eval.integration.offline_data import task_prompts
    from specdraft_eval.models.targets import Target
    from zoo.measure.bench.batch import run_batch_study
    from zoo.measure.bench.result import BenchPlan

    target, sizes = check.target(), (1, 2, 4) if check.small else (1, 4, 16, 64)
    drafters = [EagleDrafter(new_head(target), target, "eagle-head", None),
                load_draft("prompt-lookup", Target(target, check.tokenizer))]
    prompts = task_prompts("specdec_humaneval")[: max(sizes)]
    study = run_batch_study(target, check.tokenizer, drafters, prompts, list(sizes),
                            BenchPlan(4, 1, check.args.new_tokens), policies=[GammaPolicy(4), GammaPolicy(4, True)],
                            on_run=lambda: check.save())
    check.results["batch_sweep"] = study.to_json()
    for row in study.rows:
        check.log(f"7 {row.draft:14s} γ={row.gamma:8s} batch {row.batch_size:3d} x{row.speedup:.2f} "
                  f"draft {row.draft_ms_per_pass:.1f} ms/pass, reads/pass {row.host_reads_per_pass}")


PARTS = {1: step_latency, 2: verify_cost, 3: bench, 4: lm_eval_run, 5: steady_steps, 6: sharded, 7: batch_sweep}


def write_sweep(check: Check, rows: list[dict]) -> None:
    """Part 1's rows as a ``zoo profile --sweep`` file (``sweep.json``: the rows and the latency model fitted to
    them), which ``zoo leaderboard`` plots as latency against depth and width when it lies beside the results."""
    from specdraft_eval.errors import SpecdecError
    from specdraft_eval.results.profiles import SweepRow
    from zoo.measure.latency_model import fit_sweep

    sweep = [SweepRow(r["shape"].split()[0] if r["shape"].split()[0] in ("depth", "width") else "named", r["layers"],
                      r["hidden_size"], r["weight_bytes"], r["ms_median"], r["ms_min"], r["ms_max"], shape=r["shape"])
             for r in rows]
    name = check.results["device"]
    try:
        fit = fit_sweep(sweep, name, name, dtype_bytes=torch.finfo(check.dtype).bits // 8)
    except SpecdecError as exc:  # a sweep that fits no positive per-layer cost: the rows are still worth keeping
        check.log(f"1 no fit: {exc}")
        return
    write_json(check.out / "sweep.json", fit.to_json())
    check.log(f"1 {fit}")


def _table(rows: list[dict], keys: list[str]) -> str:
    from tabulate import tabulate

    return tabulate([[r.get(k) for k in keys] for r in rows], headers=keys, tablefmt="github", floatfmt=".3g")


def report(results: dict) -> str:
    """The figures as markdown: the four tables and what ran where."""
    v = results["versions"]
    lines = [f"# GPU check: {results['device']}", "",
             f"`scripts/gpu_check.py{' --small' if results['small'] else ''}`: {results['dtype']}, torch {v['torch']} "
             f"(CUDA {results['torch_cuda']}), transformers {v['transformers']}, lm-eval {v['lm-eval']}; "
             f"{results.get('elapsed_s', 0):.0f} s. Random-weight Llama shapes (latency only).", ""]
    if "step_latency" in results:
        part = results["step_latency"]
        lines += [f"## 1. Batch-1 step latency (context {part['context']}, attention `{part['attention']}`, median of "
                  f"{part['rounds']} interleaved rounds of {part['steps']} steps)", "",
                  _table(part["rows"], ["shape", "layers", "hidden_size", "params_m", "ms_median", "ms_min",
                                        "ms_max"]), ""]
    if "verify_cost" in results:
        lines += ["## 2. Verification of k draft tokens (chain) or tree nodes on the 7B shape", "",
                  _table(results["verify_cost"]["rows"], ["shape", "context", "k", "ms_median", "ms_min", "ms_max",
                                                          "vs_step"]), ""]
    if "bench" in results:
        rows = [{**r, "tok/s": r["tokens_per_second"]["median"], "x AR": r["vs_autoregressive"]["median"],
                 "x ours plain": r["vs_ours_plain"]["median"]} for r in results["bench"]["configs"]]
        lines += ["## 3. `zoo bench` on the 7B shape", "",
                  _table(rows, ["engine", "draft", "compiled", "tok/s", "x AR", "x ours plain", "tar",
                                "draft_ms_per_token", "verify_ms_per_step", "overhead", "identical", "numerics",
                                "warm_up_seconds", "timed_compiles"]), "",
                  f"Lossless: {results['bench']['lossless']}", ""]
    if "sharded" in results:
        part = results["sharded"]
        rows = [{"mode": name, "exit": r["returncode"], "seconds": r["seconds"], "results_files": r["results_files"],
                 **{k: (r["specdec"] or {}).get(k) for k in ("tensor_parallel", "tar", "tokens_per_second", "speedup",
                                                           "baseline_mismatches")}}
                for name, r in part["runs"].items()]
        lines += [f"## 6. The 7B shape spread over {part['gpus']} GPU(s): `parallelize=true`, `tp_plan=auto`", "",
                  _table(rows, list(rows[0])), ""]
    if "lm_eval" in results:
        rows = [{"batch_size": r["batch_size"], "exit": r["returncode"], "seconds": r["seconds"],
                 **{k: (r["specdec"] or {}).get(k) for k in ("tar", "tokens_per_second", "baseline_tokens_per_second",
                                                           "speedup", "baseline_mismatches", "compile_seconds",
                                                           "recompiles")}}
                for r in results["lm_eval"]["runs"]]
        lines += ["## 4. `lm_eval --model specdec` on the device (4 x 1024 model, prompt lookup, `baseline=true`)", "",
                  _table(rows, list(rows[0])), ""]
    if "batch_sweep" in results:
        rows = [{**r, "tok/s": r["tokens_per_second"]["median"], "plain tok/s": r["plain_tokens_per_second"]["median"]}
                for r in results["batch_sweep"]["rows"]]
        lines += ["## 7. Batches on the 7B shape: EAGLE head and prompt lookup, γ 4 and dynamic", "",
                  _table(rows, ["draft", "gamma", "batch_size", "tok/s", "plain tok/s", "speedup", "tar", "mean_gamma",
                                "draft_ms_per_pass", "host_reads_per_pass"]), ""]
    if "steady" in results:
        lines += ["## 5. Steady decoding on the 7B shape: growing cache, static cache, compiled steps", "",
                  _table(results["steady"]["rows"], ["runtime", "steps", "plain_ms_median", "plain_max_over_median",
                                                     "verify4_ms_median", "verify4_over_plain", "warm_up_s",
                                                     "timed_compiles"]), ""]
    errors = {k: v.strip().splitlines()[-1] for k, v in results.items() if k.endswith("_error")}
    lines += [f"- {k}: {v}" for k, v in errors.items()]
    return "\n".join(lines).rstrip() + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true", help="tiny shapes on the CPU (a rehearsal, under 2 minutes)")
    parser.add_argument("--out", default=os.environ.get("OUT") or "gpu_check_out", help="folder for the figures")
    parser.add_argument("--parts", default="1,2,4,3,5,6,7", help="which parts to run, in this order (comma-separated)")
    parser.add_argument("--tokenizer", help="tokenizer folder (default: the embedded default target's)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per measurement")
    parser.add_argument("--repeats", type=int, default=2, help="bench repeats")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--lm-eval-limit", type=int, default=8)
    parser.add_argument("--compile", action="store_true",
                        help="part 3 with compiled rows beside the eager ones, part 4 with compile=true")
    parser.add_argument("--steady-steps", type=int, default=256, help="timed decode steps in part 5")
    args = parser.parse_args()
    if args.small:
        args.rounds, args.steps, args.repeats, args.new_tokens = 2, 3, 1, 16
        args.lm_eval_limit, args.steady_steps = 4, 16
    if not args.small and not torch.cuda.is_available():
        print("gpu_check: error: no CUDA device here; run with --small for the CPU rehearsal", file=sys.stderr)
        return 2
    check = Check(args)
    failed = []
    for number in dict.fromkeys(int(p) for p in args.parts.split(",")):  # in the order given
        name = PARTS[number].__name__
        try:
            PARTS[number](check)
        except Exception:  # noqa: BLE001 - a part that breaks is a finding: record it, run the next
            check.results[f"{name}_error"] = traceback.format_exc()[-3000:]
            check.log(f"part {number} ({name}) failed:\n{traceback.format_exc()[-1500:]}")
            failed.append(number)
        check.save()
    check.log("done" + (f"; failed parts: {failed}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
