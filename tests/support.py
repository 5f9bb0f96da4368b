"""Helpers the tests share: tiny random-weight models and tokenizers, the console scripts run in process, reference
decoders and distributions, fixtures' builders. Fixtures themselves live in ``conftest.py``."""

from __future__ import annotations

import gc
import io
import itertools
import json
import logging
import os
import random
import re
import subprocess
import sys
import threading
import warnings
from collections import Counter
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import torch
from scipy.stats import chisquare
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from specdraft_eval.drafts.composite import CompositeDrafter
from specdraft_eval.drafts.eagle import (
    EAGLE3,
    EagleHead,
    HeadLayout,
    head_config,
    new_head,
)
from specdraft_eval.drafts.layers import layer_view
from specdraft_eval.drafts.model import ModelDrafter
from specdraft_eval.drafts.ngram import NGramDrafter
from specdraft_eval.drafts.prompt_lookup import PromptLookupDrafter
from specdraft_eval.engine.drafter import DrafterBase, Proposal
from specdraft_eval.engine.params import StopCheck, first_stop
from specdraft_eval.engine.sampling import Sampler
from specdraft_eval.measure.stats import GenerationStats
from specdraft_eval.results.record import Runtime, SpecdecRecord
from zoo.build.train_head import save_head

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def tiny_llama(seed: int = 0, vocab: int = 64, layers: int = 4, hidden: int = 32) -> LlamaForCausalLM:
    """A random-weight Llama small enough for thousands of generations a second."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    return LlamaForCausalLM(config).eval()


def observed(drafter) -> list:
    """The features the engine hands ``drafter``'s rows (every ``observe``), recorded in order into the list
    returned (``drafter.batch_drafter`` is wrapped: what the engine drafts with)."""
    seen: list = []
    make = drafter.batch_drafter

    def recording(count):
        batch = make(count)
        observe = batch.observe
        batch.observe = lambda row, features: (seen.append(features.clone()), observe(row, features))
        return batch

    drafter.batch_drafter = recording
    return seen


def word_tokenizer(words: list[str]) -> PreTrainedTokenizerFast:
    """A whitespace word-level tokenizer over ``words`` (no hub needed)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {w: i for i, w in enumerate(words)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=words[0]))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token=words[0], eos_token=words[1], pad_token=words[1])


def save_tiny(path: Path, seed: int = 0, words: list[str] | None = None, layers: int = 4) -> Path:
    """Write a tiny model plus tokenizer as a normal HF directory."""
    words = words or ["<unk>", "</s>", *[f"w{i}" for i in range(62)]]
    model = tiny_llama(seed, vocab=len(words), layers=layers)
    model.config.eos_token_id = 1
    model.generation_config.eos_token_id = 1
    model.save_pretrained(path)
    word_tokenizer(words).save_pretrained(path)
    return path


def run_cli(*args: str, timeout: int = 900, env: dict | None = None, cwd: Path = ROOT,
            process: bool = False) -> subprocess.CompletedProcess:
    """Run a console script of this environment (``lm_eval``, ``zoo``) as a user would (from ``cwd``): in this
    process (no interpreter start, no torch import: milliseconds for an argument error), or, with ``process`` (what
    the process boundary decides: registration at start-up, signals, the interpreter's exit), as a subprocess."""
    settings = {"TOKENIZERS_PARALLELISM": "false", **(env or {})}
    read_at_start = [key for key in settings if key.startswith(READ_AT_START) and key not in HUB_CONSTANTS]
    if process or args[0] not in IN_PROCESS or read_at_start:
        return subprocess.run([str(BIN / args[0]), *args[1:]], cwd=cwd, capture_output=True, text=True,
                              timeout=timeout, env={**os.environ, **settings})
    return in_process(args, settings, cwd)


def _zoo() -> None:
    from zoo.cli import app

    app(args=sys.argv[1:], prog_name="zoo")


def _lm_eval() -> None:
    from lm_eval.__main__ import cli_evaluate

    cli_evaluate()


def index_tasks_once() -> None:
    """lm-eval's task index (every task's YAML parsed: 5 s) built once per folder in this session: each
    ``TaskManager`` still builds its tasks afresh (deep copies) from the index, with its own metadata."""
    from lm_eval.tasks._index import TaskIndex

    build, built = TaskIndex.build, {}

    def build_once(paths, *, resolve_includes=True):
        paths = [Path(p).resolve() for p in paths]  # the working directory changes between runs
        key = (tuple(map(str, paths)), resolve_includes)
        if key not in built:
            built[key] = build(paths, resolve_includes=resolve_includes)
        return built[key]

    TaskIndex.build = staticmethod(build_once)


IN_PROCESS = {"zoo": _zoo, "lm_eval": _lm_eval}
INTERPRETER_WARNING_FILTERS = list(warnings.filters)  # before pytest's per-test filters
LOGGERS = ("", "lm_eval", "transformers", "datasets")  # those with stream handlers of their own
READ_AT_START = ("HF_", "PYTHONPATH", "OMP_", "MKL_")  # settings read when a module is imported: a process each
HUB_CONSTANTS = ("HF_HUB_OFFLINE", "HF_HUB_CACHE")  # except these: huggingface_hub's constants, read when called


def in_process(args: tuple[str, ...], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    """``args`` run as the console script would run them, its stdout, stderr (print, logging, warnings) and exit
    code captured as a subprocess's; the environment, working directory, argv and log handlers restored after."""
    with IN_PROCESS_LOCK:  # argv, cwd, environment and stdout are the process's: one run at a time
        return _in_process(args, env, cwd)


IN_PROCESS_LOCK = threading.Lock()


def _in_process(args: tuple[str, ...], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    out, err = io.StringIO(), io.StringIO()
    saved_env, saved_cwd, saved_argv = dict(os.environ), os.getcwd(), sys.argv
    last_resort = logging.StreamHandler(err)  # what Python's last-resort handler shows a process with no handler
    last_resort.setLevel(logging.WARNING)
    streams = [h for name in LOGGERS for h in logging.getLogger(name).handlers if type(h) is logging.StreamHandler]
    previous = [h.setStream(err) for h in streams]
    os.environ.update(env)
    hub_constants = _set_hub_constants(env)
    os.chdir(cwd)
    sys.argv = list(args)
    logging.getLogger().addHandler(last_resort)
    code = 0
    try:
        with redirect_stdout(out), redirect_stderr(err), warnings.catch_warnings():
            warnings.filters[:] = INTERPRETER_WARNING_FILTERS
            warnings.showwarning = warnings._showwarning_orig
            try:
                IN_PROCESS[args[0]]()
            except SystemExit as exc:  # as the interpreter exits: None is 0, a message goes to stderr with 1
                if exc.code is None or isinstance(exc.code, int):
                    code = exc.code or 0
                else:
                    print(exc.code, file=sys.stderr)
                    code = 1
            except Exception:
                sys.excepthook(*sys.exc_info())
                code = 1
    finally:
        logging.getLogger().removeHandler(last_resort)
        for handler, stream in zip(streams, previous):
            handler.setStream(stream)
        for name in LOGGERS:  # handlers a first run made while stderr was captured
            for handler in logging.getLogger(name).handlers:
                if type(handler) is logging.StreamHandler and handler.stream is err:
                    handler.setStream(sys.stderr)
        sys.argv = saved_argv
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        _set_hub_constants(hub_constants)
        gc.collect()
    return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())


def _set_hub_constants(env: dict) -> dict:
    """huggingface_hub's constants for the ``HUB_CONSTANTS`` in ``env`` (a string, or the constant's value); their
    values before."""
    from huggingface_hub import constants

    before = {key: getattr(constants, key) for key in HUB_CONSTANTS if key in env}
    for key, value in before.items():
        setting = env[key]
        if isinstance(setting, str) and key == "HF_HUB_OFFLINE":
            setting = constants._is_true(setting)
        setattr(constants, key, setting)
    return before


RUNTIME = Runtime("float32", "onednn", attention="sdpa")
"""A complete runtime, as today's code records it (records without one are left out of boards and auto)."""


def on_policy(target) -> list[list[int]]:
    """The target's own greedy continuations of prompts other than the tests' (what `zoo ngram` builds from)."""
    prompts = [torch.randint(0, 64, (1, 6), generator=torch.Generator().manual_seed(100 + i)) for i in range(6)]
    return [hf_greedy(target, p, 40) for p in prompts]


def drafts(target):
    return {
        "prompt-lookup": PromptLookupDrafter(),
        "layers": ModelDrafter(layer_view(target, [0, 3]), "layers:0,3", 64),
        "other-model": ModelDrafter(tiny_llama(seed=1, layers=2), "other", 64),
        "self": ModelDrafter(target, "self", 64),
        "reduced-head": ModelDrafter(tiny_llama(seed=1, layers=2), "reduced", 64, token_ids=list(range(0, 64, 2))),
        "composite": CompositeDrafter([PromptLookupDrafter(), ModelDrafter(layer_view(target, [0, 3]), "l", 64)]),
        "ngram": NGramDrafter(on_policy(target)),
    }


def stop_when(predicate) -> StopCheck:
    """A stop check from a predicate over the tokens so far: the shortest prefix it holds for."""
    return lambda new: first_stop(new, 0, lambda end: predicate(new[:end]))


def hf_greedy(model, prompt: torch.Tensor, n: int) -> list[int]:
    mask = torch.ones_like(prompt)
    out = model.generate(prompt, attention_mask=mask, max_new_tokens=n, do_sample=False, pad_token_id=0)
    return out[0, prompt.shape[1] :].tolist()


VOCAB = 8


PROMPT = [3, 1, 4, 1, 5, 1]  # repeats give prompt lookup something to propose


SAMPLES = 2000


def warped(logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Sampling's distribution written out from its definitions, independently of the engine's ``Sampler``:
    logits / temperature; only the top_k largest kept; then the nucleus: the most likely tokens whose probability
    adds up to top_p, the one that crosses it included (at least one); renormalised."""
    probs = torch.softmax(logits.double() / temperature, dim=-1)
    order = torch.argsort(probs, descending=True)
    keep = torch.zeros_like(probs, dtype=torch.bool)
    total = 0.0
    for rank, token in enumerate(order.tolist()):
        if (top_k and rank >= top_k) or (rank and total >= top_p):
            break
        keep[token] = True
        total += float(probs[token])
    probs = torch.where(keep, probs, torch.zeros_like(probs))
    return probs / probs.sum()


def exact_joint(target, sampler: Sampler) -> dict[tuple[int, ...], float]:
    """The target's exact probability of every 3-token continuation, marginalised to (x1, x2) and x3, under
    ``sampler``'s settings (its temperature, top-k and top-p, applied by :func:`warped`, not by the sampler)."""
    settings = {"temperature": sampler.temperature, "top_k": sampler.top_k, "top_p": sampler.top_p}
    with torch.inference_mode():
        def dist(tokens):
            return warped(target(torch.tensor([tokens])).logits[0, -1], **settings)

        p1 = dist(PROMPT)
        joint12, marginal3 = {}, torch.zeros(VOCAB)
        for a, b in itertools.product(range(VOCAB), repeat=2):
            pab = float(p1[a]) * float(dist(PROMPT + [a])[b])
            joint12[(a, b)] = pab
            marginal3 += pab * dist(PROMPT + [a, b])
    return {**joint12, **{(c,): float(marginal3[c]) for c in range(VOCAB)}}


def chi2_pvalue(observed: Counter, expected: dict, keys: list, n: int) -> float:
    """Chi-square goodness of fit, pooling cells with fewer than 5 expected counts."""
    obs, exp, pool_o, pool_e = [], [], 0.0, 0.0
    for key in keys:
        e = expected[key] * n
        if e < 5:
            pool_o, pool_e = pool_o + observed[key], pool_e + e
        else:
            obs.append(observed[key])
            exp.append(e)
    if pool_e > 0:
        obs.append(pool_o)
        exp.append(pool_e)
    scale = sum(obs) / sum(exp)
    return float(chisquare(obs, [e * scale for e in exp]).pvalue)


def fit(samples: list[list[int]], expected: dict) -> tuple[float, float]:
    pairs = Counter(tuple(s[:2]) for s in samples)
    thirds = Counter((s[2],) for s in samples)
    keys12 = [k for k in expected if len(k) == 2]
    keys3 = [k for k in expected if len(k) == 1]
    return chi2_pvalue(pairs, expected, keys12, len(samples)), chi2_pvalue(thirds, expected, keys3, len(samples))


def zoo_json(*args: str, env: dict | None = None):
    done = run_cli("zoo", *args, "--json", env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def assert_one_line_error(done, message: str) -> None:
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if "error" in line.lower()]
    last = done.stderr.strip().splitlines()[-1]
    assert errors == [last] and last.startswith("zoo: error:") and message in last, done.stderr


def write_result(folder: Path, draft: str, tps_scale: float, task_acc: float = 0.5,
                 target: str = "smollm2-135m-instruct", baseline: bool = True, accepted: int = 12,
                 dynamic: bool = False, runtime: Runtime = RUNTIME) -> Path:
    """A results file of one run; ``accepted``: tokens accepted on HumanEval in its 10 steps (TAR 1 + accepted/10)."""
    stats = {
        "specdec_humaneval": GenerationStats(1, 10, 30, accepted, 10 + accepted, 0.1, 0.3 / tps_scale, 0.5,
                                             1.0 / tps_scale, 10 + accepted, 1.2,
                                             [10, 10, 10], [6, 4, 2], [4, 2, 2, 2], [0, 0, 0, 10], [2.2]),
        "specdec_mmlu_cot": GenerationStats(1, 10, 30, 6, 16, 0.1, 0.3, 0.5, 0.9, 16, 1.0,
                                            [10, 10, 10], [4, 2, 0], [6, 2, 2, 0], [0, 0, 0, 10], [1.6]),
    }
    if not baseline:
        for figures in stats.values():
            figures.baseline_tokens, figures.baseline_seconds = 0, 0.0
    block = SpecdecRecord.new(target, draft, 3, dynamic, "cpu", stats, runtime=runtime).to_block()
    data = {"results": {"specdec_humaneval": {"alias": "x", "pass@1,none": task_acc, "pass@1_stderr,none": 0.1},
                        "specdec_mmlu_cot": {"exact_match,none": 0.25}},
            "config": {"specdec": block}, "date": 1764700000.0}
    folder.mkdir(parents=True, exist_ok=True)
    stem = re.sub(r"[^A-Za-z0-9]", "_", target + draft + str(runtime))
    path = folder / f"results_{stem}{'_dynamic' if dynamic else ''}.json"
    path.write_text(json.dumps(data))
    return path


def eagle_dir(tmp: Path, target, token_ids=None) -> Path:
    """Our own layout, as `zoo train-head` writes it (an untrained head)."""
    path = tmp / ("head-reduced" if token_ids else "head")
    path.mkdir()
    save_head(path, new_head(target, token_ids, seed=3), {"target": "tiny", "token_ids": token_ids})
    return path


def eagle3_dir(tmp: Path, target, midlayer: bool = False) -> Path:
    """vLLM speculators' EAGLE-3 layout (or, with ``midlayer``, the EAGLE repository's): fc over three layers'
    states, a 2H-input decoder layer, norm, a draft-vocabulary lm_head and d2t/t2d."""
    path = tmp / ("eagle3-midlayer" if midlayer else "eagle3")
    path.mkdir()
    torch.manual_seed(5)
    draft_ids = [0, 1, 2, 5, 8, 13, 21, 34, 40, 50, 63]
    layout = HeadLayout(EAGLE3, (1, 3, 4), head_config(target), draft_ids)
    head = EagleHead(layout, target.config.hidden_size, fc_bias=False)
    state = {k: v for k, v in head.state_dict().items() if not k.startswith("rotary_emb.")}
    if midlayer:
        state = {k.replace("layers.0.", "midlayer."): v for k, v in state.items()}
    d2t = torch.tensor(draft_ids) - torch.arange(len(draft_ids))
    t2d = torch.zeros(target.config.vocab_size, dtype=torch.bool)
    t2d[draft_ids] = True
    from safetensors.torch import save_file

    save_file({**state, "d2t": d2t, "t2d": t2d}, str(path / "model.safetensors"))
    layer = {**head_config(target).to_dict(), "model_type": "llama"}
    config = ({**layer, "draft_vocab_size": len(draft_ids), "eagle_aux_hidden_state_layer_ids": [1, 3, 4]} if midlayer
              else {"speculators_model_type": "eagle3", "architectures": ["Eagle3Speculator"],
                    "transformer_layer_config": layer, "draft_vocab_size": len(draft_ids),
                    "norm_before_residual": True, "eagle_aux_hidden_state_layer_ids": [1, 3, 4],
                    "speculators_config": {"algorithm": "eagle3", "verifier": {"name_or_path": "tiny"},
                                           "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}]}})
    (path / "config.json").write_text(json.dumps(config, default=str))
    return path


def prompts_file(tmp: Path) -> Path:
    import random

    rng = random.Random(0)
    path = tmp / "prompts.txt"
    path.write_text("\n\n".join(" ".join(f"w{rng.randrange(62)}" for _ in range(rng.randrange(8, 30)))
                                for _ in range(40)))
    return path


SMALL = dict(new_tokens=40, context=64, vocab_top=0, batch_size=8, window=32, lr=3e-3)


class RandomTree(DrafterBase):
    """A test draft: a random tree of up to ``num_tokens`` nodes, seeded by the sequence (so no node depends on the
    sampler's draws), holding the target's own greedy continuation along one branch of random length (``oracle``),
    so that steps accept several tokens, take side branches, and reject."""

    name = "random-tree"

    def __init__(self, target, vocab: int, oracle: bool = True) -> None:
        self.target, self.vocab, self.oracle = target, vocab, oracle

    def propose(self, tokens: list[int], num_tokens: int, sampler: Sampler) -> Proposal:
        draw = random.Random(hash(tuple(tokens)))
        nodes, parents = [], []
        if self.oracle:
            length = draw.randint(0, num_tokens)
            with torch.inference_mode():
                chain = hf_greedy(self.target, torch.tensor([tokens]), length) if length else []
            nodes, parents = chain, list(range(-1, len(chain) - 1))
        while len(nodes) < num_tokens:
            parent = draw.randrange(-1, len(nodes))
            nodes.append(draw.randrange(self.vocab))
            parents.append(parent)
        depths: list[int] = []
        for parent in parents:
            depths.append(1 + (depths[parent] if parent >= 0 else 0))
        order = sorted(range(len(nodes)), key=lambda i: (depths[i], draw.random()))  # siblings shuffled
        where = {old: new for new, old in enumerate(order)}
        return Proposal([nodes[i] for i in order],
                        parents=[where[parents[i]] if parents[i] >= 0 else -1 for i in order])
