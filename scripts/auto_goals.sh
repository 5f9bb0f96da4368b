#!/usr/bin/env bash
# Issue 52's goals on this machine, each from an empty results store (figures under benchmarks/auto_tuning/):
#   tune    `zoo tune` on HumanEval's held-in documents, then every contender measured on the leaderboard's first 20
#           documents (the exhaustive check of the choice); the README's quick start's `auto` afterwards
#   unknown `draft=auto` on the embedded default loaded from a directory under another name (the board does not know
#           it): tuning inside a 40-document HumanEval run at batch 1, 4 and 8, the tuned configuration at batch 1
#           beside it, and `--model hf`'s outputs to compare with
# Usage: scripts/auto_goals.sh tune|unknown   (each under 30 minutes on the 2-core VM; run one at a time;
#        BATCHES="1" HF=0 scripts/auto_goals.sh unknown: batch 1 only, --model hf's run kept from before)
set -euo pipefail
cd "$(dirname "$0")/.."
out=benchmarks/auto_tuning
mkdir -p "$out"
bin=.venv/bin
tasks=(--include_path tasks --tasks specdec_humaneval --confirm_run_unsafe_code)
case "${1:-}" in
  tune)
    export SPECDRAFT_EVAL_STORE=$(mktemp -d)
    /usr/bin/time -f "%e s" -o "$out/tune_seconds.txt" $bin/zoo tune --target smollm2-135m-instruct \
      --task specdec_humaneval --evaluate 20 --plot "$out/tune.png" --json > "$out/tune.json"
    $bin/zoo recommend --target smollm2-135m-instruct --json > "$out/recommend_after_tune.json"
    $bin/zoo results --json > "$out/store_after_tune.json"
    ;;
  unknown)
    mkdir -p "$out/identity"
    dir=$($bin/python -c "from specdraft_eval.models.targets import local_dir, resolve
print(local_dir(resolve('smollm2-135m-instruct')).path)")
    unknown=$(mktemp -d)/my-local-model
    mkdir -p "$unknown" && ln -s "$dir"/* "$unknown"/
    for batch in ${BATCHES:-1 4 8}; do
      export SPECDRAFT_EVAL_STORE=$(mktemp -d)
      $bin/lm_eval --model specdec --model_args "pretrained=$unknown,draft=auto,baseline=true" "${tasks[@]}" \
        --limit 40 --batch_size $batch --log_samples --output_path "$out/unknown_auto_b$batch" > "$out/unknown_auto_b$batch.log" 2>&1
    done
    # the configuration `tune` chose (run `tune` first), on the same documents
    read -r chosen gamma < <($bin/python -c "import json; c = json.load(open('$out/tune.json'))['chosen']
print(c['draft'], c['num_draft_tokens'])")
    if [ -n "$chosen" ]; then
      export SPECDRAFT_EVAL_STORE=$(mktemp -d)
      $bin/lm_eval --model specdec \
        --model_args "pretrained=$unknown,draft=$chosen,num_draft_tokens=$gamma,dynamic_gamma=true,baseline=true" \
        "${tasks[@]}" --limit 40 --output_path "$out/unknown_tuned_b1" > "$out/unknown_tuned_b1.log" 2>&1
    fi
    if [ "${HF:-1}" = 1 ]; then
      $bin/lm_eval --model hf --model_args "pretrained=$unknown" "${tasks[@]}" --limit 40 --log_samples \
        --output_path "$out/unknown_hf" > "$out/unknown_hf.log" 2>&1
    fi
    for batch in ${BATCHES:-1 4 8}; do  # outputs equal --model hf's, document by document
      $bin/python scripts/compare_samples.py "$out/unknown_auto_b$batch" "$out/unknown_hf" > "$out/identity/b$batch.json" || true
    done
    ;;
  *) echo "usage: $0 tune|unknown" >&2; exit 2 ;;
esac
