"""The ``zoo`` command: each command parses its options, makes one library call and renders the result."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from specdraft_eval.errors import SpecdecError
from specdraft_eval.models.targets import DEFAULT_TARGET

from zoo.cli.support import (  # isort: skip (one wrapped list, not a line per name)
    BatchSizeOpt, BenchGammaOpt, CalibrateOpt, CompileOpt, ContextOpt, DeviceOpt, DraftsOpt, DtypeOpt, DynamicOpt,
    GammaOpt, GpuOpt, GridOpt, JsonOpt, KernelsOpt, MaxNewOpt, PlotOpt, ProfileOutOpt, PromptsFileOpt, RankGammaOpt,
    RepeatsOpt, ResultsOpt, RuntimeOpt, ScoreTaskOpt, SweepOpt, TargetOpt, UseKernelsOpt, cli_errors, emit, existing,
    gamma_policies, load_settings, one_gamma, parse_positive_ints, progress
)
from zoo.cli import build as cli_build
from zoo.measure.rank import DEFAULT_MAX_NEW_TOKENS, DEFAULT_TASK

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="The draft zoo: find, build, profile and rank speculative-decoding drafts for a target.")

TaskText = "Bundled task whose prompts to use (specdec_humaneval, specdec_mmlu_cot)."


@app.command("list")
@cli_errors
def list_drafts(
    target: Annotated[Optional[str], typer.Option("--target", "-t", help="Only drafts whose tokenizer fits this "
                                                                         "target.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Show the catalog of known drafts, by target family, and the draft kinds."""
    from zoo.build import catalog

    data = catalog.listing(target).to_json()
    if as_json:
        return emit(data, True)
    emit(data["drafts"], False, ["name", "family", "hub_id", "parameters_m", "layers", "licence", "source"])
    emit(data["kinds"], False, ["name", "family", "source"])


for _name, _command in cli_build.COMMANDS.items():  # pull, prune, ngram, regenerate, train-head, export
    app.command(_name)(_command)


@app.command()
@cli_errors
def profile(
    target: TargetOpt = DEFAULT_TARGET,
    drafts: DraftsOpt = None,
    gamma: GammaOpt = "1,2,4,8",
    context: Annotated[int, typer.Option(help="Context length (tokens) at which to time.")] = 256,
    repeats: RepeatsOpt = 16,
out: ProfileOutOpt = None,
sweep: SweepOpt = False,
calibrate: CalibrateOpt = None,
    kernels: KernelsOpt = "onednn",
    device: DeviceOpt = None, dtype: DtypeOpt = "auto", use_kernels: UseKernelsOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Measure t_target, t_verify(γ) and each draft's t_draft on this machine's --device (default drafts:
    prompt-lookup); write a profile (keyed by the device's name) for rank."""
    from zoo.measure import profile as prof

    if calibrate and not sweep:
        raise SpecdecError("--calibrate needs --sweep: the calibration is fitted to the depth/width sweep")
    settings = load_settings(device, dtype, use_kernels, kernels)
    if sweep:
        fit, paths = prof.sweep(repeats, calibrate, settings, out)
        rows = [row.to_json() for row in fit.rows]
        if as_json:
            return emit({"rows": rows, "fit": {**fit.to_json(), "rows": None, "paths": [str(p) for p in paths]}}, True)
        emit(rows, False)
        typer.echo(str(fit) + (f"; calibration written to {paths[0]} for `zoo rank --gpu {calibrate}`" if calibrate
                               else "") + (f"; sweep written to {out}" if out else ""))
        return
    data, path = prof.profile_target(target, drafts or ["prompt-lookup"], parse_positive_ints(gamma), context,
                                     repeats, out, settings)
    if as_json:
        return emit({**data.to_json(), "path": str(path)}, True)
    typer.echo(f"target {target} on {data.hardware}: {data.t_target_ms:.2f} ms/token autoregressive "
               f"(medians over {repeats} steps on a growing cache of {context}+ tokens; min–max beside)")
    for rows in prof.table_rows(data):
        emit(rows, False)
    typer.echo(f"profile written to {path}")


@app.command()
@cli_errors
def rank(
    target: TargetOpt = DEFAULT_TARGET,
gpu: GpuOpt = "this",
    task: Annotated[str, typer.Option(help="Task whose TAR to use or measure.")] = DEFAULT_TASK,
    measure: Annotated[int, typer.Option(help="Measure TAR on this many prompts of the task (0: results only).")] = 0,
    drafts: DraftsOpt = None,
gamma: RankGammaOpt = None,
    results: ResultsOpt = None,
    max_new_tokens: MaxNewOpt = DEFAULT_MAX_NEW_TOKENS, context: ContextOpt = 128,
runtime: RuntimeOpt = "eager",
    gpus: Annotated[int, typer.Option(help="A named --gpu: the target sharded over this many of them (tensor "
                                           "parallel: weights split, two all-reduces per layer); drafts on one.")] = 1,
    device: DeviceOpt = None, dtype: DtypeOpt = "auto", use_kernels: UseKernelsOpt = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Every γ's prediction, TAR and latency sources, "
                                          "break-even TARs (wider than 120 columns).")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Rank drafts for a target and a GPU by predicted tokens/s (analytical model, measured TAR); a named GPU ranks
    from model shapes alone. Default drafts: every kind's candidates (prompt-lookup, a 5-layer view, suffix), local
    catalog drafts, drafts with results."""
    from zoo.measure.rank import RankOptions, table_rows
    from zoo.measure.ranking_run import run_rank

    options = RankOptions(gpu, task, measure, drafts, parse_positive_ints(gamma) if gamma else None, results or None,
                          max_new_tokens, runtime, context, gpus)
    result = run_rank(target, options, load_settings(device, dtype, use_kernels))
    if as_json:
        return emit(result.to_json(), True)
    typer.echo(f"target {target} on {gpu}{f' x{gpus}' if gpus > 1 else ''}: {result.target_ms_per_token:.3g} ms per "
               "autoregressive token"
               + (f"\nlatency model against measurements: {e}" if (e := result.latency_model_error) else ""))
    emit(table_rows(result, verbose), False)
    if result.published:
        from dataclasses import asdict

        from zoo.measure.paper import NOT_AVAILABLE

        typer.echo("\nthe founding paper's published figures, predicted for this GPU and runtime (drafts on one GPU):")
        emit([asdict(c) for c in result.published], False)
        typer.echo(NOT_AVAILABLE)


@app.command()
@cli_errors
def validate(
    target: TargetOpt = DEFAULT_TARGET,
    drafts: DraftsOpt = None,
    task: Annotated[Optional[list[str]], typer.Option(help=TaskText + " Repeat for several.")] = None,
    prompts: Annotated[int, typer.Option(help="Prompts per measurement: each task's first N.")] = 4,
    gamma: GammaOpt = "1,2,4",
    grid: GridOpt = False, dynamic: DynamicOpt = False,
    repeats: RepeatsOpt = 3,
    max_new_tokens: MaxNewOpt = DEFAULT_MAX_NEW_TOKENS,
plot: PlotOpt = Path("validation.png"),
    kernels: KernelsOpt = "onednn",
    device: DeviceOpt = None, dtype: DtypeOpt = "auto", use_kernels: UseKernelsOpt = False,
    quick: Annotated[bool, typer.Option("--quick", help="A first look in a few minutes: 1 prompt, γ 2, 1 repeat, "
                                        "32 tokens (overrides those options).")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Check the analytical model: predict the speedup over plain decoding (and tokens/s) from a profile per
    context bucket and repeat and the runs' counts, then measure (default drafts: prompt-lookup and layers:0-4;
    --grid: drafts x γ 1-4 x both tasks). It says up front how much it will generate."""
    from zoo.measure import validate as validation

    if quick:
        prompts, gamma, repeats, max_new_tokens = 1, "2", 1, 32
    tasks, drafts, gammas = validation.configurations(task, drafts, parse_positive_ints(gamma), grid)
    typer.echo(validation.workload(drafts, tasks, gammas, prompts, repeats, max_new_tokens, dynamic or grid), err=True)
    with progress("profiling, then measuring") as tick:
        result = validation.run(target, drafts, tasks, prompts, gammas, repeats, max_new_tokens, plot,
                                load_settings(device, dtype, use_kernels, kernels), dynamic or grid, tick)
    if as_json:
        return emit(result.to_json()["rows"], True)
    typer.echo(f"target {target} on {result.hardware}:\n  {prompts} prompts × {max_new_tokens} tokens, "
               f"{repeats} repeats (medians; min–max over repeats; tokens/s in --json)")
    emit(validation.table_rows(result), False)
    tps_median, tps_max = result.tokens_per_second_deviations
    typer.echo(f"|speedup deviation|: median {result.median_abs_deviation:.1%}, p90 {result.p90_abs_deviation:.1%}, "
               f"max {result.max_abs_deviation:.1%} (tokens/s: median {tps_median:.1%}, max {tps_max:.1%})\n"
               f"plot written to {plot}")


@app.command()
@cli_errors
def bench(
    target: TargetOpt = DEFAULT_TARGET,
    drafts: DraftsOpt = None,
    task: Annotated[Optional[str], typer.Option(help=TaskText + " Default specdec_humaneval.")] = None,
prompts: PromptsFileOpt = None,
    limit: Annotated[int, typer.Option(help="Number of prompts.")] = 4,
gamma: BenchGammaOpt = "4",
    repeats: RepeatsOpt = 3,
    max_new_tokens: MaxNewOpt = 128,
    kernels: KernelsOpt = "onednn",
    device: DeviceOpt = None, dtype: DtypeOpt = "auto", use_kernels: UseKernelsOpt = False, compile: CompileOpt = False,
batch_size: BatchSizeOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Time our engine against transformers' generate and assisted generation (greedy, same prompts; default
    draft: prompt-lookup), or with --batch-size, speculative against plain decoding at each batch size."""
    from zoo.measure.bench import batch, render, run
    from zoo.measure.bench.result import BenchPlan
    from zoo.measure.prompts import load_prompts

    sizes = parse_positive_ints(batch_size, "--batch-size") if batch_size is not None else None
    if sizes and compile:
        raise SpecdecError("--compile runs compiled configurations beside the comparison's, not in the batch study: "
                           "drop --batch-size or --compile")
    texts = load_prompts(task, prompts, limit if sizes is None or limit < 1 else max(limit, *sizes))
    policies = gamma_policies(gamma) if sizes else None
    plan = BenchPlan(policies[0].num_draft_tokens if sizes else one_gamma(gamma), repeats, max_new_tokens, compile)
    args = (target, drafts or ["prompt-lookup"], texts, plan, load_settings(device, dtype, use_kernels, kernels))
    with progress("batch study" if sizes else "benchmarking") as tick:
        result = (batch.study(*args, sizes, tick, policies, None if prompts else task or "specdec_humaneval")
                  if sizes else run.bench(*args, tick))
    result.task = None if prompts else task or "specdec_humaneval"
    if as_json:
        return emit(result.to_json(), True)
    typer.echo(f"target {target} ({result.dtype}) on {result.hardware}: {len(texts)} prompts × "
               f"{max_new_tokens} new tokens, γ={gamma}, {repeats} repeats (median [min–max])")
    emit(render.batch_rows(result) if sizes else render.table_rows(result), False)
    for name, size in (result.pays_up_to_batch.items() if sizes else []):
        typer.echo(f"{name}: speculation pays " + (f"up to batch {size}" if size else "at no batch size measured"))


@app.command()
@cli_errors
def compare(
    target: TargetOpt = DEFAULT_TARGET,
    draft: Annotated[str, typer.Option("--draft", "-d", help="The draft, as vLLM serves it (prompt-lookup, suffix, "
                                                              "eagle:DIR, a draft model).")] = "prompt-lookup",
    task: Annotated[Optional[str], typer.Option(help=TaskText + " Default specdec_humaneval.")] = None,
    prompts: PromptsFileOpt = None,
    limit: Annotated[int, typer.Option(help="Number of prompts.")] = 4,
    gamma: Annotated[int, typer.Option("--gamma", help="γ (num_speculative_tokens).")] = 4,
    max_new_tokens: MaxNewOpt = 64,
    batch_size: Annotated[str, typer.Option("--batch-size", help="Comma-separated batch sizes.")] = "1",
    repeats: RepeatsOpt = 3,
    dynamic_gamma: Annotated[bool, typer.Option("--dynamic-gamma", help="Our engine chooses γ per step (vLLM drafts "
                                                "γ every step): our best configuration beside vLLM's.")] = False,
    static_cache: Annotated[bool, typer.Option("--static-cache", help="Our engine (both sides) over a preallocated "
                                               "KV cache (model_args static_cache=true).")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Our engine against vLLM (engine=vllm: .venv-vllm) on the same prompts and draft, per batch size: outputs
    identical or not, acceptance by position and mean acceptance length as vLLM counts them, tokens/s and speedup."""
    from zoo.measure.bench.render import spread_text
    from zoo.measure.engines import compare_engines
    from zoo.measure.prompts import check_positive, load_prompts

    check_positive(limit=limit, gamma=gamma, max_new_tokens=max_new_tokens, repeats=repeats)
    sizes = parse_positive_ints(batch_size, "--batch-size")
    texts = load_prompts(task, prompts, limit)
    with progress("comparing engines") as tick:
        result = compare_engines(target, draft, texts, gamma, max_new_tokens, sizes, repeats, tick, dynamic_gamma,
                                 static_cache)
    if as_json:
        return emit(result.to_json(), True)
    ours_gamma = f"ours dynamic from {gamma}, vLLM {gamma}" if dynamic_gamma else str(gamma)
    typer.echo(f"target {target}, draft {result.draft}, γ={ours_gamma}: {len(texts)} prompts × {max_new_tokens} "
               f"new tokens, greedy, {repeats} repeats (median [min–max]); vLLM {result.vllm_version}")
    emit([{"engine": r.engine, "batch": r.batch_size, "tok/s": spread_text(r.tokens_per_second, ".1f"),
           "plain tok/s": spread_text(r.plain_tokens_per_second, ".1f"), "speedup": spread_text(r.speedup, ".2f"),
           "vLLM MAL": r.mean_acceptance_length, "accept by position": " ".join(f"{x:.2f}" for x in
                                                                              r.acceptance_by_position),
           "= own plain": f"{r.identical_to_own_plain}/{r.requests}",
           "= other engine": f"{r.identical_to_other_engine}/{r.requests}"} for r in result.rows], False)
    for size in sizes:
        typer.echo(f"batch {size}: acceptance by position differs by at most {result.position_difference(size)}")


@app.command()
@cli_errors
def recommend(
    target: TargetOpt = DEFAULT_TARGET,
    task: ScoreTaskOpt = None,
    results: ResultsOpt = None,
    batch_size: Annotated[int, typer.Option("--batch-size", help="The run's batch size (lm_eval "
                                            "--batch_size).")] = 1,
    engine: Annotated[str, typer.Option(help="The engine that decodes: specdec (ours) or vllm (engine=vllm).")]
    = "specdec",
    as_json: JsonOpt = False,
) -> None:
    """Say what draft=auto resolves to for a target, and why (this machine's results store first, then the
    published results; measured speedups; only configurations measured in the engine given)."""
    from dataclasses import asdict

    from specdraft_eval.integration.recommend import recommend as choose
    from specdraft_eval.measure.environment import default_device, hardware

    if engine not in ("specdec", "vllm"):
        raise SpecdecError(f"--engine {engine!r}: use specdec or vllm")
    choice = choose(target, task, existing(results), hardware(default_device()), batch_size=batch_size,
                    engine=engine)
    if as_json:
        return emit(asdict(choice), True)
    typer.echo(f"draft=auto for {target}: draft={choice.draft}, num_draft_tokens={choice.num_draft_tokens}, "
               f"dynamic_gamma={str(choice.dynamic_gamma).lower()}\n  {choice.reason}"
               + (f"\n  nothing measured on this machine at batch {batch_size}: draft=auto tunes on the run's first "
                  "requests (draft=auto:fixed takes the line above); `zoo tune` measures ahead" if choice.tune else ""))
    if choice.candidates:
        emit(choice.table_rows(), False, floatfmt=".2f")


@app.command()
@cli_errors
def tune(
    target: TargetOpt = DEFAULT_TARGET,
    task: Annotated[str, typer.Option(help=TaskText + " Tuning reads documents no draft was built from and the "
                                      "leaderboard does not measure.")] = DEFAULT_TASK,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Requests decoded together (as lm_eval "
                                            "--batch_size).")] = 1,
    budget: Annotated[float, typer.Option("--budget", help="Minutes for the successive halving (a round that "
                                          "would not fit is not started).")] = 15.0,
    drafts: DraftsOpt = None,
    first_prompts: Annotated[int, typer.Option(help="Prompts per contender in the first round (x batch size); "
                                               "twice as many each round after.")] = 4,
    evaluate: Annotated[int, typer.Option(help="Then measure every contender on the task's first N documents (the "
                                          "leaderboard's): the exhaustive check of the choice.")] = 0,
    plot: Annotated[Optional[Path], typer.Option(help="Bar chart of each contender's speedup.")] = Path("tune.png"),
    kernels: KernelsOpt = "onednn",
    device: DeviceOpt = None, dtype: DtypeOpt = "auto", use_kernels: UseKernelsOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Measure the drafts that load for a target here (every kind's, the shipped ones, --drafts, composites) on a
    task's tuning documents by successive halving, and store the winners in this machine's results, where
    draft=auto reads them first."""
    from zoo.measure.tune import tune as run_tune

    with progress("tuning" + (", then evaluating every contender" if evaluate else "")) as tick:
        result = run_tune(target, task, load_settings(device, dtype, use_kernels, kernels), batch_size, budget,
                          drafts, first_prompts, evaluate, plot, tick)
    if as_json:
        return emit(result.to_json(), True)
    typer.echo(f"target {target} on {result.hardware}, {task}, batch {batch_size}: {result.seconds / 60:.1f} min"
               + (f" (evaluation on the first {evaluate} documents: {result.evaluation_seconds / 60:.1f} min)"
                  if evaluate else ""))
    here = f"{Path.cwd()}/"  # drafts under the working directory as relative paths: the table stays narrow
    emit([{"draft": r.draft.replace(here, ""), "γ from": r.num_draft_tokens, "rounds": r.rounds,
           "prompts": r.prompts, "TAR": r.tar,
           "speedup": r.speedup, **({"eval speedup": r.evaluated_speedup} if evaluate else {}),
           "chosen": "*" if r.chosen else ""} for r in result.rows], False, floatfmt=".2f")
    chosen = result.chosen
    typer.echo(f"chosen: draft={chosen.draft} with dynamic γ ({chosen.speedup or 0:.2f}x on the tuning prompts); "
               f"stored for draft=auto: {len(result.stored)} file(s) under {Path(result.stored[0]).parent}"
               + (f"; plot {result.plot}" if result.plot else ""))
    for line in result.skipped:
        typer.echo(f"not tried: {line}", err=True)


@app.command()
@cli_errors
def results(
    target: Annotated[Optional[str], typer.Option("--target", "-t", help="Only this target's results.")] = None,
    prune: Annotated[bool, typer.Option("--prune", help="Remove the matching results (with --target, --draft, "
                                        "--stale or --all).")] = False,
    draft: Annotated[Optional[str], typer.Option(help="With --prune: this draft's results.")] = None,
    stale: Annotated[bool, typer.Option("--stale", help="Results today's code no longer uses (older schema or "
                                        "specdraft-eval, runtime unknown, a draft kind's implementation replaced); "
                                        "with --prune: remove them.")] = False,
    everything: Annotated[bool, typer.Option("--all", help="With --prune: every result.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """List this machine's results store (what draft=auto reads first), or prune it."""
    from specdraft_eval.drafts.spec import replaced
    from specdraft_eval.results import store

    def kinds_replaced(record) -> list[str]:
        return replaced(record.draft, record.kind_versions)

    if prune:
        removed = store.prune(target, draft, stale, everything, kinds_replaced)
        return emit({"removed": [str(p) for p in removed], "store": str(store.store_dir())}, as_json)
    if draft or everything:
        raise SpecdecError("--draft and --all choose what --prune removes: add --prune")
    rows = [{"written": s.written[:19], "origin": s.origin, "target": s.record.target, "draft": s.record.draft,
             "γ": s.record.num_draft_tokens, "dynamic": s.record.dynamic_gamma, "batch": s.record.batch_size,
             "speedup": s.record.total.speedup, "TAR": s.record.total.tar, "code": s.record.code_version,
             "stale": ", ".join(kinds_replaced(s.record)) or ("yes" if store.is_stale(s.record) else ""),
             "file": s.path.name} for s in store.entries(target)
            if not stale or store.is_stale(s.record, kinds_replaced)]
    if as_json:
        return emit({"store": str(store.store_dir()), "results": rows}, True)
    rows = [{k: v for k, v in row.items() if k != "file"} for row in rows]  # the text table within 120 columns
    if not rows:
        return typer.echo(f"no results stored under {store.store_dir()}: lm_eval --model specdec ... baseline=true "
                          "and zoo tune add them")
    typer.echo(f"results store {store.store_dir()}:")
    emit(rows, False, floatfmt=".2f")


@app.command()
@cli_errors
def samples(
    paths: Annotated[list[Path], typer.Argument(help="samples_*.jsonl files or folders lm_eval --log_samples wrote.")],
    by: Annotated[str, typer.Option("--by", help="task, correct (the task's metric > 0) or a document "
                                    "field.")] = "task",
    as_json: JsonOpt = False,
) -> None:
    """Acceptance and speedup per group of requests, from each request's own figures in a specdec run's samples."""
    from specdraft_eval.results.report import positions
    from zoo.report.samples import group_samples

    groups = group_samples(paths, by)
    if as_json:
        return emit([g.to_json() for g in groups], True)
    emit([{"group": g.group, "requests": g.requests, "tokens": g.generated_tokens, "overshoot": g.overshoot_tokens,
           "TAR": g.tar, "mean accept len": g.mean_acceptance_length,
           "accept by position": positions(g.acceptance_rate_per_position, 5), "speedup": g.speedup} for g in groups],
         False)


@app.command()
@cli_errors
def leaderboard(
    results: Annotated[list[Path], typer.Argument(help="Results folders (lm_eval --output_path) or files.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder for README.md, leaderboard.csv, index.html, PNGs.")],
    as_json: JsonOpt = False,
) -> None:
    """Build the leaderboard (markdown, CSV, sortable HTML, plots) from specdec results files (and latency
    sweeps, sweep*.json, found beside them)."""
    from zoo.report import leaderboard as board

    rows, files = board.build(list(results), out)
    emit({"rows": len(rows), "files": [str(p) for p in files]}, as_json)

