"""The ``zoo`` commands that build drafts (pull, prune, ngram, regenerate, train-head, export); :mod:`zoo.cli`
registers them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from zoo.cli.support import (  # isort: skip (one wrapped list, not a line per name)
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
    from zoo.build.pull import pull as do_pull

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
    from zoo.build.prune import Pruning, make_draft

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
    from zoo.build.ngram import make_draft

    settings = load_settings(device, dtype, use_kernels)
    with progress("continuing prompts") as tick:
        emit(make_draft(model, out, prompts, new_tokens, max_prompts, settings, tick).to_json(), as_json)


@cli_errors
def regenerate(
    model: Annotated[str, typer.Argument(help="The target whose own answers to collect.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Directory of the answers (a run there continues).")],
    prompts: Annotated[str, typer.Option(help="Prompt sources, comma-separated, taken in turn: default (both tasks' "
                                              "held-in documents), specdec_humaneval, specdec_mmlu_cot, python (the "
                                              "standard library's functions) or a text file of prompts separated by "
                                              "blank lines.")] = "default",
    max_prompts: Annotated[Optional[int], typer.Option(help="Answer at most this many prompts.")] = None,
    new_tokens: Annotated[int, typer.Option(help="Tokens per answer at most.")] = 256,
    temperature: Annotated[float, typer.Option(help="Sampling temperature (0: greedy).")] = 0.0,
    samples: Annotated[int, typer.Option(help="Answers per prompt (with a temperature).")] = 1,
    draft: Annotated[str, typer.Option(help="Draft that speeds the answers up, losslessly ('none': plain "
                                            "decoding).")] = "suffix",
    num_draft_tokens: Annotated[int, typer.Option(help="The draft's γ.")] = 6,
    batch_size: Annotated[int, typer.Option(help="Rows decoded together.")] = 16,
    chunk_prompts: Annotated[int, typer.Option(help="Prompts per chunk (each chunk written atomically).")] = 64,
    seed: Annotated[int, typer.Option(help="Sampling seed.")] = 0,
    minutes: Annotated[Optional[float], typer.Option(help="Start no chunk that would end later than this; rerun "
                                                          "to go on.")] = None,
    device: DeviceOpt = None, dtype: DtypeOpt = "auto", as_json: JsonOpt = False,
) -> None:
    """Collect the target's own answers to held-in prompts (never the evaluations' documents) for `zoo train-head
    --data`: batched, speculative, in resumable chunks, with their provenance."""
    from zoo.build.regenerate import Regeneration
    from zoo.build.regenerate import regenerate as run

    settings = Regeneration(prompts, max_prompts, new_tokens, temperature, samples, draft, num_draft_tokens,
                            batch_size, chunk_prompts=chunk_prompts, seed=seed, minutes=minutes)
    with progress("answering prompts") as tick:
        result = run(model, out, settings, load_settings(device, dtype, False), tick)
    emit(result.to_json(), as_json, headers=None if as_json else
         ["path", "prompts", "chunks", "rows", "answer_tokens", "new_chunks", "seconds", "tokens_per_second", "tar"])
    for note in result.notes:
        typer.echo(f"note: {note}", err=True)


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
    data: Annotated[Optional[str], typer.Option(help="Learn from `zoo regenerate` directories (comma-separated) "
                                                    "instead of continuing prompts.")] = None,
    output_layer: Annotated[str, typer.Option(help="--kind eagle3: 'trained' (its own, started from the target's "
                                                   "rows) or 'target' (the target's rows, frozen, as EAGLE-1 "
                                                   "reads them).")] = "trained",
    device: DeviceOpt = None, dtype: DtypeOpt = "auto", as_json: JsonOpt = False,
) -> None:
    """Train an EAGLE-style head (`draft=eagle:DIR`: EAGLE-1 or EAGLE-3) or Medusa heads (`draft=medusa:DIR`) on the
    target's own text and hidden states; rerun to resume."""
    from zoo.build.train_head import HeadTraining
    from zoo.build.train_head import train_head as run

    settings = HeadTraining(prompts, max_prompts, new_tokens, vocab_top=vocab_top, steps=steps, kind=kind,
                            medusa_heads=medusa_heads, unroll=unroll, text=text,
                            text_tokens=text_tokens, data=data, output_layer=output_layer)
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
    from zoo.build.export import export_head

    result = export_head(head, to, out)
    if as_json:
        return emit(result.to_json(), True)
    serve = (f"speculative_config={json.dumps(result.serve)}" if to == "vllm"
             else " ".join(f"--{k} {v}" for k, v in result.serve.items()))
    typer.echo(f"{result.method} head for {to} written to {result.path}; serve it with {serve}")
    for note in result.notes:
        typer.echo(f"note: {note}")


COMMANDS = {"pull": pull, "prune": prune, "ngram": ngram, "regenerate": regenerate, "train-head": train_head,
            "export": export}
"""Command name -> function, in the order ``zoo --help`` lists them."""
