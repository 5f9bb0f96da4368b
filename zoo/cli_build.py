"""The ``zoo`` commands that build drafts (pull, prune, ngram, train-head, export); :mod:`zoo.cli` registers them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from zoo.cli_support import (  # isort: skip (one wrapped list, not a line per name)
    CalibrationOpt, DeviceOpt, DistillOpt, DtypeOpt, JsonOpt, KeepOpt, LayersOpt, NewTokensOpt, NgramPromptsOpt,
    OnPolicyOpt, OutOpt, PromptsOpt, SelectOpt, UseKernelsOpt, VocabTopOpt, cli_errors, emit, load_settings, progress
)

TaskText = "Bundled task whose prompts to use (specdec_humaneval, specdec_mmlu_cot)."


@cli_errors
def pull(
    name: Annotated[str, typer.Argument(help="Catalog name or hub id (org/name).")],
    revision: Annotated[Optional[str], typer.Option(help="Branch, tag or commit.")] = None,
    target: Annotated[Optional[str], typer.Option("--target", "-t", help="Check the draft's tokenizer against this "
                                                                         "target.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Download a draft into the Hugging Face cache (interrupted: keeps whole files only; offline: answer from the
    cache)."""
    from zoo.pull import pull as do_pull

    emit(do_pull(name, revision, target).to_json(), as_json)


@cli_errors
def prune(
    model: Annotated[str, typer.Argument(help="Model to prune: the target itself or a larger draft.")],
    out: OutOpt,
layers: LayersOpt = None,
keep: KeepOpt = None,
select: SelectOpt = "first",
calibration: CalibrationOpt = None,
distill_tokens: DistillOpt = 0,
on_policy: OnPolicyOpt = False,
vocab_top: VocabTopOpt = None,
    device: DeviceOpt = None, dtype: DtypeOpt = "float32", use_kernels: UseKernelsOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Build a depth-pruned draft (optionally distilled) as a normal HF model directory."""
    from zoo.prune import Pruning, make_draft

    pruning = Pruning(layers, keep, select, calibration, distill_tokens, on_policy, vocab_top)
    with progress("distilling") as tick:
        emit(make_draft(model, out, pruning, load_settings(device, dtype, use_kernels, "plain"), tick).to_json(),
             as_json)


@cli_errors
def ngram(
    model: Annotated[str, typer.Argument(help="The target whose own continuations the draft learns.")],
    out: OutOpt,
    prompts: PromptsOpt = None,
    new_tokens: NewTokensOpt = 128, max_prompts: NgramPromptsOpt = 160,
    device: DeviceOpt = None, dtype: DtypeOpt = "auto", use_kernels: UseKernelsOpt = False, as_json: JsonOpt = False,
) -> None:
    """Build an n-gram draft (`draft=ngram:DIR`) from the target's own greedy continuations of held-in prompts."""
    from zoo.ngram import make_draft

    settings = load_settings(device, dtype, use_kernels)
    with progress("continuing prompts") as tick:
        emit(make_draft(model, out, prompts, new_tokens, max_prompts, settings, tick).to_json(), as_json)


@cli_errors
def train_head(
    model: Annotated[str, typer.Argument(help="The target whose hidden states the head learns to predict.")],
    out: OutOpt,
    prompts: PromptsOpt = None,
    steps: Annotated[int, typer.Option(help="Training steps (8 windows of 192 tokens each).")] = 700,
    vocab_top: Annotated[int, typer.Option(help="Output vocabulary: the target's commonest tokens (0: all).")] = 8192,
    new_tokens: NewTokensOpt = 160,
    max_prompts: Annotated[Optional[int], typer.Option(help="Continue at most this many prompts.")] = None,
    kind: Annotated[str, typer.Option(help="eagle (one layer over the last hidden state), eagle3 (over three "
                                           "layers' states, 3 unrolled steps, speculators' layout) or medusa (heads "
                                           "predicting t+2.., FasterDecoding/Medusa's layout).")] = "eagle",
    medusa_heads: Annotated[int, typer.Option(help="--kind medusa: how many heads (draft depth).")] = 4,
    unroll: Annotated[int, typer.Option(help="Steps trained in a row on the head's own features (eagle3: at "
                                              "least 3).")] = 2,
    text: Annotated[Optional[str], typer.Option(help="Also read this text teacher-forced: 'python' (its standard "
                                                    "library's sources), a text file or a folder of them.")] = None,
    text_tokens: Annotated[int, typer.Option(help="--text: how many of its tokens.")] = 0,
    device: DeviceOpt = None, dtype: DtypeOpt = "auto", as_json: JsonOpt = False,
) -> None:
    """Train an EAGLE-style head (`draft=eagle:DIR`: EAGLE-1 or EAGLE-3) or Medusa heads (`draft=medusa:DIR`) on the
    target's own text and hidden states; rerun to resume."""
    from zoo.train_head import HeadTraining
    from zoo.train_head import train_head as run

    settings = HeadTraining(prompts, max_prompts, new_tokens, vocab_top=vocab_top, steps=steps, kind=kind,
                            medusa_heads=medusa_heads, unroll=unroll, text=text,
                            text_tokens=text_tokens)
    with progress("continuing prompts, then training") as tick:
        emit(run(model, out, settings, load_settings(device, dtype, False, kernels="plain"), tick).to_json(), as_json)


@cli_errors
def export(
    head: Annotated[Path, typer.Argument(help="An EAGLE head directory (zoo train-head's, the EAGLE repository's or "
                                              "speculators').")],
    to: Annotated[str, typer.Option("--to", help="The server that loads it: vllm or sglang.")],
    out: OutOpt,
    as_json: JsonOpt = False,
) -> None:
    """Write an EAGLE head as a server loads it, as it is (and what serves it there)."""
    from zoo.export import export_head

    result = export_head(head, to, out)
    if as_json:
        return emit(result.to_json(), True)
    serve = (f"speculative_config={json.dumps(result.serve)}" if to == "vllm"
             else " ".join(f"--{k} {v}" for k, v in result.serve.items()))
    typer.echo(f"{result.method} head for {to} written to {result.path}; serve it with {serve}")
    for note in result.notes:
        typer.echo(f"note: {note}")


COMMANDS = {"pull": pull, "prune": prune, "ngram": ngram, "train-head": train_head, "export": export}
"""Command name -> function, in the order ``zoo --help`` lists them."""
