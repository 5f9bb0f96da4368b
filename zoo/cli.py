"""The ``zoo`` command: list, pull, prune, profile and rank drafts for a target."""

from __future__ import annotations

import functools
import json
import os
import sys
import threading
import warnings
from pathlib import Path
from typing import Annotated, Optional

import typer
from tabulate import tabulate

from specdraft_eval.errors import (
    SpecdecError,
    interrupted_exit_code,
    one_line,
    terminate_as_interrupt,
)
from zoo.rank import DEFAULT_MAX_NEW_TOKENS, DEFAULT_TASK

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="The draft zoo: find, build, profile and rank speculative-decoding drafts for a target.")

JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON instead of a table.")]
TargetOpt = Annotated[str, typer.Option("--target", "-t", help="Target model: alias, directory, .gguf or hub id.")]
GammaOpt = Annotated[str, typer.Option("--gamma", help="Comma-separated γ values (draft tokens per step).")]
KernelsOpt = Annotated[str, typer.Option(help="Linear-layer kernels: onednn (weights pre-packed once, CPU float32/bfloat16; "
                                          "what lm_eval --model specdec uses by default) or plain (PyTorch's own).")]


def cli_errors(fn):
    """Bad input and interruptions end with one line on stderr and a non-zero exit code."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from specdraft_eval.files import RecordWarning

        def show(message, category, *rest, _previous=warnings.showwarning, **kw):
            if issubclass(category, RecordWarning):
                typer.echo(f"zoo: warning: {message}", err=True)
            else:
                _previous(message, category, *rest, **kw)

        try:
            with warnings.catch_warnings(), terminate_as_interrupt():
                warnings.simplefilter("always", RecordWarning)
                warnings.showwarning = show
                return fn(*args, **kwargs)
        except SpecdecError as exc:
            typer.echo(one_line(exc).replace("specdec:", "zoo:", 1), err=True)
            raise typer.Exit(1) from None
        except OSError as exc:  # unwritable or full output location, unreadable input
            where = f" {exc.filename}" if exc.filename else ""
            typer.echo(f"zoo: error: cannot write or read{where}: {exc.strerror or exc}; choose a writable location "
                       "with free space (e.g. another --out)", err=True)
            raise typer.Exit(1) from None
        except KeyboardInterrupt as exc:
            from tqdm import tqdm

            for bar in list(getattr(tqdm, "_instances", ())):  # end progress bars where they stopped, so the
                bar.close()                                     # message below starts a line of its own
            typer.echo("zoo: interrupted; nothing was left half-written: rerun the command", err=True)
            if _busy_threads():  # e.g. `zoo pull`'s download workers: stop now, not when their files finish
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(interrupted_exit_code(exc))
            raise typer.Exit(interrupted_exit_code(exc)) from None

    return wrapper


def _busy_threads() -> bool:
    """Whether threads other than the main one would hold the process open at exit (the interpreter joins them).

    Only ``zoo pull``'s download workers start such threads; the hub client writes each file under a temporary name
    and renames it when complete, and ``zoo pull`` deletes its partial files on the way out, so leaving the workers
    mid-file loses nothing: a rerun downloads what was not finished."""
    main = threading.main_thread()
    return any(t is not main and t.is_alive() and not t.daemon for t in threading.enumerate())


def parse_positive_ints(text: str, option: str = "--gamma") -> list[int]:
    """``"1,2,4,8"`` -> ``[1, 2, 4, 8]`` (sorted, distinct, each >= 1), or a one-line error naming ``option``."""
    try:
        values = sorted({int(v) for v in text.split(",") if v.strip()})
    except ValueError:
        values = []
    if not values or values[0] < 1:
        raise SpecdecError(f"bad {option} {text!r}: use integers >= 1 such as 1,2,4,8")
    return values


def emit(rows: list[dict] | dict, as_json: bool, headers: list[str] | None = None, floatfmt: str = ".3g") -> None:
    if as_json:
        typer.echo(json.dumps(rows, indent=2, sort_keys=True))
        return
    rows = rows if isinstance(rows, list) else [rows]
    keys = headers or list(rows[0])
    typer.echo(tabulate([[r.get(k) for k in keys] for r in rows], headers=keys, tablefmt="github",
                        floatfmt=floatfmt, missingval="-"))


def torch_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def progress():
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                    transient=True, console=None)


@app.command("list")
@cli_errors
def list_drafts(
    target: Annotated[Optional[str], typer.Option("--target", "-t", help="Only drafts whose tokenizer fits this target.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Show the catalog of known drafts, by target family, with the training-free kinds."""
    from zoo import catalog

    rows = catalog.entries(target)
    free = [{"name": d["name"], "family": "any", "source": d["source"]} for d in catalog.load()["training_free"]]
    if as_json:
        emit({"drafts": rows, "training_free": free}, True)
        return
    emit(rows, False, ["name", "family", "hub_id", "parameters_m", "layers", "hidden_size", "heads", "licence", "source"])
    typer.echo("")
    emit(free, False, ["name", "family", "source"])


@app.command()
@cli_errors
def pull(
    name: Annotated[str, typer.Argument(help="Catalog name or hub id (org/name).")],
    revision: Annotated[Optional[str], typer.Option(help="Branch, tag or commit.")] = None,
    target: Annotated[Optional[str], typer.Option("--target", "-t", help="Check the draft's tokenizer against this target.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Download a draft into the Hugging Face cache (interrupted: keeps whole files only; offline: answer from the cache)."""
    from zoo.pull import pull as do_pull

    result = do_pull(name, revision, target)
    emit(result, as_json)


@app.command()
@cli_errors
def prune(
    model: Annotated[str, typer.Argument(help="Model to prune: the target itself or a larger draft.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="New directory for the draft (must not exist).")],
    layers: Annotated[Optional[int], typer.Option("--layers", "-n", help="Number of decoder layers to keep.")] = None,
    keep: Annotated[Optional[str], typer.Option("--keep", help="Exact layers to keep, e.g. 0,1,2,3,29 or 0-3,29.")] = None,
    select: Annotated[str, typer.Option(help="With --layers: first, uniform or block-influence (ShortGPT).")] = "first",
    calibration: Annotated[Optional[str], typer.Option(help="Calibration/distillation text: a file, a bundled task "
                                                       "(specdec_humaneval, specdec_mmlu_cot) or literal text.")] = None,
    distill_tokens: Annotated[int, typer.Option(help="Distil from the source model on this many tokens (0: no).")] = 0,
    on_policy: Annotated[bool, typer.Option(help="Distil on text the source model generates itself (slower).")] = False,
    vocab_top: Annotated[Optional[int], typer.Option(help="Give the draft a reduced output head over the K most "
                                                     "frequent calibration tokens (draft-side only).")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Build a depth-pruned draft (optionally distilled) as a normal HF model directory."""
    from specdraft_eval.targets import load_target
    from zoo import prune as pruning

    pruning.check_out(out)
    if distill_tokens < 0:
        raise SpecdecError(f"--distill-tokens {distill_tokens} must be >= 0")
    source, tokenizer = load_target(model)
    needs_text = bool(distill_tokens) or vocab_top is not None or (select == "block-influence" and keep is None)
    texts = pruning.calibration_texts(calibration) if calibration or needs_text else []
    kept = pruning.resolve_keep(source, tokenizer, layers, keep, select, texts)
    draft = pruning.build_pruned(source, kept)
    meta = {"source": model, "kept_layers": kept, "select": select if keep is None else "explicit",
            "calibration": calibration or pruning.DEFAULT_CALIBRATION, "distill_tokens": distill_tokens,
            "on_policy": on_policy, "source_layers": source.config.num_hidden_layers, "vocab_top": vocab_top}
    draft_vocab = pruning.frequent_tokens(tokenizer, texts, vocab_top) if vocab_top is not None else None
    if distill_tokens:
        if on_policy:
            texts = pruning.on_policy_texts(source, tokenizer, texts, distill_tokens)
        with progress() as bar:
            task = bar.add_task("distilling", total=distill_tokens)
            meta["distillation"] = pruning.distill(draft, source, tokenizer, texts, distill_tokens,
                                                   on_step=lambda n: bar.advance(task, n))
    pruning.save_atomically(draft, tokenizer, out, meta, draft_vocab)
    emit({"out": str(out), **{k: meta[k] for k in ("kept_layers", "select", "distill_tokens", "vocab_top")},
          **({"kl_first": meta["distillation"]["kl_first"], "kl_last": meta["distillation"]["kl_last"]}
             if distill_tokens else {})}, as_json)


@app.command()
@cli_errors
def ngram(
    model: Annotated[str, typer.Argument(help="The target whose own continuations the draft learns.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="New directory for the draft (must not exist).")],
    prompts: Annotated[Optional[str], typer.Option(help="Prompts to continue: a bundled task's held-in documents "
                                                   "(specdec_humaneval, specdec_mmlu_cot) or a text file of prompts "
                                                   "separated by blank lines (default: both tasks' held-in documents).")] = None,
    new_tokens: Annotated[int, typer.Option(help="Tokens the target generates per prompt.")] = 128,
    max_prompts: Annotated[int, typer.Option(help="Continue at most this many prompts (the default keeps the build "
                                             "under 10 minutes on 2 CPU cores).")] = 160,
    as_json: JsonOpt = False,
) -> None:
    """Build an n-gram draft (`draft=ngram:DIR`) from the target's own greedy continuations of held-in prompts."""
    from specdraft_eval.targets import load_target
    from zoo import ngram as ngrams
    from zoo import prune as pruning

    pruning.check_out(out)
    texts = ngrams.ngram_prompts(prompts, max_prompts)
    target, tokenizer = load_target(model, kernels="onednn")
    with progress() as bar:
        task = bar.add_task("continuing prompts", total=len(texts))
        meta = ngrams.build(target, tokenizer, model, texts, new_tokens, out, on_batch=lambda n: bar.advance(task, n))
    emit({"out": str(out), "draft": f"ngram:{out}", **meta}, as_json)


@app.command()
@cli_errors
def profile(
    target: TargetOpt = "smollm2-135m-instruct",
    drafts: Annotated[Optional[list[str]], typer.Option("--drafts", "-d", help="Drafts to time (repeat the option).")] = None,
    gamma: GammaOpt = "1,2,4,8",
    context: Annotated[int, typer.Option(help="Context length (tokens) at which to time.")] = 256,
    repeats: Annotated[int, typer.Option(help="Timed decoding steps per figure (after a warm-up); medians, with "
                                         "min and max kept.")] = 16,
    out: Annotated[Optional[Path], typer.Option(help="Profile file (default: in the cache, reused by rank).")] = None,
    sweep: Annotated[bool, typer.Option(help="Instead: latency vs depth and width of random-weight models, and a "
                                        "fit of the latency model's per-layer cost and bandwidth to it.")] = False,
    calibrate: Annotated[Optional[str], typer.Option(help="With --sweep: store the fit as a calibration under this "
                                                     "GPU name, which `zoo rank --gpu NAME` then uses.")] = None,
    kernels: KernelsOpt = "onednn",
    as_json: JsonOpt = False,
) -> None:
    """Measure t_target, t_verify(γ) and each draft's t_draft on this machine; write a profile for rank."""
    from zoo import profile as prof

    if calibrate and not sweep:
        raise SpecdecError("--calibrate needs --sweep: the calibration is fitted to the depth/width sweep")
    if sweep:
        fit, path = prof.sweep(repeats, calibrate)
        if as_json:
            emit({"rows": fit.rows, "fit": {**fit.to_json(), "rows": None, "path": str(path) if path else None}}, True)
            return
        emit(fit.rows, False)
        typer.echo(f"fit: ms/token = {fit.per_layer_ms:.3g} ms × layers + weight bytes / "
                   f"{fit.bandwidth_gb_s:.3g} GB/s (max error {fit.max_relative_error:.1%})"
                   + (f"; calibration written to {path} for `zoo rank --gpu {calibrate}`" if calibrate else ""))
        return
    from specdraft_eval.drafts import load_draft
    from specdraft_eval.targets import load_target

    gammas = parse_positive_ints(gamma)
    model, tokenizer = load_target(target, kernels=kernels)
    drafters = [load_draft(name, model, tokenizer) for name in drafts or ["prompt-lookup"]]
    data, path = prof.measure_and_write(model, target, drafters, gammas, context, repeats, out)
    if as_json:
        emit({**data.to_json(), "path": str(path)}, True)
        return
    typer.echo(f"target {target} on {data.hardware}: {data.t_target_ms:.2f} ms/token autoregressive "
               f"(medians over {repeats} steps on a growing cache of {context}+ tokens; min–max beside)")
    emit([{"draft tokens k": k, "t_verify_ms": s.median, "min–max": str(s)} for k, s in sorted(data.t_verify.items())],
         False)
    emit([{"draft": d, "t_draft_ms": f.t_draft_ms, "min–max": str(f.t_draft),
           "draft_prefill_ms_per_token": f.draft_prefill_ms_per_token, "parameters_m": f.parameters_m,
           "kv_bytes_per_token": f.kv_bytes_per_token} for d, f in data.drafts.items()], False)
    typer.echo(f"profile written to {path}")


@app.command()
@cli_errors
def rank(
    target: TargetOpt = "smollm2-135m-instruct",
    gpu: Annotated[str, typer.Option(help="'this' (measure this machine) or a GPU name: a100-40gb, a100-80gb, "
                                     "h100, h200, l4, a10g, rtx-4090, cpu, or one you calibrated.")] = "this",
    task: Annotated[str, typer.Option(help="Task whose TAR to use or measure.")] = DEFAULT_TASK,
    measure: Annotated[int, typer.Option(help="Measure TAR on this many prompts of the task (0: results only).")] = 0,
    drafts: Annotated[Optional[list[str]], typer.Option("--drafts", "-d", help="Drafts to rank (repeat); default: "
                                                         "prompt-lookup, a 5-layer view, local catalog drafts and "
                                                         "every draft with results for the target.")] = None,
    gamma: Annotated[Optional[str], typer.Option(help="Comma-separated γ values to rank; default: every γ up to the "
                                                 "largest in the results (smaller ones estimated), or 1,2,4,8.")] = None,
    results: Annotated[Optional[list[Path]], typer.Option(help="Results folders to read TAR from "
                                                          "(default: leaderboard).")] = None,
    max_new_tokens: Annotated[int, typer.Option(help="Tokens per measured generation.")] = DEFAULT_MAX_NEW_TOKENS,
    runtime: Annotated[str, typer.Option(help="With a named GPU: eager (PyTorch eager, as this engine) or "
                                         "cuda-graphs (torch.compile / graph replay).")] = "eager",
    as_json: JsonOpt = False,
) -> None:
    """Rank drafts for a target and a GPU by predicted tokens/s (analytical model, measured TAR).

    A named GPU ranks from model shapes alone (catalog or config.json), without weights."""
    from zoo.ranking_run import run_rank

    rows = run_rank(target, gpu, task, measure, drafts, parse_positive_ints(gamma) if gamma else None,
                    results or None, max_new_tokens, runtime)
    if as_json:
        emit(rows, True)
        return
    typer.echo(f"target {target} on {gpu}: {rows[0]['target_ms_per_token']:.3g} ms per autoregressive token")
    for row in rows:
        row["tokens/s by γ"] = "  ".join(f"{g}: {tps:.3g}" for g, tps in row["predicted_by_gamma"].items()) or None
    emit(rows, False, ["draft", "best_gamma", "predicted_tokens_per_second", "tokens/s by γ",
                       "measured_tokens_per_second", "speedup", "tar", "tar_source", "draft_ms_per_token",
                       "kv_bytes_per_token", "latency_source"])


@app.command()
@cli_errors
def validate(
    target: TargetOpt = "smollm2-135m-instruct",
    drafts: Annotated[Optional[list[str]], typer.Option("--drafts", "-d", help="Drafts to validate (repeat); "
                                                         "default: prompt-lookup and layers:0-4.")] = None,
    task: Annotated[str, typer.Option(help="Bundled task whose prompts to run.")] = DEFAULT_TASK,
    prompts: Annotated[int, typer.Option(help="Prompts per measurement (the task's first N; the profile uses "
                                         "the next two).")] = 4,
    gamma: GammaOpt = "1,2,4",
    repeats: Annotated[int, typer.Option(help="End-to-end repeats per draft and γ (medians, min, max).")] = 3,
    max_new_tokens: Annotated[int, typer.Option(help="Tokens per generation.")] = DEFAULT_MAX_NEW_TOKENS,
    plot: Annotated[Path, typer.Option(help="Where to write the predicted-vs-measured plot (and beside it, "
                                       "the figures as .json).")] = Path("leaderboard/validation.png"),
    kernels: KernelsOpt = "onednn",
    as_json: JsonOpt = False,
) -> None:
    """Check the analytical model: predict tokens/s from a separate profile and measured TAR, then measure."""
    from specdraft_eval.drafts import load_draft
    from specdraft_eval.offline_data import task_prompts
    from specdraft_eval.files import write_json
    from specdraft_eval.targets import load_target
    from zoo import validate as validation

    gammas = parse_positive_ints(gamma)
    validation.check_options(prompts, repeats, max_new_tokens)
    texts = task_prompts(task)
    if len(texts) < prompts + validation.PROFILE_PROMPTS:
        raise SpecdecError(f"--prompts {prompts} leaves too few of {task}'s {len(texts)} prompts for the profile: "
                           f"use at most {len(texts) - validation.PROFILE_PROMPTS}")
    model, tokenizer = load_target(target, kernels=kernels)
    drafters = [load_draft(name, model, tokenizer) for name in drafts or ["prompt-lookup", "layers:0-4"]]
    ids = [tokenizer(t).input_ids[-512:] for t in texts[: prompts + validation.PROFILE_PROMPTS]]
    with progress() as bar:
        job = bar.add_task("profiling, then measuring", total=1 + repeats * len(drafters) * len(gammas))
        result = validation.validate(model, target, drafters, ids[:prompts], ids[prompts:], gammas,
                                     repeats, max_new_tokens, on_run=lambda: bar.advance(job))
    validation.plot(result, plot)
    write_json(plot.with_suffix(".json"), result)
    if as_json:
        emit(result["rows"], True)
        return
    typer.echo(f"target {target} on {result['hardware']}: {prompts} prompts × {max_new_tokens} tokens, "
               f"{repeats} repeats (medians; min–max over repeats)")
    emit([{"draft": r["draft"], "γ": r["gamma"], "predicted tok/s": r["predicted_tokens_per_second"],
           "measured tok/s": r["measured_tokens_per_second"],
           "measured min–max": f"{r['measured_min']:.3g}–{r['measured_max']:.3g}",
           "deviation": f"{r['deviation']:+.1%}", "TAR": r["tar"], "loop overhead": f"{r['loop_overhead']:.1%}"}
          for r in result["rows"]], False)
    typer.echo(f"median |deviation| {result['median_abs_deviation']:.1%}, max {result['max_abs_deviation']:.1%}; "
               f"plot written to {plot}")


@app.command()
@cli_errors
def bench(
    target: TargetOpt = "smollm2-135m-instruct",
    drafts: Annotated[Optional[list[str]], typer.Option("--draft", "-d", help="Draft to bench (repeat the option); "
                                                         "default: prompt-lookup.")] = None,
    task: Annotated[Optional[str], typer.Option(help="Bundled task whose prompts to use (default "
                                                "specdec_humaneval).")] = None,
    prompts: Annotated[Optional[Path], typer.Option(help="Prompts file instead: a JSON list of strings or JSON "
                                                    'lines of strings or {"prompt": ...}.')] = None,
    limit: Annotated[int, typer.Option(help="Number of prompts.")] = 4,
    gamma: Annotated[int, typer.Option(help="γ (draft tokens per step) for the constant-γ runs; dynamic γ "
                                       "starts there.")] = 4,
    repeats: Annotated[int, typer.Option(help="Timed passes over the prompts; medians, min and max are over these.")] = 3,
    max_new_tokens: Annotated[int, typer.Option(help="Tokens per generation.")] = 128,
    dtype: Annotated[str, typer.Option(help="Weights' dtype: float32 or bfloat16.")] = "float32",
    kernels: KernelsOpt = "onednn",
    batch_size: Annotated[Optional[str], typer.Option(
        "--batch-size", help="Batch study instead: comma-separated batch sizes (e.g. 1,2,4,8); tokens/s of our "
        "batched engine, speculative and plain, per batch size (--limit is raised to the largest).")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Time our engine against transformers' generate and assisted generation (greedy, same prompts), or with
    --batch-size, speculative against plain decoding at each batch size."""
    from specdraft_eval import kernels as kernel_paths
    from specdraft_eval.drafts import load_draft
    from specdraft_eval.targets import load_target
    from zoo import batch_study
    from zoo import bench as benchmark

    if task and prompts:
        raise SpecdecError("give --task or --prompts, not both")
    if dtype not in ("float32", "bfloat16", "float16"):
        raise SpecdecError(f"bad --dtype {dtype!r}: use float32, bfloat16 or float16")
    benchmark.check_options(gamma, repeats, max_new_tokens)
    sizes = parse_positive_ints(batch_size, "--batch-size") if batch_size is not None else None
    texts = benchmark.load_prompts(task, prompts, limit if sizes is None or limit < 1 else max(limit, *sizes))
    model, tokenizer = load_target(target, dtype=dtype, kernels=kernels)
    names = drafts or ["prompt-lookup"]
    if sizes is not None:
        drafters = [load_draft(name, model, tokenizer) for name in names]
        batches = sum(-(-len(texts) // size) for size in sizes) * repeats * len(drafters)
        with progress() as bar:
            job = bar.add_task("batch study", total=batches)
            result = batch_study.run_batch_study(model, tokenizer, drafters, texts, sizes, gamma, repeats,
                                                 max_new_tokens, on_run=lambda: bar.advance(job))
        result["task"] = None if prompts else task or "specdec_humaneval"
        if as_json:
            emit(result, True)
            return
        typer.echo(f"target {target} ({result['dtype']}) on {result['hardware']}, {result['threads']} threads: "
                   f"{len(texts)} prompts × {max_new_tokens} new tokens, γ={gamma}, {repeats} repeats (median [min–max])")
        emit(batch_study.table_rows(result), False)
        for name, size in result["pays_up_to_batch"].items():
            typer.echo(f"{name}: speculation pays " + (f"up to batch {size}" if size else "at no batch size measured"))
        return
    plain = None
    if kernel_paths.kernels_of(model) != "plain":  # transformers as users run it, too
        plain_model, _ = load_target(target, dtype=dtype)
        plain = plain_model, [load_draft(name, plain_model, tokenizer) for name in names]
    drafters = [load_draft(name, model, tokenizer) for name in names]
    runs = repeats * len(texts) * len(benchmark.configurations(model, drafters, gamma, plain))
    with progress() as bar:
        job = bar.add_task("benchmarking", total=runs)
        result = benchmark.run_bench(model, target, tokenizer, drafters, texts, gamma, repeats, max_new_tokens,
                                     on_run=lambda: bar.advance(job), plain=plain)
    result["task"] = None if prompts else task or "specdec_humaneval"
    if as_json:
        emit(result, True)
    else:
        typer.echo(f"target {target} ({result['dtype']}) on {result['hardware']}: {len(texts)} prompts × "
                   f"{max_new_tokens} new tokens, γ={gamma}, {repeats} repeats (median [min–max])")
        emit(benchmark.table_rows(result), False, floatfmt=".3g")
    benchmark.check_identical(result, texts)


@app.command()
@cli_errors
def recommend(
    target: TargetOpt = "smollm2-135m-instruct",
    task: Annotated[Optional[str], typer.Option(help="Score by this task's speedup (default: geometric mean over the "
                                                "tasks measured).")] = None,
    results: Annotated[Optional[list[Path]], typer.Option(help="Results folders or files to choose from (repeat); "
                                                          "default: the published leaderboard/results.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Say what draft=auto resolves to for a target, and why (measured speedups from results files)."""
    from dataclasses import asdict

    from specdraft_eval.recommend import recommend as choose
    from specdraft_eval.environment import hardware

    for path in results or []:
        if not path.exists():
            raise SpecdecError(f"--results {path} does not exist: give folders written by lm_eval --output_path")
    choice = choose(target, task, list(results) if results else None, hardware("cuda" if torch_cuda() else "cpu"))
    if as_json:
        emit(asdict(choice), True)
        return
    typer.echo(f"draft=auto for {target}: draft={choice.draft}, num_draft_tokens={choice.num_draft_tokens}, "
               f"dynamic_gamma={str(choice.dynamic_gamma).lower()}\n  {choice.reason}")
    if choice.candidates:
        emit([{"draft": c.draft, "γ": c.num_draft_tokens, "dynamic γ": c.dynamic_gamma,
               "speedup by task": ", ".join(f"{t} {v:.2f}x" for t, v in sorted(c.speedup.items())),
               "score": c.score, "loads here": c.loadable} for c in choice.candidates], False, floatfmt=".2f")


@app.command()
@cli_errors
def leaderboard(
    results: Annotated[list[Path], typer.Argument(help="Results folders (lm_eval --output_path) or files.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder for README.md, leaderboard.csv, index.html, PNGs.")],
    as_json: JsonOpt = False,
) -> None:
    """Build the leaderboard (markdown, CSV, sortable HTML, plots) from specdec results files."""
    from zoo import leaderboard as board

    rows = board.collect(list(results))
    written = board.write(rows, out)
    emit({"rows": len(rows), "files": [str(p) for p in written]}, as_json)


if __name__ == "__main__":
    app()
