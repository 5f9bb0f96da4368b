"""``zoo prune``: depth-pruned drafts (the founding paper's design space), optionally distilled.

Layer choice: ``first`` N layers, ``uniform`` spacing, or ``block-influence`` (ShortGPT: keep the layers
whose removal would change hidden states most, BI = 1 - cos(h_in, h_out) on calibration text).
Distillation minimises KL(target || draft) on the logits, on calibration text or on text the target
generated itself (``on_policy``).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch

from specdraft_eval.drafts.layers import layer_view, parse_layers
from specdraft_eval.drafts.model import DRAFT_VOCAB_FILE
from specdraft_eval.errors import SpecdecError
from specdraft_eval.files import atomic_output
from specdraft_eval.integration.offline_data import (
    humaneval_problems,
    mmlu_cot_docs,
    task_prompts,
)
from specdraft_eval.models.targets import LoadSettings
from zoo.build.built import Built
from zoo.build.held_in import HELD_OUT, check_held_in, check_out
from zoo.progress import Tick, no_progress

SELECTIONS = ("first", "uniform", "block-influence")
DEFAULT_CALIBRATION = "default"


def calibration_texts(spec: str | None) -> list[str]:
    """Calibration text: a file, a bundled task's held-in prompts, literal text, or the default held-in split (a file
    or text holding part of a document the evaluations use is refused: :func:`~zoo.build.held_in.check_held_in`).

    The default (humaneval[40:] solutions + mmlu_cot[80:] worked answers) holds out the first 40 and 80
    documents: what ``lm_eval --limit`` and ``zoo rank --measure`` evaluate on.
    """
    if spec in (None, DEFAULT_CALIBRATION):
        return [p["prompt"] + p["canonical_solution"] for p in humaneval_problems()[HELD_OUT["specdec_humaneval"]:]] + [
            f"Q: {d['question']}\n{d['worked_answer']}" for d in mmlu_cot_docs()[HELD_OUT["specdec_mmlu_cot"]:]
        ]
    if spec.startswith("specdec_"):
        if spec not in HELD_OUT:
            raise SpecdecError(f"unknown calibration task {spec!r}: give {', '.join(HELD_OUT)}, a text file or text")
        return task_prompts(spec)[HELD_OUT[spec]:]  # its held-in documents: never those the evaluations use
    if os.path.sep in spec or spec.endswith((".txt", ".md", ".jsonl")):
        try:
            text = Path(spec).read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            raise SpecdecError(f"cannot read calibration file {spec}: {exc.strerror or exc}; give a readable text "
                               "file") from None
        if not text.strip():
            raise SpecdecError(f"calibration file {spec} is empty: give text to calibrate on")
        check_held_in(text, spec, "calibration file")
        return [text]
    check_held_in(spec, repr(spec[:40]), "calibration text")
    return [spec]


def _windows(tokenizer, texts: list[str], length: int, budget: int) -> list[list[int]]:
    """Token windows of ``length`` from ``texts`` until ``budget`` tokens."""
    ids = [t for text in texts for t in tokenizer(text + "\n\n").input_ids]
    windows = [ids[i : i + length] for i in range(0, max(len(ids) - length + 1, 1), length)]
    count = max(1, -(-budget // length))
    while len(windows) < count and windows:  # recycle text when the budget exceeds it
        windows += windows[: count - len(windows)]
    return windows[:count]


@torch.inference_mode()
def block_influence(model, tokenizer, texts: list[str], max_tokens: int = 2048) -> list[float]:
    """ShortGPT block influence of each decoder layer on calibration text."""
    scores = torch.zeros(model.config.num_hidden_layers)
    windows = _windows(tokenizer, texts, 256, max_tokens)
    for window in windows:
        hidden = model(torch.tensor([window]), output_hidden_states=True).hidden_states
        for i in range(len(scores)):
            cos = torch.nn.functional.cosine_similarity(hidden[i][0], hidden[i + 1][0], dim=-1)
            scores[i] += float((1 - cos).mean())
    return (scores / len(windows)).tolist()


def select_layers(model, tokenizer, layers: int, select: str, texts: list[str]) -> list[int]:
    depth = model.config.num_hidden_layers
    if not 1 <= layers <= depth:
        raise SpecdecError(f"--layers {layers} is outside 1..{depth}, the model's depth")
    if select == "first":
        return list(range(layers))
    if select == "uniform":
        return sorted({round(i * (depth - 1) / max(layers - 1, 1)) for i in range(layers)})
    if select == "block-influence":
        scores = block_influence(model, tokenizer, texts)
        return sorted(sorted(range(depth), key=lambda i: -scores[i])[:layers])
    raise SpecdecError(f"unknown --select {select!r}: use one of {', '.join(SELECTIONS)}")


def build_pruned(model, keep: list[int]):
    """An independent model holding copies of the kept layers (and embeddings, norm and head)."""
    from transformers import AutoModelForCausalLM

    view = layer_view(model, keep)
    config = view.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    pruned = AutoModelForCausalLM.from_config(config)
    pruned.load_state_dict({k: v.clone() for k, v in view.state_dict().items()})
    pruned.generation_config = model.generation_config
    return pruned.eval()


def on_policy_texts(target, tokenizer, prompts: list[str], budget: int, new_tokens: int = 96) -> list[str]:
    """Prompts followed by the target's own greedy continuations, until ``budget`` tokens."""
    texts, used = [], 0
    for prompt in prompts:
        ids = tokenizer(prompt, return_tensors="pt").input_ids[:, -384:]
        out = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, do_sample=False)
        texts.append(tokenizer.decode(out[0], skip_special_tokens=True))
        used += out.shape[1]
        if used >= budget:
            break
    return texts


def distill(draft, target, tokenizer, texts: list[str], tokens: int, on_step=None, seq_len: int = 256,
            batch: int = 4, lr: float = 3e-4) -> dict:
    """Train the draft's decoder layers and final norm to match the target's next-token distributions."""
    trainable = [p for n, p in draft.named_parameters() if ".layers." in n or n.endswith("norm.weight")]
    for p in draft.parameters():
        p.requires_grad_(False)
    for p in trainable:
        p.requires_grad_(True)
    optimizer = torch.optim.AdamW(trainable, lr=lr, weight_decay=0.0)
    windows = _windows(tokenizer, texts, seq_len, tokens)
    losses = []
    draft.train()
    for start in range(0, len(windows), batch):
        chunk = windows[start : start + batch]
        width = min(len(w) for w in chunk)
        ids = torch.tensor([w[:width] for w in chunk])
        with torch.inference_mode():
            teacher = torch.log_softmax(target(ids).logits.float(), -1)
        student = torch.log_softmax(draft(ids).logits.float(), -1)
        loss = torch.nn.functional.kl_div(student, teacher.clone(), log_target=True, reduction="batchmean") / width
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
        if on_step:
            on_step(ids.numel())
    draft.eval()
    for p in draft.parameters():
        p.requires_grad_(False)
    return {"kl_first": losses[0], "kl_last": losses[-1], "steps": len(losses), "tokens": sum(len(w) for w in windows)}


def frequent_tokens(tokenizer, texts: list[str], k: int) -> list[int]:
    """The ``k`` most frequent token ids in ``texts`` (plus the special tokens), for a reduced draft head."""
    if k < 1:
        raise SpecdecError(f"--vocab-top {k} must be >= 1")
    counts = Counter(t for text in texts for t in tokenizer(text).input_ids)
    top = [t for t, _ in sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:k]]
    return sorted(set(top) | set(tokenizer.all_special_ids))


def save_atomically(model, tokenizer, out: Path, meta: dict, draft_vocab: list[int] | None = None) -> None:
    """Write a normal HF model directory plus ``zoo.json``; nothing appears at ``out`` until complete."""
    with atomic_output(out, directory=True) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "zoo.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
        if draft_vocab is not None:
            (tmp / DRAFT_VOCAB_FILE).write_text(json.dumps(draft_vocab) + "\n")


def resolve_keep(model, tokenizer, layers: int | None, keep: str | None, select: str, texts: list[str]) -> list[int]:
    if (layers is None) == (keep is None):
        raise SpecdecError("give exactly one of --layers N or --keep 0,1,2,3,29")
    if keep is not None:
        return parse_layers(keep, model.config.num_hidden_layers)
    return select_layers(model, tokenizer, layers, select, texts)


@dataclass(frozen=True)
class Pruning:
    """Which layers a pruned draft keeps (``layers`` chosen by ``select``, or exactly ``keep``), the text it is
    calibrated and distilled on, how many tokens of distillation (0: none; ``on_policy``: on the source's own
    text) and its reduced output head (``vocab_top`` most frequent tokens; None: the whole vocabulary)."""

    layers: int | None = None
    keep: str | None = None
    select: str = "first"
    calibration: str | None = None
    distill_tokens: int = 0
    on_policy: bool = False
    vocab_top: int | None = None


def make_draft(model: str, out: Path, pruning: Pruning, settings: LoadSettings = LoadSettings(),
               tick: Tick = no_progress) -> Built:
    """``zoo prune``: load ``model`` (with ``settings``: distillation runs on its device), keep its chosen layers,
    optionally distil and give a reduced head, save the draft at ``out`` atomically; return what was built."""
    layers, keep, select, calibration = pruning.layers, pruning.keep, pruning.select, pruning.calibration
    distill_tokens, on_policy, vocab_top = pruning.distill_tokens, pruning.on_policy, pruning.vocab_top
    check_out(out)
    if distill_tokens < 0:
        raise SpecdecError(f"--distill-tokens {distill_tokens} must be >= 0")
    loaded = settings.load(model)
    source, tokenizer = loaded.model, loaded.tokenizer
    needs_text = bool(distill_tokens) or vocab_top is not None or (select == "block-influence" and keep is None)
    texts = calibration_texts(calibration) if calibration or needs_text else []
    kept = resolve_keep(source, tokenizer, layers, keep, select, texts)
    draft = build_pruned(source, kept)
    meta = {"source": model, "kept_layers": kept, "select": select if keep is None else "explicit",
            "calibration": calibration or DEFAULT_CALIBRATION, "distill_tokens": distill_tokens,
            "on_policy": on_policy, "source_layers": source.config.num_hidden_layers, "vocab_top": vocab_top}
    draft_vocab = frequent_tokens(tokenizer, texts, vocab_top) if vocab_top is not None else None
    if distill_tokens:
        if on_policy:
            texts = on_policy_texts(source, tokenizer, texts, distill_tokens)
        tick(0, total=distill_tokens)
        meta["distillation"] = distill(draft, source, tokenizer, texts, distill_tokens, on_step=tick)
    save_atomically(draft, tokenizer, out, meta, draft_vocab)
    return Built(str(out), str(out), {**{k: meta[k] for k in ("kept_layers", "select", "distill_tokens", "vocab_top")},
                                      **({"kl_first": meta["distillation"]["kl_first"],
                                          "kl_last": meta["distillation"]["kl_last"]} if distill_tokens else {})})
