"""The serving path: our draft kinds as vLLM ``speculative_config`` dicts and SGLang server arguments, and vLLM's
speculative-decoding counters as our :class:`~specdraft_eval.measure.stats.GenerationStats`, so the record, the
leaderboard and ``zoo rank`` read a vLLM run unchanged. Neither needs vLLM installed (see ARCHITECTURE.md, "Beyond
one machine").

vLLM's counters (``LLM.get_metrics()`` or the Prometheus endpoint; with or without the ``vllm:`` prefix and the
``_total`` suffix) and what they fill:

- ``spec_decode_num_drafts``: verification steps that drafted; ``spec_decode_num_draft_tokens`` → ``draft_tokens``;
  ``spec_decode_num_accepted_tokens`` → ``accepted_tokens``; ``spec_decode_num_accepted_tokens_per_pos`` →
  ``accepted_per_position`` (the same convention as ours: steps whose draft token i was accepted).
- ``generation_tokens`` → ``generated_tokens``; ``request_success`` → ``generations``.
- ``steps`` = generated − requests − accepted: every decoding step (drafted or not) emits its accepted tokens plus
  one of the target's own, and each request's first token comes from its prefill. Where every step drafted,
  ``steps`` = ``num_drafts`` and our ``tar`` is vLLM's mean acceptance length exactly.
- ``drafted_per_position``: vLLM drafts all ``num_speculative_tokens`` positions in every draft, so each position
  was drafted ``num_drafts`` times; the acceptance-length histogram follows from the per-position counts.
- Wall time (measured by the caller around generation) → ``decode_seconds``. vLLM does not split draft from
  verification time, so those stay 0 and the record reports draft ms/token, verify ms/step and loop overhead as
  unknown; tokens/s, TAR and acceptance are exact.
"""

from __future__ import annotations

from specdraft_eval.drafts.kind import SERVER_NAMES, draft_kinds
from specdraft_eval.drafts.spec import AUTO, COMPOSITE, DraftSpec
from specdraft_eval.errors import SpecdecError
from specdraft_eval.measure.stats import GenerationStats

COUNTERS = ("spec_decode_num_drafts", "spec_decode_num_draft_tokens", "spec_decode_num_accepted_tokens",
            "spec_decode_num_accepted_tokens_per_pos", "generation_tokens", "request_success")


def _kind_of(draft: str, server: str):
    """(the kind, its value, the spec) of a non-composite registered-kind or model draft, or a one-line error."""
    spec = DraftSpec.parse(draft)
    if spec.kind == COMPOSITE:
        raise SpecdecError(f"draft {draft!r} is a composite, which {SERVER_NAMES[server]} cannot run (one method per "
                           "config): serve one of its parts")
    if spec.kind == AUTO:
        raise SpecdecError("resolve draft=auto first (`zoo recommend`), then map the draft it names")
    return draft_kinds().get(spec.kind), spec


def speculative_config(draft: str, num_draft_tokens: int) -> dict:
    """vLLM's ``speculative_config`` for one of our draft specs (the kind's mapping:
    :meth:`~specdraft_eval.drafts.kind.DraftKind.vllm_config`), or a one-line error saying what to use instead."""
    kind, spec = _kind_of(draft, "vllm")
    if kind is None:
        return {"model": spec.arg, "num_speculative_tokens": num_draft_tokens}
    return kind.vllm_config(spec.value, num_draft_tokens, draft)


def sglang_args(draft: str, num_draft_tokens: int) -> dict:
    """SGLang's server arguments (``sglang.launch_server`` flags, as keys) for one of our draft specs: a draft model,
    or the kind's mapping (:meth:`~specdraft_eval.drafts.kind.DraftKind.sglang_args`); a one-line error for the
    kinds SGLang has no counterpart of, or for a head it would read differently from our loader."""
    kind, spec = _kind_of(draft, "sglang")
    if kind is None:
        return {"speculative-algorithm": "STANDALONE", "speculative-draft-model-path": spec.arg,
                "speculative-num-steps": num_draft_tokens, "speculative-eagle-topk": 1,
                "speculative-num-draft-tokens": num_draft_tokens + 1}
    return kind.sglang_args(spec.value, num_draft_tokens, draft)


def _counter(metrics: dict, name: str):
    for key in (name, f"vllm:{name}", f"{name}_total", f"vllm:{name}_total"):
        if key in metrics:
            return metrics[key]
    raise SpecdecError(f"vLLM metrics lack {name}: pass every counter of LLM.get_metrics() ({', '.join(COUNTERS)})")


def stats_from_vllm(metrics: dict, num_speculative_tokens: int, wall_seconds: float) -> GenerationStats:
    """Our counters from a snapshot of vLLM's (``{name: value}``, per-position counts as a list), for a run that
    took ``wall_seconds`` of generation. Take the difference of two snapshots for one run on a live server."""
    drafts = int(_counter(metrics, "spec_decode_num_drafts"))
    draft_tokens = int(_counter(metrics, "spec_decode_num_draft_tokens"))
    accepted = int(_counter(metrics, "spec_decode_num_accepted_tokens"))
    per_position = [int(v) for v in _counter(metrics, "spec_decode_num_accepted_tokens_per_pos")]
    generated = int(_counter(metrics, "generation_tokens"))
    requests = int(_counter(metrics, "request_success"))
    steps = generated - requests - accepted
    if sum(per_position) != accepted or draft_tokens != drafts * num_speculative_tokens or steps < drafts:
        raise SpecdecError(f"inconsistent vLLM counters (per position {per_position} vs accepted {accepted}, "
                           f"{draft_tokens} draft tokens in {drafts} drafts of {num_speculative_tokens}): "
                           "pass one snapshot, or the difference of two, from the same run")
    per_position = per_position + [0] * (num_speculative_tokens - len(per_position))
    reached = [steps, *per_position]  # steps that accepted at least n draft tokens, n = 0..γ
    histogram = [reached[n] - reached[n + 1] for n in range(num_speculative_tokens)] + [reached[-1]]
    return GenerationStats(
        generations=requests, steps=steps, draft_tokens=draft_tokens,
        accepted_tokens=accepted, generated_tokens=generated, decode_seconds=wall_seconds,
        drafted_per_position=[drafts] * num_speculative_tokens, accepted_per_position=per_position,
        acceptance_length_histogram=histogram)
