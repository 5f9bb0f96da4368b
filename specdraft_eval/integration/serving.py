"""The serving path: our draft kinds as vLLM ``speculative_config`` dicts and SGLang server arguments, and vLLM's speculative-decoding counters
as our :class:`~specdraft_eval.measure.stats.GenerationStats`, so the record, the leaderboard and ``zoo rank`` read a vLLM
run unchanged. Neither needs vLLM installed (see ARCHITECTURE.md, "Beyond one machine").

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

from pathlib import Path

from specdraft_eval.drafts.spec import AUTO, COMPOSITE, MODEL, DraftSpec
from specdraft_eval.engine.drafter import static_tree
from specdraft_eval.errors import SpecdecError
from specdraft_eval.measure.stats import GenerationStats

SERVER_NAMES = {"vllm": "vLLM", "sglang": "SGLang"}
COUNTERS = ("spec_decode_num_drafts", "spec_decode_num_draft_tokens", "spec_decode_num_accepted_tokens",
            "spec_decode_num_accepted_tokens_per_pos", "generation_tokens", "request_success")


def _eagle(arg: str | None, server: str):
    """(head directory, absolute, or hub id; its :class:`~specdraft_eval.drafts.eagle.TreeShape` or None; its
    variant), or a one-line error where ``server`` would read the head differently from our loader."""
    from specdraft_eval.drafts.eagle import describe, server_differences, split

    where, tree = split(arg or "")
    local = Path(where).expanduser()
    if not local.is_dir():
        from specdraft_eval import published

        local = published.base() / where  # a shipped head, named as the published results name it
    path = str(local.resolve()) if local.is_dir() else where
    differences = server_differences(where, server)
    if differences:
        raise SpecdecError(f"{SERVER_NAMES[server]} would run head {path} differently ({differences}): write it as it "
                           f"reads it with `zoo export {path} --to {server} --out DIR` and map eagle:DIR")
    return path, tree, describe(where)[0]


def speculative_config(draft: str, num_draft_tokens: int) -> dict:
    """vLLM's ``speculative_config`` for one of our draft specs, or a one-line error saying what to use instead.
    ``eagle:DIR@KxD`` (EAGLE-2's dynamic tree) maps to vLLM's static ``speculative_token_tree`` of as many nodes
    (:func:`static_tree`): vLLM verifies a fixed tree; ``suffix`` to vLLM's suffix decoding with our settings."""
    spec = DraftSpec.parse(draft)
    kind, arg = spec.kind, spec.arg
    if kind == COMPOSITE:
        raise SpecdecError(f"draft {draft!r} is a composite, which vLLM cannot run (one method per config): "
                           "serve one of its parts")
    if kind == "prompt-lookup":
        sizes, _, branches = (arg or "3").partition("x")
        if branches and int(branches) > 1:
            raise SpecdecError(f"vLLM's n-gram lookup drafts chains, not lookup trees ({draft}): serve "
                               f"prompt-lookup:{sizes}")
        low, _, high = sizes.partition("-")
        longest = int(high or low)
        shortest = int(low) if high else 1
        return {"method": "ngram", "num_speculative_tokens": num_draft_tokens,
                "prompt_lookup_max": longest, "prompt_lookup_min": shortest}
    if kind == "suffix":
        from specdraft_eval.drafts import suffix

        config = {"method": "suffix", "num_speculative_tokens": num_draft_tokens,
                  "suffix_decoding_max_tree_depth": suffix.MAX_MATCH, "suffix_decoding_max_spec_factor": 1.0,
                  "suffix_decoding_min_token_prob": suffix.MIN_PROB}
        return config | ({"suffix_decoding_max_cached_requests": 0} if arg == "local" else {})
    if kind == "layers":
        raise SpecdecError(f"vLLM cannot run a layer view ({draft}): save it as a draft model with "
                           f"`zoo prune TARGET --keep {arg} --out DIR` and serve draft=DIR")
    if kind == "ngram":
        raise SpecdecError(f"vLLM has no n-gram-table draft ({draft}): serve prompt-lookup (vLLM's ngram) instead")
    if kind == "eagle":
        where, tree, method = _eagle(arg, "vllm")
        config = {"method": method, "model": where, "num_speculative_tokens": num_draft_tokens}
        if tree is not None:
            config["speculative_token_tree"] = str(static_tree(tree.topk, tree.depth, num_draft_tokens))
        return config
    if kind == "medusa":
        from specdraft_eval.drafts.checkpoint import read_json
        from specdraft_eval.drafts.medusa import WHAT, vllm_layout
        from specdraft_eval.drafts.spec import split_shape

        where, shape = split_shape(arg or "")
        path = Path(where).expanduser()
        if not vllm_layout(read_json(path / "config.json", WHAT) if (path / "config.json").is_file() else {}):
            raise SpecdecError(f"vLLM reads Medusa heads in its own layout ({draft}): write them so with `zoo export "
                               f"{where} --to vllm --out DIR` and map medusa:DIR@1")
        if shape != "1":
            raise SpecdecError(f"vLLM's Medusa proposer drafts top-1 chains, not trees ({draft}): map medusa:{where}@1")
        return {"method": "medusa", "model": str(path.resolve()), "num_speculative_tokens": num_draft_tokens}
    if kind == AUTO:
        raise SpecdecError("resolve draft=auto first (`zoo recommend`), then map the draft it names")
    if kind != MODEL:
        raise SpecdecError(f"vLLM has no counterpart of draft kind {kind!r} ({draft}): serve a draft model or "
                           "prompt-lookup")
    return {"model": arg, "num_speculative_tokens": num_draft_tokens}


def sglang_args(draft: str, num_draft_tokens: int) -> dict:
    """SGLang's server arguments (``sglang.launch_server`` flags, as keys) for one of our draft specs: an EAGLE head
    (chain: top-1, γ steps; ``@KxD``: top-K, D steps, γ nodes plus the root verified; its token map where ``zoo
    export --to sglang`` wrote one) or a draft model; a one-line error for the kinds SGLang has no counterpart of, or
    for a head it would read differently from our loader."""
    from specdraft_eval.drafts.eagle import TOKEN_MAP

    spec = DraftSpec.parse(draft)
    if spec.kind == "eagle":
        where, tree, method = _eagle(spec.arg, "sglang")
        topk, steps = (tree.topk, tree.depth) if tree else (1, num_draft_tokens)
        args = {"speculative-algorithm": "EAGLE3" if method == "eagle3" else "EAGLE",
                "speculative-draft-model-path": where, "speculative-num-steps": steps,
                "speculative-eagle-topk": topk, "speculative-num-draft-tokens": num_draft_tokens + 1}
        token_map = Path(where) / TOKEN_MAP
        return args | ({"speculative-token-map": str(token_map)} if token_map.is_file() else {})
    if spec.kind == MODEL:
        return {"speculative-algorithm": "STANDALONE", "speculative-draft-model-path": spec.arg,
                "speculative-num-steps": num_draft_tokens, "speculative-eagle-topk": 1,
                "speculative-num-draft-tokens": num_draft_tokens + 1}
    raise SpecdecError(f"SGLang has no counterpart of draft {draft!r}: serve an EAGLE head or a draft model there "
                       "(vLLM maps more kinds: speculative_config)")


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
