"""What every ``zoo`` command shares: one-line errors and exit codes, option parsing, tables, progress bars."""

from __future__ import annotations

import functools
import json
import os
import sys
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
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
from specdraft_eval.models.targets import LoadSettings
from zoo.progress import Tick

JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON instead of a table.")]
TargetOpt = Annotated[str, typer.Option("--target", "-t", help="Target model: alias, directory, .gguf or hub id.")]
DraftsOpt = Annotated[Optional[list[str]], typer.Option("--drafts", "-d", help="Drafts (repeat the option).")]
GammaOpt = Annotated[str, typer.Option("--gamma", help="Comma-separated γ values (draft tokens per step).")]
PromptsOpt = Annotated[Optional[str], typer.Option(
    help="Prompts to continue: a bundled task's held-in documents (specdec_humaneval, specdec_mmlu_cot) or a text "
         "file of prompts separated by blank lines (default: both tasks' held-in documents).")]
OutOpt = Annotated[Path, typer.Option("--out", "-o", help="New directory for the draft (must not exist).")]
MaxNewOpt = Annotated[int, typer.Option(help="Tokens per generation.")]
ResultsOpt = Annotated[Optional[list[Path]], typer.Option(help="Results folders or files written by lm_eval "
                                                     "--output_path (repeat); default: the published results.")]
RepeatsOpt = Annotated[int, typer.Option(help="Timed repeats; medians, min and max are over these.")]
DeviceOpt = Annotated[Optional[str], typer.Option(help="Device to load models on: cpu, cuda, cuda:N "
                                                  "(default: cuda where a GPU is visible, else cpu).")]
DtypeOpt = Annotated[str, typer.Option(help="Weights' dtype: auto (bfloat16 on a GPU, float32 on the CPU), float32, "
                                       "bfloat16 or float16.")]
UseKernelsOpt = Annotated[bool, typer.Option("--use-kernels", help="Let transformers fetch its hub kernels (needs "
                                             "the network; off by default).")]
ContextOpt = Annotated[int, typer.Option(help="With a named GPU: the context (tokens in the KV cache) each step "
                                              "reads.")]
GridOpt = Annotated[bool, typer.Option("--grid", help="Every draft (default: prompt-lookup, layers:0-4 and their "
                                      "composite) at γ 1-4, fixed and dynamic, on both bundled tasks.")]
DynamicOpt = Annotated[bool, typer.Option("--dynamic", help="Also run every draft and γ with dynamic γ.")]
CompileOpt = Annotated[bool, typer.Option("--compile", help="Also run every configuration compiled, beside the eager "
                                          "ones: ours with compile=true, transformers' generate with its static "
                                          "cache and "
                                          "compile (plain kernels; CUDA graphs on a GPU); warm-up seconds and graphs "
                                          "compiled in timed runs apart.")]
KernelsOpt = Annotated[str, typer.Option(help="Linear-layer kernels: onednn (weights pre-packed once, CPU "
                                              "float32/bfloat16; "
                                          "what lm_eval --model specdec uses by default) or plain (PyTorch's own).")]
LayersOpt = Annotated[Optional[int], typer.Option("--layers", "-n", help="Number of decoder layers to keep.")]
KeepOpt = Annotated[Optional[str], typer.Option("--keep", help="Exact layers to keep, e.g. 0,1,2,3,29 or 0-3,29.")]
SelectOpt = Annotated[str, typer.Option(help="With --layers: first, uniform or block-influence (ShortGPT).")]
CalibrationOpt = Annotated[Optional[str], typer.Option(help="Calibration/distillation text: a file, a bundled task "
                                                       "(specdec_humaneval, specdec_mmlu_cot) or literal text.")]
DistillOpt = Annotated[int, typer.Option(help="Distil from the source model on this many tokens (0: no).")]
OnPolicyOpt = Annotated[bool, typer.Option(help="Distil on text the source model generates itself (slower).")]
VocabTopOpt = Annotated[Optional[int], typer.Option(help="Give the draft a reduced output head over the K most "
                                                     "frequent calibration tokens (draft-side only).")]
ProfileOutOpt = Annotated[Optional[Path], typer.Option(help="Profile file (default: in the cache, reused by rank); "
                                                            "with "
                                                "--sweep: a file for the sweep and its fit (zoo leaderboard reads "
                                                "sweep*.json files beside results).")]
SweepOpt = Annotated[bool, typer.Option(help="Instead: latency vs depth and width of random-weight models, and a "
                                        "fit of the latency model's per-layer cost and bandwidth to it.")]
CalibrateOpt = Annotated[Optional[str], typer.Option(help="With --sweep: store the fit as a calibration under this "
                                                     "GPU name, which `zoo rank --gpu NAME` then uses.")]
GpuOpt = Annotated[str, typer.Option(help="'this' (measure this machine) or a GPU name: a100-40gb, a100-80gb (or "
                                     "a100), h100, h200, l4, a10g, rtx-4090, cpu, or one you calibrated.")]
RankGammaOpt = Annotated[Optional[str], typer.Option(help="Comma-separated γ values to rank; default: every γ up to "
                                                          "the "
                                                 "largest in the results (smaller ones estimated), or 1,2,4,8.")]
RuntimeOpt = Annotated[str, typer.Option(help="With a named GPU: eager (PyTorch eager, as this engine) or "
                                         "cuda-graphs (torch.compile / graph replay).")]
PlotOpt = Annotated[Path, typer.Option(help="Where to write the predicted-vs-measured plot (and beside it, "
                                       "the figures as .json); default: the working directory.")]
PromptsFileOpt = Annotated[Optional[Path], typer.Option(help="Prompts file instead: a JSON list of strings or JSON "
                                                    'lines of strings or {"prompt": ...}.')]
BenchGammaOpt = Annotated[str, typer.Option(help="γ (draft tokens per step) for the constant-γ runs; dynamic γ "
                                       "starts there. With --batch-size: γs and/or dynamic, e.g. 2,4,dynamic.")]
BatchSizeOpt = Annotated[Optional[str], typer.Option(
    "--batch-size", help="Batch study instead: comma-separated batch sizes (e.g. 1,2,4,8); tokens/s of our "
    "batched engine, speculative and plain, per batch size (--limit is raised to the largest).")]
NewTokensOpt = Annotated[int, typer.Option(help="Tokens the target generates per prompt.")]
NgramPromptsOpt = Annotated[int, typer.Option(help="Continue at most this many prompts (the default keeps the build "
                                              "under 10 minutes on 2 CPU cores).")]
ScoreTaskOpt = Annotated[Optional[str], typer.Option(help="Score by this task's speedup (default: geometric mean over "
                                                     "the tasks measured).")]


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


def existing(results: list[Path] | None) -> list[Path] | None:
    """``--results`` paths, each of which must exist (None: the published results)."""
    for path in results or []:
        if not path.exists():
            raise SpecdecError(f"--results {path} does not exist: give folders written by lm_eval --output_path")
    return list(results) if results else None


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


@contextmanager
def progress(description: str) -> Iterator[Tick]:
    """A progress bar, as the :class:`~zoo.progress.Tick` a library function reports to."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                  transient=True, console=None) as bar:
        task = bar.add_task(description, total=None)

        def tick(advance: int = 1, total: int | None = None) -> None:
            if total is not None:
                bar.update(task, total=total)
            bar.advance(task, advance)

        yield tick


def load_settings(device: str | None, dtype: str, use_kernels: bool, kernels: str = "onednn") -> LoadSettings:
    """The checked :class:`~specdraft_eval.models.targets.LoadSettings` of a command's options."""
    from specdraft_eval.models import kernels as kernel_paths

    kernel_paths.check(kernels)
    return LoadSettings.of(device, dtype, kernels, use_kernels)


def gamma_policies(text: str) -> list:
    """``--gamma`` for the batch study: fixed γs and ``dynamic`` (starting at the first fixed γ, or 4), as
    :class:`~specdraft_eval.engine.params.GammaPolicy` values."""
    from specdraft_eval.engine.params import GammaPolicy

    items = [item.strip() for item in text.split(",") if item.strip()]
    numbers = [item for item in items if item != "dynamic"]
    fixed = parse_positive_ints(",".join(numbers), "--gamma") if numbers else []
    if not items:
        raise SpecdecError(f"bad --gamma {text!r}: give γs and/or dynamic, e.g. --gamma 2,4,dynamic")
    dynamic = [GammaPolicy(fixed[0] if fixed else 4, True)] if "dynamic" in items else []
    return [GammaPolicy(g) for g in fixed] + dynamic


def one_gamma(text: str) -> int:
    """``--gamma`` where a command runs one γ."""
    values = parse_positive_ints(text)
    if len(values) != 1:
        raise SpecdecError(f"bad --gamma {text!r}: this command runs one γ, e.g. --gamma 4")
    return values[0]
