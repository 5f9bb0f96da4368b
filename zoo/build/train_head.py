"""``zoo train-head``: an EAGLE-style head (``--kind eagle``) or Medusa heads (``--kind medusa``) for a target, trained
on the target's own text and hidden states.

1. Data: the target continues held-in prompts greedily (``zoo ngram``'s prompts and generation: never the
   documents the leaderboard measures); its last hidden state (after its final norm) at every position of each
   prompt's tail and continuation is recorded during that generation (equal to a teacher-forced pass's, without
   a second pass), and its next-token distribution follows from them through its own output head. With ``--text``
   (``python``: the standard library's sources, or files of one's own; never the documents the leaderboard
   measures) ``--text-tokens`` more tokens are read teacher-forced: one target pass per sequence, its features and
   distribution at every position of text it did not write.
2. Vocabulary: the ``vocab_top`` tokens the target emits most often in that text (a reduced output head, its
   rows shared with the target's head, keeps the draft's cost per token low).
3. Training, as EAGLE: the head maps (feature t, embedding of token t+1) to feature t+1; loss = smooth-L1 on
   the feature + ``cls_weight`` x cross-entropy against the target's distribution (over the head's vocabulary),
   with uniform noise on input features, and a second unrolled step on the head's own predicted features (what
   it drafts from after its first token). EAGLE-3 (``--kind eagle3``): cross-entropy only, and its training-time
   test: ``--unroll`` (>= 3) steps, each later one on the head's own outputs, attending exactly as the drafter's
   cache lets it when drafting (:func:`unrolled_mask`), step i weighted 0.8^(i-1) as upstream's.

Medusa (``--kind medusa``): K heads on the same features, head i a ResBlock (zero-initialised, as Medusa does) and
the target's own output head, trained with cross-entropy on the token at t + 2 + i of the target's continuation (its
own text: self-distillation); the output heads stay the target's (frozen), so a head costs one ResBlock and one
vocabulary projection. Saved with ``--vocab-top K`` (the default) as vLLM reduces a Medusa vocabulary (its layout,
the output rows of the K commonest tokens and their ``token_map``: vLLM's recipe, applied after training as the rows
are frozen); with ``--vocab-top 0`` in FasterDecoding/Medusa's layout, over the whole vocabulary.

State lives in a work folder beside ``out`` (``.OUT.train``: the data, checkpoints every few minutes); the same
command resumes from it; ``out`` is written atomically at the end and the work folder removed.
"""

from __future__ import annotations

import json
import math
import random
import shutil
import sysconfig
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from specdraft_eval.drafts.eagle.formats import save_eagle3, save_head
from specdraft_eval.drafts.eagle.module import EagleHead, default_taps, new_eagle3_head, new_head
from specdraft_eval.drafts.medusa import MedusaHeads, save_medusa
from specdraft_eval.drafts.ngram import vocab_fingerprint
from specdraft_eval.engine import kv_cache
from specdraft_eval.engine.drafter import FINAL
from specdraft_eval.engine.taps import FeatureTap
from specdraft_eval.errors import SpecdecError
from specdraft_eval.files import atomic_output, write_json
from specdraft_eval.models import kernels
from specdraft_eval.models.targets import LoadSettings
from zoo.build.built import Built
from zoo.build.held_in import (
    DEFAULT_PROMPTS,
    HELD_OUT,
    check_held_in,
    check_out,
    generate_batches,
    ngram_prompts,
    pad_id,
)
from zoo.build.regenerate import read_rows
from zoo.progress import Tick, no_progress

KINDS = ("eagle", "eagle3", "medusa")
OUTPUT_LAYERS = ("trained", "target")
EAGLE3_UNROLL = 3
"""EAGLE-3 trains at least this many unrolled steps on its own features (its training-time test)."""


@dataclass(frozen=True)
class HeadTraining:
    """``zoo train-head``'s settings (all recorded in the head's ``eagle.json``)."""

    prompts: str | None = None  # zoo ngram's: the default held-in split, a bundled task's, or a file
    max_prompts: int | None = None
    new_tokens: int = 160  # of greedy continuation per prompt
    context: int = 384  # prompt tokens kept before each continuation
    vocab_top: int = 8192  # the head's output vocabulary (0: the target's whole vocabulary)
    steps: int = 700
    batch_size: int = 8
    window: int = 192  # tokens per training sequence
    lr: float = 2e-3
    cls_weight: float = 0.5
    noise: float = 0.1  # uniform noise on input features, as EAGLE
    unroll: int = 2  # steps trained in a row, the later ones on the head's own features
    seed: int = 0
    kind: str = "eagle"  # or "medusa"
    medusa_heads: int = 4
    medusa_layers: int = 1
    # text read teacher-forced besides the generations: "python" (its standard library) or a path
    text: str | None = None
    text_tokens: int = 0  # how many tokens of it (0: none)
    data: str | None = None  # zoo regenerate's directories (comma-separated), read instead of continuing prompts
    output_layer: str = "trained"  # eagle3: its own output layer trained, or the target's rows frozen ("target")

    @property
    def medusa(self) -> bool:
        return self.kind == "medusa"

    def taps(self, depth: int) -> tuple[int, ...]:
        """The target's hidden states the data records: EAGLE-3's three layer inputs (upstream's default layers) and
        the final one (its distribution, the loss's target); else the final one."""
        return (*default_taps(depth), FINAL) if self.kind == "eagle3" else (FINAL,)

    @property
    def unrolled(self) -> int:
        return max(self.unroll, EAGLE3_UNROLL) if self.kind == "eagle3" else self.unroll

    def check(self) -> None:
        for name in ("new_tokens", "context", "steps", "batch_size", "window", "unroll"):
            if getattr(self, name) < 1:
                raise SpecdecError(f"--{name.replace('_', '-')} must be >= 1 (got {getattr(self, name)})")
        if self.vocab_top < 0:
            raise SpecdecError(f"--vocab-top must be >= 0 (got {self.vocab_top}); 0 keeps the whole vocabulary")
        if self.window <= self.unroll:
            raise SpecdecError(f"--window {self.window} must exceed --unroll {self.unroll}")
        if not 0 <= self.lr < 1:
            raise SpecdecError(f"--lr {self.lr} must lie in [0, 1)")
        if self.text_tokens < 0 or (self.text_tokens > 0) != (self.text is not None):
            raise SpecdecError("--text and --text-tokens go together: --text python (or a folder or file) "
                               "--text-tokens N")
        if self.kind not in KINDS:
            raise SpecdecError(f"--kind {self.kind!r}: use one of {', '.join(KINDS)}")
        if self.data is not None and (self.prompts is not None or self.max_prompts is not None):
            raise SpecdecError("--data replaces --prompts and --max-prompts (the answers are already there): give "
                               "one or the other")
        if self.output_layer not in OUTPUT_LAYERS or (self.output_layer != "trained" and self.kind != "eagle3"):
            raise SpecdecError(f"--output-layer {self.output_layer!r}: use trained or target, with --kind eagle3 "
                               "(eagle and medusa always read the target's)")
        if self.medusa and (self.medusa_heads < 1 or self.medusa_layers < 0 or self.window <= self.medusa_heads + 1):
            raise SpecdecError(f"--medusa-heads must be >= 1 and below --window - 1, --medusa-layers >= 0 (got "
                               f"{self.medusa_heads}, {self.medusa_layers})")


def generations(target, tokenizer, texts: list[str], settings: HeadTraining, tick: Tick,
                taps: tuple[int, ...] = (FINAL,)) -> tuple[list[list[int]], list[torch.Tensor], int]:
    """Each prompt's tail and the target's greedy continuation as one sequence, with the target's hidden states at
    ``taps`` (default: the final one) at each of its positions, recorded while generating (the prefill's and each
    decoding step's: no second pass). Returns the sequences, their features ([length, len(taps) * hidden] float16 on
    the CPU) and the tokens generated."""
    sequences, features, generated = [], [], 0
    tap = FeatureTap(target, taps, history=True)
    try:
        batches = generate_batches(target, tokenizer, texts, settings.new_tokens, context=settings.context)
        for rows, continued in batches:
            prefill, *steps = tap.passes()  # [B, width, H], then [B, 1, H] per decoding step
            width = prefill.shape[1]
            for i, (prompt, new) in enumerate(zip(rows, continued, strict=True)):
                seen = torch.cat([prefill[i, width - len(prompt):], *(step[i] for step in steps)])
                length = min(len(prompt) + len(new), len(seen))  # the last generated token was never fed
                sequences.append((prompt + new)[:length])
                features.append(seen[:length].to("cpu", torch.float16))
                generated += len(new)
            tick(len(rows))
    finally:
        tap.close()
    return sequences, features, generated


PYTHON_TEXT = "python"
TEXT_SUFFIXES = (".py", ".md", ".rst", ".txt")


def text_files(spec: str, seed: int) -> list[Path]:
    """The files ``--text`` names, in a seeded shuffled order: ``python`` is this Python's standard library (its
    ``.py`` sources); else a text file, or a folder's ``.py``/``.md``/``.rst``/``.txt`` files."""
    if spec == PYTHON_TEXT:
        root, suffixes = Path(sysconfig.get_paths()["stdlib"]), (".py",)
    else:
        root, suffixes = Path(spec), TEXT_SUFFIXES
    if root.is_file():
        return [root]
    files = sorted(f for f in root.rglob("*") if f.suffix in suffixes and f.is_file()
                   and "site-packages" not in f.parts) if root.is_dir() else []
    if not files:
        raise SpecdecError(f"--text {spec}: no {'/'.join(suffixes)} files there; give 'python', a text file or a "
                           "folder of them")
    random.Random(seed).shuffle(files)
    return files


def teacher_forced(target, tokenizer, settings: HeadTraining, tick: Tick,
                   taps: tuple[int, ...]) -> tuple[list[list[int]], list[torch.Tensor]]:
    """``settings.text_tokens`` tokens of ``--text`` (its files joined by EOS) in sequences of ``settings.context``
    tokens, each with the target's features at ``taps`` from one forward pass over it: its distribution at every
    position of text it did not write (teacher forcing), as EAGLE's training data is."""
    eos = tokenizer.eos_token_id
    stream: list[int] = []
    for path in text_files(settings.text, settings.seed):
        text = path.read_text(errors="ignore")
        if settings.text != PYTHON_TEXT:  # a user's text: never the evaluations' documents
            check_held_in(text, str(path), "--text file")
        stream += tokenizer(text).input_ids + [eos]
        if len(stream) >= settings.text_tokens:
            break
    width = settings.context
    sequences = [stream[i: i + width] for i in range(0, min(len(stream), settings.text_tokens) - width + 1, width)]
    return sequences, forced_features(target, sequences, taps, eos, tick)


def answers(settings: HeadTraining, tokenizer, name: str) -> tuple[list[list[int]], int, list[dict]]:
    """``--data``: each row of ``zoo regenerate``'s directories as one sequence (its prompt's last ``context``
    tokens, then the target's answer); the answer tokens, and each directory's provenance for the head's metadata."""
    sequences, answered, sources = [], 0, []
    for path in settings.data.split(","):
        rows, provenance = read_rows(Path(path), name, vocab_fingerprint(tokenizer))
        sequences += [row.prompt[-settings.context:] + row.answer for row in rows if row.answer]
        answered += sum(len(row.answer) for row in rows)
        sources.append({"data": path, "target": provenance["settings"]["target"], "prompts": provenance["prompts"],
                        "temperature": provenance["settings"]["temperature"], "rows": len(rows),
                        "answer_tokens": provenance["answer_tokens"], "held_out": provenance["held_out"]})
    if not sequences:
        raise SpecdecError(f"--data {settings.data}: no answers there; run zoo regenerate on it first")
    return sequences, answered, sources


def forced_features(target, sequences: list[list[int]], taps: tuple[int, ...], pad: int, tick: Tick
                    ) -> list[torch.Tensor]:
    """The target's features at ``taps`` at every position of each sequence ([length, F] float16 on the CPU), from
    teacher-forced passes of 8 sequences of similar length, right-padded (causal attention keeps every real
    position's features exact): equal to those recorded while the target wrote them."""
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
    features: list[torch.Tensor] = [torch.empty(0)] * len(sequences)
    tap = FeatureTap(target, taps)
    try:
        for start in range(0, len(order), 8):
            batch = order[start:start + 8]
            width = max(len(sequences[i]) for i in batch)
            ids = torch.tensor([sequences[i] + [pad] * (width - len(sequences[i])) for i in batch],
                               device=target.device)
            with torch.inference_mode():
                target(ids)
            seen = tap.take().to("cpu", torch.float16)  # [B, width, F]
            for row, i in enumerate(batch):
                features[i] = seen[row, :len(sequences[i])].clone()
            tick(len(batch))
    finally:
        tap.close()
    return features


def top_tokens(sequences: list[list[int]], most: int) -> list[int] | None:
    """The ``most`` commonest tokens of the text (sorted ids), None for the whole vocabulary."""
    if most == 0:
        return None
    counts = Counter(t for tokens in sequences for t in tokens)
    return sorted(t for t, _ in counts.most_common(most))


def _batch(sequences: list[list[int]], features: list[torch.Tensor], rng: random.Random, settings: HeadTraining):
    """``batch_size`` random windows of ``window`` tokens (or of the longest sequence's length, when shorter):
    tokens [B, W] and the target's features [B, W, H]."""
    width = min(settings.window, max(map(len, sequences)))
    usable = [i for i, tokens in enumerate(sequences) if len(tokens) >= width]
    ids, feats = [], []
    for _ in range(settings.batch_size):
        i = rng.choice(usable)
        start = rng.randrange(len(sequences[i]) - width + 1)
        ids.append(sequences[i][start:start + width])
        feats.append(features[i][start:start + width])
    return torch.tensor(ids), torch.stack(feats).float()


def head_losses(head: EagleHead, embed: torch.nn.Module, ids: torch.Tensor, feats: torch.Tensor,
                settings: HeadTraining, noise: bool = True) -> tuple[torch.Tensor, list[float]]:
    """The training loss over ``settings.unroll`` steps, and each step's top-1 agreement with the target."""
    width = ids.shape[1]
    inputs = feats[:, :-1]
    if noise and settings.noise:
        inputs = inputs + (torch.rand_like(inputs) * 2 - 1) * settings.noise
    total, agreement = 0.0, []
    for step in range(1, settings.unroll + 1):
        span = width - step  # positions t whose step-ahead target exists
        positions = torch.arange(span)[None].expand(ids.shape[0], -1)
        hidden = head(embed(ids[:, step:]), inputs[:, :span], None, positions, own=False)  # [B, span, H]
        wanted = feats[:, step:]  # [B, span, H]: the target's features at t + step
        with torch.no_grad():
            target_logp = F.log_softmax(head.lm_head(wanted), -1)
        logp = F.log_softmax(head.logits(hidden), -1)
        cls = -(target_logp.exp() * logp).sum(-1).mean()
        total = total + F.smooth_l1_loss(hidden, wanted) + settings.cls_weight * cls
        agreement.append(float((logp.argmax(-1) == target_logp.argmax(-1)).float().mean()))
        inputs = hidden[:, :-1]  # the next step drafts from the head's own features
    return total, agreement


def eagle3_losses(head: EagleHead, embed: torch.nn.Module, rows: torch.Tensor, ids: torch.Tensor, feats: torch.Tensor,
                  settings: HeadTraining, noise: bool = True) -> tuple[torch.Tensor, list[float]]:
    """EAGLE-3's loss with its training-time test (EAGLE ``traineagle3``): over :attr:`HeadTraining.unrolled` steps,
    step 1 drafting from ``fc`` over the three tapped layers (``feats[..., :-H]``), each later step from the head's
    own hidden states of the step before, attending as it does when drafting (:func:`unrolled_mask`); step i's
    cross-entropy against the target's distribution at t + i (its final hidden state ``feats[..., -H:]`` through its
    output ``rows`` over the head's vocabulary) weighted 0.8^(i-1) as upstream's, and each step's top-1 agreement."""
    tapped = feats.shape[-1] - embed.weight.shape[1]  # the layer inputs, then the final hidden state
    inputs, final = feats[:, :-1, :tapped], feats[..., tapped:]
    if noise and settings.noise:
        inputs = inputs + (torch.rand_like(inputs) * 2 - 1) * settings.noise
    total, agreement = 0.0, []
    for step, hidden in enumerate(unrolled(head, embed, ids, inputs, settings.unrolled), start=1):
        with torch.no_grad():
            target_logp = F.log_softmax(final[:, step:] @ rows.T, -1)
        logp = F.log_softmax(head.logits(hidden), -1)
        total = total - 0.8 ** (step - 1) * (target_logp.exp() * logp).sum(-1).mean()
        agreement.append(float((logp.argmax(-1) == target_logp.argmax(-1)).float().mean()))
    return total, agreement


def unrolled(head: EagleHead, embed: torch.nn.Module, ids: torch.Tensor, inputs: torch.Tensor, steps: int):
    """Yield the head's hidden states [B, W - i, H] of steps i = 1..``steps`` over tokens ``ids`` [B, W] and the
    target's tapped features ``inputs`` [B, W - 1, F]: index t of step i stands for drafting position t + i - 1 (its
    rotary position) after the target's features up to t, from the head's own output of step i - 1 and token t + i."""
    cache, width = kv_cache.new_cache(), ids.shape[1]
    hidden = None
    for step in range(1, steps + 1):
        span = width - step
        positions = (torch.arange(span, device=ids.device) + step - 1)[None].expand(ids.shape[0], -1)
        own = hidden[:, :span] if hidden is not None else inputs[:, :span]
        mask = unrolled_mask(width, step, ids.device, head.dtype) if step > 1 else None
        hidden = head(embed(ids[:, step:]), own, cache, positions, own=step > 1, mask=mask)
        yield hidden


def unrolled_mask(width: int, step: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """The training-time test's additive mask ``[1, 1, W - step, keys]`` for unrolled step ``step`` >= 2 over the
    keys of steps 1..``step`` (W - 1, W - 2, ... of them, as cached): index t sees step 1's keys at indices <= t
    (the positions fed with the target's features) and each later step's key at index t (its own earlier drafts,
    itself last), exactly what the drafter's cache holds when it drafts that position."""
    span = width - step
    blocks = [torch.ones(span, width - 1, dtype=torch.bool, device=device).tril()]
    blocks += [torch.eye(span, width - j, dtype=torch.bool, device=device) for j in range(2, step + 1)]
    return kv_cache.additive(torch.cat(blocks, 1)[None], dtype)


def new_medusa(target, settings: HeadTraining) -> MedusaHeads:
    """Medusa heads for ``target``: ResBlocks zero-initialised (identity at the start, as Medusa's), each output layer
    the target's own head (frozen)."""
    hidden, vocab = target.config.hidden_size, target.config.vocab_size
    heads = MedusaHeads(settings.medusa_heads, settings.medusa_layers, hidden, vocab)
    for block, out in zip(heads.blocks, heads.out):
        torch.nn.init.zeros_(block.weight)
        torch.nn.init.zeros_(block.bias)
        out.weight = torch.nn.Parameter(kernels.output_weight(target).detach().float().clone(), requires_grad=False)
    return heads.to(target.device)


def medusa_losses(heads: MedusaHeads, ids: torch.Tensor, feats: torch.Tensor) -> tuple[torch.Tensor, list[float]]:
    """Cross-entropy of head i (features at t) on the token at t + 2 + i, summed over heads; each head's top-1
    agreement with that token."""
    total, agreement = 0.0, []
    for i, (block, out) in enumerate(zip(heads.blocks, heads.out)):
        span = ids.shape[1] - 2 - i
        x = feats[:, :span]
        for _ in range(heads.layers):
            x = x + F.silu(block(x))
        logits = out(x)  # [B, span, vocab]
        wanted = ids[:, 2 + i: 2 + i + span]
        total = total + F.cross_entropy(logits.flatten(0, 1), wanted.flatten())
        agreement.append(float((logits.argmax(-1) == wanted).float().mean()))
    return total, agreement


class _Work:
    """The work folder beside ``out``: data, checkpoint, settings."""

    def __init__(self, out: Path, settings: HeadTraining, target_name: str) -> None:
        self.path = out.parent / f".{out.name}.train"
        self.key = {"target": target_name, **asdict(settings)}
        if self.path.exists():
            saved = json.loads((self.path / "settings.json").read_text()) if (self.path / "settings.json").is_file() \
                else None
            if saved != self.key:
                raise SpecdecError(f"{self.path} holds a training run with other settings: rerun with them, or "
                                   "remove that folder to start over")
        self.path.mkdir(parents=True, exist_ok=True)
        write_json(self.path / "settings.json", self.key)

    def load(self, name: str):
        path = self.path / name
        return torch.load(path, weights_only=False) if path.is_file() else None

    def save(self, name: str, value) -> None:
        with atomic_output(self.path / name) as tmp:
            torch.save(value, tmp)


@dataclass
class _Run:
    """What a checkpoint holds: the head, its optimizer and the steps done."""

    head: torch.nn.Module  # an EagleHead or MedusaHeads
    optimizer: torch.optim.Optimizer
    work: _Work
    step: int = 0

    def checkpoint(self) -> None:
        trained = {name: p.detach() for name, p in self.head.named_parameters() if p.requires_grad}  # not the
        self.work.save("checkpoint.pt", {"head": trained, "optimizer": self.optimizer.state_dict(),  # target's rows
                                         "step": self.step})


def _train(run: _Run, trainable, losses, sequences, features, rng: random.Random, settings: HeadTraining,
           tick: Tick, log, device) -> None:
    """Train from ``run.step`` to ``settings.steps`` on ``losses(ids, feats) -> (loss, agreement by step or head)``,
    with a checkpoint every two minutes and at the end."""
    optimizer, step = run.optimizer, run.step
    last_save = time.perf_counter()
    while step < settings.steps:
        lr = settings.lr * min(1.0, (step + 1) / 50) * 0.5 * (1 + math.cos(math.pi * step / settings.steps))
        for group in optimizer.param_groups:
            group["lr"] = lr
        ids, feats = _batch(sequences, features, rng, settings)
        loss, agreement = losses(ids.to(device), feats.to(device))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        optimizer.step()
        step += 1
        run.step = step
        tick(1)
        if step % 100 == 0:
            log(f"step {step}: loss {float(loss.detach()):.3f}, top-1 agreement {[round(a, 3) for a in agreement]}")
        if time.perf_counter() - last_save > 120 or step == settings.steps:
            run.checkpoint()
            last_save = time.perf_counter()


def train_head(model: str, out: Path, settings: HeadTraining = HeadTraining(), load: LoadSettings = LoadSettings(),
               tick: Tick = no_progress, log=lambda line: None) -> Built:
    """``zoo train-head``: build (or resume) the data and the head for ``model``, save it at ``out`` atomically;
    return what was built and measured."""
    check_out(out)
    settings.check()
    loaded = load.load(model)
    target, tokenizer = loaded.model, loaded.tokenizer
    target.requires_grad_(False)  # its embedding feeds the head: no gradient through it
    read = answers(settings, tokenizer, model) if settings.data else ([], 0, [])  # a bad --data: one line,
    work = _Work(out, settings, model)  # before the work folder exists
    started = time.perf_counter()
    data = work.load("data.pt")
    if data is not None:  # resumed: the bar counts training steps only
        tick(0, total=settings.steps)
    else:
        texts = [] if settings.data else ngram_prompts(settings.prompts, settings.max_prompts)
        chunks = settings.text_tokens // settings.context
        tick(0, total=chunks + len(texts) + len(read[0]) + settings.steps)  # one bar: text read, prompts continued
        # or answers read, training steps
        taps = settings.taps(target.config.num_hidden_layers)
        sequences, features = teacher_forced(target, tokenizer, settings, tick, taps) if chunks else ([], [])
        if settings.data:
            log(f"reading the target's answers in {settings.data}")
            generated_sequences, generated, sources = read
            generated_features = forced_features(target, generated_sequences, taps, pad_id(tokenizer), tick)
        else:
            log(f"continuing {len(texts)} held-in prompts ({settings.new_tokens} tokens each)")
            generated_sequences, generated_features, generated = generations(target, tokenizer, texts, settings, tick,
                                                                             taps)
            sources = [{"prompts": {"spec": settings.prompts or DEFAULT_PROMPTS, "count": len(texts)},
                        "temperature": 0.0, "answer_tokens": generated, "held_out": HELD_OUT}]
        if chunks:
            sources.append({"text": settings.text, "tokens": sum(map(len, sequences))})
        sequences, features = sequences + generated_sequences, features + generated_features  # held out: the last
        data = {"sequences": sequences, "features": features, "generated": generated, "text_sequences": len(sequences)
                - len(generated_sequences), "seconds": time.perf_counter() - started, "sources": sources}
        log(f"{sum(map(len, sequences))} tokens with features, {generated} of them generated")
        work.save("data.pt", data)
    sequences, features = data["sequences"], data["features"]
    token_ids = top_tokens(sequences, settings.vocab_top)
    torch.manual_seed(settings.seed)
    recipe = _recipe(target, model, settings, token_ids)
    head, losses = recipe.head, recipe.losses

    trainable = [p for p in head.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=settings.lr, weight_decay=0.0)
    held = max(1, (len(sequences) - data.get("text_sequences", 0)) // 20)  # the last 5% of the generations:
    # agreement measured on them, never trained on
    train_seqs, train_feats = sequences[:-held], features[:-held]
    run, checkpoint = _Run(head, optimizer, work), work.load("checkpoint.pt")
    if checkpoint is not None:
        head.load_state_dict(checkpoint["head"], strict=False)
        optimizer.load_state_dict(checkpoint["optimizer"])
        run.step = checkpoint["step"]
        log(f"resuming at step {run.step}")
    rng = random.Random(settings.seed * 1_000_003 + run.step)
    tick(run.step)
    head.train()
    try:
        _train(run, trainable, losses, train_seqs, train_feats, rng, settings, tick, log, target.device)
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: keep what was learnt; the same command resumes from it
        run.checkpoint()
        raise
    head.eval()
    agreement = _agreement(lambda ids, feats: losses(ids, feats, noise=False), sequences[-held:], features[-held:],
                           recipe.shortest, target.device)
    taps = [t for t in settings.taps(target.config.num_hidden_layers) if t != FINAL] or [FINAL]  # what the head reads
    meta = {"target": model, "vocab": vocab_fingerprint(tokenizer), "taps": taps, "token_ids": token_ids,
            "training": {**asdict(settings), "sequences": len(sequences), "tokens": sum(map(len, sequences)),
                         "generated_tokens": data["generated"], "text_sequences": data.get("text_sequences", 0),
                         "held_out_sequences": held, "data": data.get("sources", []), "steps_done": run.step,
                         ("top1_agreement_by_head" if settings.medusa else "top1_agreement_by_step"): agreement,
                         "minutes": round((time.perf_counter() - started) / 60, 1)}}
    with atomic_output(out, directory=True) as tmp:
        recipe.save(tmp, meta)
    shutil.rmtree(work.path, ignore_errors=True)
    return Built(str(out), f"{'medusa' if settings.medusa else 'eagle'}:{out}",
                 {"parameters": sum(p.numel() for p in trainable), **meta["training"]})


@dataclass
class _Recipe:
    """One head kind's training: the head built for the target, its loss ``losses(ids, feats, noise)`` -> (loss,
    agreement by step or head), how it is saved ``save(directory, meta)``, and how long a held-out sequence must
    be to measure every step's agreement."""

    head: torch.nn.Module
    losses: Callable[..., tuple[torch.Tensor, list[float]]]
    save: Callable[[Path, dict], None]
    shortest: int


def _recipe(target, model: str, settings: HeadTraining, token_ids: list[int] | None) -> _Recipe:
    embed = target.get_input_embeddings()
    if settings.medusa:
        heads = new_medusa(target, settings)
        return _Recipe(heads, lambda ids, feats, noise=True: medusa_losses(heads, ids, feats),
                       lambda tmp, meta: save_medusa(tmp, heads, model, meta, token_ids), settings.medusa_heads + 1)
    if settings.kind == "eagle3":
        head = new_eagle3_head(target, token_ids, settings.seed).float()
        head.lm_head.weight.requires_grad_(settings.output_layer == "trained")  # "target": its rows, frozen
        rows = kernels.output_weight(target).float()
        rows = rows[torch.as_tensor(token_ids, device=rows.device)] if token_ids else rows  # [head vocab, H]
        return _Recipe(head,
                       lambda ids, feats, noise=True: eagle3_losses(head, embed, rows, ids, feats, settings, noise),
                       lambda tmp, meta: save_eagle3(tmp, head, model, {**meta, "training": {
                           **meta["training"], "unroll": settings.unrolled}}), settings.unrolled + 1)
    head = new_head(target, token_ids, settings.seed).float()
    return _Recipe(head, lambda ids, feats, noise=True: head_losses(head, embed, ids, feats, settings, noise),
                   lambda tmp, meta: save_head(tmp, head.to(target.dtype), meta), settings.unrolled + 1)


@torch.no_grad()
def _agreement(losses, sequences, features, shortest: int, device) -> list[float]:
    """Top-1 agreement with the target by unrolled step (EAGLE) or by head (Medusa) on held-out sequences longer than
    ``shortest`` tokens (first-token acceptance's proxy)."""
    sums: list[float] = []
    count = 0
    for tokens, feats in zip(sequences, features, strict=True):
        if len(tokens) <= shortest:
            continue
        _, agreement = losses(torch.tensor([tokens], device=device), feats[None].float().to(device))
        sums = [s + a for s, a in zip(sums or [0.0] * len(agreement), agreement, strict=True)]
        count += 1
    return [round(s / max(count, 1), 4) for s in sums]
