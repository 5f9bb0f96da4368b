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
- ``drafted_per_position``: where every draft had all ``num_speculative_tokens`` positions, each position was drafted
  ``num_drafts`` times; suffix drafts and n-gram drafts near the end of a match are shorter, and only the
  per-request metrics (:func:`stats_of_requests`) say which positions they drafted.
- vLLM counts drafted and accepted tokens before a stop or the token budget cut the output, so accepted tokens a
  stop discarded are in its counters (our ``overshoot_tokens`` and ``cut_*`` counters hold them apart).
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


def canonical_name(draft: str) -> str:
    """The draft's name as our engine's drafter of it is named (``prompt-lookup`` -> ``prompt-lookup:3``)."""
    kind, spec = _kind_of(draft, "vllm")
    return kind.canonical(spec.value, spec.name) if kind else draft


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


def _request_steps(drafted: list[int], accepted: list[int], generated: int) -> GenerationStats:
    """One request's counters from vLLM's per-step arrays (verify steps that drafted, as its scheduler counted them:
    before a stop or the token budget cut the output) and the tokens it returned (its first from the prefill)."""
    stats = GenerationStats(generations=1, generated_tokens=generated)
    emitted = 1 + len(drafted) + sum(accepted)  # without the steps that drafted nothing
    discarded = max(0, emitted - generated)  # the fewest tokens a cut final step can have removed
    if accepted and discarded > accepted[-1] or not accepted and discarded:
        raise SpecdecError(f"inconsistent vLLM request metrics ({generated} tokens returned, {emitted} emitted by "
                           f"the drafted steps alone): pass one request's metrics with its own token ids")
    for i, (d, a) in enumerate(zip(drafted, accepted, strict=True)):
        if i == len(drafted) - 1 and discarded:  # the final step: cut as our engine counts a cut step
            kept = a + 1 - discarded
            stats.record_step(kept - 1, kept - 1, uncut=(d, a))
        else:
            stats.record_step(d, a)
    for _ in range(generated - emitted + discarded):  # steps that drafted nothing (no n-gram match, ...)
        stats.record_step(0, 0)
    stats.overshoot_tokens = discarded
    stats.end_request()
    return stats


def stats_of_requests(requests: list[tuple[dict, int]], wall_seconds: float) -> GenerationStats:
    """Our counters from vLLM's per-request metrics (``metrics.speculative_decoding`` of each completion, from a
    server run with ``--per-request-spec-decode-metrics detailed``) and each request's returned token count.

    Exact where vLLM is: every drafted step's drafted and accepted counts, so variable-length drafts (suffix, an
    n-gram near the end of its match) are per position. Where vLLM is silent: steps that drafted nothing are
    counted as the tokens that remain; a final step cut by a stop or the budget is assumed to have removed the
    fewest tokens the counts allow (exact whenever every step drafted, as EAGLE heads and draft models do)."""
    total = GenerationStats(decode_seconds=wall_seconds)
    for spec, generated in requests:
        total += _request_steps(list(spec["per_step_drafted"]), list(spec["per_step_accepted"]), generated)
    return total


def stats_from_vllm(metrics: dict, num_speculative_tokens: int, wall_seconds: float,
                    kept_tokens: int | None = None) -> GenerationStats:
    """Our counters from a snapshot of vLLM's aggregate counters (``{name: value}``, per-position counts as a list),
    for a run that took ``wall_seconds`` of generation; the difference of two snapshots for one run on a live
    server. ``kept_tokens``: the tokens the requests returned, where stop strings cut them (vLLM's
    ``generation_tokens`` counts the tokens a final step emitted past a stop string; those are our
    ``overshoot_tokens``). Coarser than :func:`stats_of_requests`: where drafts vary in length (``num_draft_tokens``
    ≠ drafts × γ) the drafted count per position is unknown (left empty); accepted tokens the token budget discarded
    (vLLM counts them too) are the fewest the counts allow. Discarded tokens come off the deepest positions."""
    drafts = int(_counter(metrics, "spec_decode_num_drafts"))
    draft_tokens = int(_counter(metrics, "spec_decode_num_draft_tokens"))
    accepted = int(_counter(metrics, "spec_decode_num_accepted_tokens"))
    per_position = [int(v) for v in _counter(metrics, "spec_decode_num_accepted_tokens_per_pos")]
    emitted = int(_counter(metrics, "generation_tokens"))
    generated = emitted if kept_tokens is None else kept_tokens
    requests = int(_counter(metrics, "request_success"))
    if sum(per_position) != accepted or draft_tokens > drafts * num_speculative_tokens or accepted > draft_tokens:
        raise SpecdecError(f"inconsistent vLLM counters (per position {per_position} vs accepted {accepted}, "
                           f"{draft_tokens} draft tokens in {drafts} drafts of at most {num_speculative_tokens}): "
                           "pass one snapshot, or the difference of two, from the same run")
    per_position = per_position + [0] * (num_speculative_tokens - len(per_position))
    steps = emitted - requests - accepted  # every step emits its accepted tokens and one of the target's
    discarded = emitted - generated + max(0, drafts - steps)  # past a stop string, and the fewest the budget cut
    steps = max(steps, drafts)
    cut = [0] * num_speculative_tokens
    for i in reversed(range(num_speculative_tokens)):
        cut[i] = min(per_position[i], discarded - sum(cut))
    if sum(cut) != discarded or discarded > requests * num_speculative_tokens or generated > emitted:
        raise SpecdecError(f"inconsistent vLLM counters ({generated} tokens for {requests} requests cannot hold "
                           f"{drafts} drafts accepting {accepted}): pass one snapshot, or the difference of two, "
                           "from the same run")
    kept = [a - c for a, c in zip(per_position, cut)]
    reached = [steps, *kept]  # steps that accepted at least n draft tokens, n = 0..γ
    histogram = [reached[n] - reached[n + 1] for n in range(num_speculative_tokens)] + [reached[-1]]
    fixed = draft_tokens == drafts * num_speculative_tokens
    return GenerationStats(
        generations=requests, steps=steps, draft_tokens=draft_tokens, accepted_tokens=sum(kept),
        generated_tokens=generated, decode_seconds=wall_seconds, overshoot_tokens=discarded,
        drafted_per_position=[drafts] * num_speculative_tokens if fixed else [], accepted_per_position=kept,
        cut_accepted_per_position=cut, acceptance_length_histogram=histogram,
        drafted_histogram=[steps - drafts] if steps > drafts else [])  # (how long each draft was: unknown)
