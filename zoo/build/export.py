"""``zoo export DIR --to vllm|sglang``: an EAGLE head as vLLM or SGLang loads it, as it is (Medusa heads: vLLM).

vLLM's readers (``model_executor/models/llama_eagle.py``, ``llama_eagle3.py``) differ from what ``zoo train-head``
and the EAGLE repository write: its EAGLE-1 ``fc`` has no bias and its attention biases come from the config's
``attention_bias``/``bias``; it drafts over the target's whole vocabulary (our ``eagle.json`` reduced vocabulary is
not read); an EAGLE-3 head's ``norm_before_residual`` defaults differ between its readers; its speculators config
must name ``proposal_methods[0].speculative_tokens``. The export makes each of these explicit:

- EAGLE-1: ``fc.bias`` b is folded into the first layer's attention biases (q, k, v get W·b, o gets b: the layer
  has no input norm, so this is exact), the config says ``attention_bias``/``bias`` accordingly, the embedding copy
  and the skipped input norm are dropped (vLLM shares the target's embedding).
- EAGLE-3: speculators' layout (the EAGLE repository's ``midlayer`` renamed to ``layers.0``), a speculators config
  with ``norm_before_residual`` and the tap layers written out and a proposal method.

SGLang's readers (``srt/models/llama_eagle.py``, ``llama_eagle3.py``, ``set_eagle3_layers_to_capture``) differ
otherwise: EAGLE-1's ``fc`` always has a bias and a config ``bias`` makes attention biases; a reduced vocabulary is
its ``--speculative-token-map``; EAGLE-3 reads ``midlayer.*`` (one layer, no attention biases, the residual before
``hidden_norm``) and skips any other key silently; its tap ids sit under ``eagle_config`` and name layer outputs
(it taps the input of id + 1, where vLLM and we read the ids as layer inputs). The export writes each as SGLang
reads it, and refuses in one line a head SGLang cannot run as it was trained (norm before the residual or before
``fc``, several layers, attention biases): vLLM serves those.

The exported head drafts what the original drafts under our loader (tested), except where the server itself
differs: a reduced vocabulary vLLM ignores is said in ``notes``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from specdraft_eval.drafts import medusa
from specdraft_eval.drafts.eagle.formats import read_checkpoint, variant_of
from specdraft_eval.drafts.eagle.module import EAGLE3
from specdraft_eval.drafts.eagle.servers import SERVERS, proposal_depth, sglang_layout, vllm_layout
from specdraft_eval.errors import SpecdecError
from specdraft_eval.files import atomic_output
from specdraft_eval.integration.serving import sglang_args, speculative_config


@dataclass
class Export:
    """What ``zoo export`` wrote: where, for which server, the head's method, what serves it there (vLLM's
    ``speculative_config``, SGLang's server arguments), and anything the server will do differently from our
    loader."""

    path: str
    to: str
    method: str
    serve: dict  # vLLM's speculative_config, or SGLang's server arguments
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return asdict(self)


def export_head(head: Path, to: str, out: Path) -> Export:
    """Write ``head`` (an EAGLE head directory) to ``out`` as ``to`` (:data:`SERVERS`) loads it; see the module
    docstring. ``out`` must not exist; nothing is left half-written."""
    if to not in SERVERS:
        raise SpecdecError(f"--to {to!r}: exports go to {', '.join(SERVERS)}")
    if out.exists():
        raise SpecdecError(f"--out {out} exists: give a new directory")
    if medusa.is_medusa(head):
        return _medusa(head, to, out)
    config, state, meta = read_checkpoint(head)
    variant = variant_of(config, state)
    written, state, files, notes = (vllm_layout if to == "vllm" else sglang_layout)(head, config, state, meta, variant)
    _write(out, state, written, files)
    draft = f"eagle:{out.resolve()}"
    depth = proposal_depth(written)
    serve = speculative_config(draft, depth) if to == "vllm" else sglang_args(draft, depth)
    return Export(str(out.resolve()), to, EAGLE3 if variant == EAGLE3 else "eagle", serve, notes)


def _write(out: Path, state: dict[str, torch.Tensor], config: dict, files: dict | None = None) -> None:
    """``out`` written atomically: ``model.safetensors``, ``config.json`` and ``files`` (name -> writer of a path)."""
    from safetensors.torch import save_file

    with atomic_output(out, directory=True) as tmp:
        save_file({k: v.detach().contiguous() for k, v in state.items()}, str(tmp / "model.safetensors"))
        (tmp / "config.json").write_text(json.dumps(config, indent=1, default=str))
        for name, write in (files or {}).items():
            write(tmp / name)


def _medusa(head: Path, to: str, out: Path) -> Export:
    """Medusa heads in vLLM's layout (``model_executor/models/medusa.py``, ``MedusaConfig``;
    :func:`~specdraft_eval.drafts.medusa.vllm_files`): the whole vocabulary, or a reduced one with its ``token_map``.
    SGLang has no Medusa reader."""
    if to != "vllm":
        raise SpecdecError(f"{to} has no Medusa reader: export Medusa heads --to vllm, or serve an EAGLE head there")
    heads, config = medusa.read_heads(head)
    state, written = medusa.vllm_files(heads)
    written |= {k: v for k, v in config.items() if k == "medusa_choices"}
    _write(out, state, written)
    return Export(str(out.resolve()), to, "medusa", speculative_config(f"medusa:{out.resolve()}@1", len(heads.out)),
                  ["vLLM's Medusa proposer drafts top-1 chains: serve it as medusa:DIR@1 (its trees run here)"])
