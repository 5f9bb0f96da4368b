#!/usr/bin/env bash
# Rebuild the published leaderboard for smollm2-135m-instruct on this machine's CPU: build the drafts, run
# lm_eval --model specdec for each configuration on both offline tasks (greedy, baseline timing on, the tasks'
# own 256-token budgets, the first HE_LIMIT HumanEval and MMLU_LIMIT MMLU-CoT documents: held out from every
# draft's build data), the distilled draft's own accuracy, each model draft's own bits per byte on the same
# documents (lm_NAME: the tasks' _lm variants scored with score=draft), then regenerate the pages.
# Usage: leaderboard/reproduce.sh all | NAME ...
#   all: the published board, in one sitting on one machine (its rows: the `order` list below; 1 h 35 min on the
#   2-core Intel Xeon VM, run as five background jobs of at most 30 minutes); NAME: one configuration, the published
#   ones or the extra ones (the pruned drafts: they are built first, 8 minutes each).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=.venv/bin
drafts=leaderboard/drafts
HE_LIMIT=${HE_LIMIT:-20}; MMLU_LIMIT=${MMLU_LIMIT:-8}
target=pretrained=smollm2-135m-instruct,baseline=true
declare -A configs=(
  [prompt-lookup]="$target,draft=prompt-lookup,num_draft_tokens=4"
  [prompt-lookup_ngram]="$target,draft=prompt-lookup:2-3|$drafts/smollm2-ngram,num_draft_tokens=4"
  [ngram]="$target,draft=$drafts/smollm2-ngram,num_draft_tokens=4"  # the n-gram draft alone
  [layers_0-4]="$target,draft=layers:0-4,dynamic_gamma=true"
  [layers_0-1]="$target,draft=layers:0-1,dynamic_gamma=true"  # layer views: first k at 2, 5, 10 layers ...
  [layers_0-9]="$target,draft=layers:0-9,dynamic_gamma=true"
  [layers_0-19]="$target,draft=layers:0-19,num_draft_tokens=4"  # deeper views, fixed γ: TAR against LM quality
  [layers_0-24]="$target,draft=layers:0-24,num_draft_tokens=4"
  [layers_uniform-2]="$target,draft=layers:0+29,dynamic_gamma=true"  # ... and spread uniformly over the 30
  [layers_uniform-5]="$target,draft=layers:0+7+14+22+29,dynamic_gamma=true"
  [layers_uniform-10]="$target,draft=layers:0+3+6+9+13+16+19+22+26+29,dynamic_gamma=true"
  [layers_bi-10]="$target,draft=layers:0-1+8+20-24+28-29,dynamic_gamma=true"  # the 10 block influence keeps (at 2:
  # 0+29, the same as uniform-2; at 5: smollm2-5l-bi below)
  [smollm2-5l-distilled]="$target,draft=$drafts/smollm2-5l-distilled,dynamic_gamma=true"
  [smollm2-10l-distilled]="$target,draft=$drafts/smollm2-10l-distilled,dynamic_gamma=true"
  [smollm2-5l-distilled_fixed]="$target,draft=$drafts/smollm2-5l-distilled,num_draft_tokens=4"  # fixed γ: the
  [smollm2-10l-distilled_fixed]="$target,draft=$drafts/smollm2-10l-distilled,num_draft_tokens=4"  # drafts' own TAR
  [smollm2-5l-bi]="$target,draft=$drafts/smollm2-5l-bi,dynamic_gamma=true"  # block influence, not distilled
  [smollm2-5l-bi-v4096]="$target,draft=$drafts/smollm2-5l-bi-v4096,dynamic_gamma=true"  # + a 4096-token head
  [eagle]="$target,draft=eagle:$drafts/smollm2-eagle,num_draft_tokens=4"
  [prompt-lookup_eagle]="$target,draft=prompt-lookup:2-3|eagle:$drafts/smollm2-eagle,num_draft_tokens=4"
  [prompt-lookup_eagle_dynamic]="$target,draft=prompt-lookup:2-3|eagle:$drafts/smollm2-eagle,num_draft_tokens=4,dynamic_gamma=true"
  [prompt-lookup-tree]="$target,draft=prompt-lookup:3x3,num_draft_tokens=8"  # token trees: γ is the node budget
  [suffix]="$target,draft=suffix,num_draft_tokens=24"  # vLLM's method: suffix at its defaults (γ = max_tree_depth)
  [suffix_16]="$target,draft=suffix,num_draft_tokens=16"
  [suffix-tree]="$target,draft=suffix:tree,num_draft_tokens=16"  # ArcticInference's token tree (use_tree_spec)
  [suffix-ngram]="$target,draft=suffix:$drafts/smollm2-ngram,num_draft_tokens=16"  # warm: the n-gram draft's data
  [suffix-ngram-f2]="$target,draft=suffix:$drafts/smollm2-ngram?max_spec_factor=2,num_draft_tokens=16"  # drafts up
  # to twice the match (chosen on HumanEval's tuning documents 20-27: benchmarks/suffix)
  [eagle-tree]="$target,draft=eagle:$drafts/smollm2-eagle@2x4,num_draft_tokens=6"  # EAGLE-2: top-2, 4 deep
  [eagle-tree-large]="$target,draft=eagle:$drafts/smollm2-eagle@8x6,num_draft_tokens=24"  # the head's accepted length
  [eagle-tree-xl]="$target,draft=eagle:$drafts/smollm2-eagle@12x7,num_draft_tokens=48"
  [eagle3]="$target,draft=eagle:$drafts/smollm2-eagle3,num_draft_tokens=4"  # EAGLE-3 (scripts/train_eagle3.sh)
  [eagle3-tree]="$target,draft=eagle:$drafts/smollm2-eagle3@8x6,num_draft_tokens=24"
  [suffix-ngram_eagle-tree]="$target,draft=suffix:$drafts/smollm2-ngram|eagle:$drafts/smollm2-eagle@2x4,num_draft_tokens=8"
  [suffix_eagle-tree]="$target,draft=suffix|eagle:$drafts/smollm2-eagle@2x4,num_draft_tokens=8"
  # ArcticInference's hybrid: suffix where its draft's score reaches min_score, else the head's tree
  [suffix-s1_eagle-tree]="$target,draft=suffix?min_score=1|eagle:$drafts/smollm2-eagle@2x4,num_draft_tokens=8"
  [suffix-s3_eagle-tree]="$target,draft=suffix?min_score=3|eagle:$drafts/smollm2-eagle@2x4,num_draft_tokens=8"
  [prompt-lookup_eagle-tree]="$target,draft=prompt-lookup:2-3|eagle:$drafts/smollm2-eagle@2x4,num_draft_tokens=6"
  # vLLM (engine=vllm: .venv-vllm) on the same documents, speedup over vLLM's plain decoding of the same requests
  [vllm_prompt-lookup]="$target,engine=vllm,draft=prompt-lookup,num_draft_tokens=4"
  [vllm_suffix]="$target,engine=vllm,draft=suffix,num_draft_tokens=24"
  [vllm_eagle]="$target,engine=vllm,draft=eagle:$drafts/smollm2-eagle-vllm,num_draft_tokens=4"  # zoo export's
  [vllm_eagle3]="$target,engine=vllm,draft=eagle:$drafts/smollm2-eagle3,num_draft_tokens=4"  # as shipped
  [vllm_layers_0-4]="$target,engine=vllm,draft=$drafts/smollm2-layers-0-4,num_draft_tokens=4"  # layers:0-4's
  # weights as a draft model (zoo prune --keep 0-4, not distilled)
  [as-target_smollm2-5l-distilled]="pretrained=$drafts/smollm2-5l-distilled,draft=prompt-lookup"  # its accuracy
  [auto]="$target,draft=auto"  # last: resolves from the runs above
  [lm_target]="pretrained=smollm2-135m-instruct"  # the target's own bits per byte
)
models=(layers_0-1 layers_0-4 layers_0-9 layers_0-19 layers_0-24 layers_uniform-2 layers_uniform-5 layers_uniform-10
        layers_bi-10 smollm2-5l-distilled smollm2-10l-distilled smollm2-5l-bi)
for m in "${models[@]}"; do  # lm_NAME: NAME's draft model scored on its own (score=draft)
  d=${configs[$m]#*draft=}; configs[lm_$m]="pretrained=smollm2-135m-instruct,draft=${d%%,*},score=draft"
done
configs[sweep]="zoo profile --sweep"  # latency by depth and width on this machine (random weights)
order=(prompt-lookup prompt-lookup_ngram ngram prompt-lookup-tree suffix suffix_16 suffix-tree suffix-ngram suffix-ngram-f2
       eagle prompt-lookup_eagle prompt-lookup_eagle_dynamic eagle-tree eagle-tree-large eagle3
       eagle-tree-xl eagle3-tree suffix-ngram_eagle-tree suffix_eagle-tree suffix-s1_eagle-tree suffix-s3_eagle-tree
       prompt-lookup_eagle-tree layers_0-1 layers_0-4
       layers_0-9 layers_uniform-2 layers_uniform-5 auto
       lm_target lm_layers_0-1 lm_layers_0-4 lm_layers_0-9 lm_layers_uniform-2 lm_layers_uniform-5
       vllm_prompt-lookup vllm_suffix vllm_eagle vllm_eagle3 vllm_layers_0-4)  # published
extra=(layers_0-19 layers_0-24 layers_uniform-10 layers_bi-10 smollm2-5l-distilled smollm2-10l-distilled
       smollm2-5l-distilled_fixed smollm2-10l-distilled_fixed smollm2-5l-bi smollm2-5l-bi-v4096
       as-target_smollm2-5l-distilled lm_layers_0-19 lm_layers_0-24 lm_layers_uniform-10 lm_layers_bi-10
       lm_smollm2-5l-distilled lm_smollm2-10l-distilled lm_smollm2-5l-bi sweep)  # by name
[ $# -gt 0 ] || { echo "usage: leaderboard/reproduce.sh all | NAME ... (NAME: ${order[*]} ${extra[*]})" >&2; exit 2; }
if [ "$1" = all ]; then names=("${order[@]}"); else names=("$@"); fi
wants() { for n in "${names[@]}"; do [[ "${configs[$n]:-}" == *"$1"* ]] && return 0; done; return 1; }  # a draft the runs need
if wants smollm2-5l-distilled && [ ! -d $drafts/smollm2-5l-distilled ]; then  # 8 minutes here
  $bin/zoo prune smollm2-135m-instruct --layers 5 --distill-tokens 65536 --out $drafts/smollm2-5l-distilled
fi
if wants smollm2-10l-distilled && [ ! -d $drafts/smollm2-10l-distilled ]; then
  $bin/zoo prune smollm2-135m-instruct --layers 10 --distill-tokens 98304 --out $drafts/smollm2-10l-distilled
fi
for vocab in "" 4096; do  # the 5 layers block influence keeps, undistilled, with the full or a reduced head
  dir=$drafts/smollm2-5l-bi${vocab:+-v$vocab}
  if wants "$dir" && [ ! -d "$dir" ]; then
    $bin/zoo prune smollm2-135m-instruct --layers 5 --select block-influence ${vocab:+--vocab-top $vocab} --out "$dir"
  fi
done
if wants smollm2-ngram && [ ! -d $drafts/smollm2-ngram ]; then  # shipped in git
  $bin/zoo ngram smollm2-135m-instruct --out $drafts/smollm2-ngram
fi
if wants smollm2-eagle && [ ! -d $drafts/smollm2-eagle ]; then  # shipped in git
  $bin/zoo train-head smollm2-135m-instruct --out $drafts/smollm2-eagle
fi
if wants smollm2-eagle3 && [ ! -d $drafts/smollm2-eagle3 ]; then  # shipped in git; 45 minutes here
  $bin/zoo train-head smollm2-135m-instruct --kind eagle3 --unroll 4 --max-prompts 120 --text python \
    --text-tokens 200000 --steps 1000 --out $drafts/smollm2-eagle3
fi
if wants smollm2-eagle-vllm && [ ! -d $drafts/smollm2-eagle-vllm ]; then  # the EAGLE-1 head as vLLM reads it
  $bin/zoo export $drafts/smollm2-eagle --to vllm --out $drafts/smollm2-eagle-vllm
fi
if wants smollm2-layers-0-4 && [ ! -d $drafts/smollm2-layers-0-4 ]; then
  $bin/zoo prune smollm2-135m-instruct --keep 0-4 --out $drafts/smollm2-layers-0-4
fi
if [[ " ${names[*]} " == *" vllm_"* ]]; then bash scripts/setup_vllm.sh; fi
for name in "${names[@]}"; do
  [ -n "${configs[$name]:-}" ] || { echo "reproduce.sh: unknown configuration $name: use all or one of ${order[*]} ${extra[*]}" >&2; exit 2; }
  if [ "$name" = sweep ]; then
    $bin/zoo profile --sweep --repeats 5 --out leaderboard/results/sweeps/sweep_cpu.json
    continue
  fi
  suffix=; [[ $name == lm_* ]] && suffix=_lm  # scoring runs: the tasks' log-likelihood variants
  for task in specdec_humaneval$suffix:$HE_LIMIT specdec_mmlu_cot$suffix:$MMLU_LIMIT; do
    $bin/lm_eval --model specdec --model_args "${configs[$name]}" --include_path tasks --tasks "${task%%:*}" \
      --limit "${task##*:}" --confirm_run_unsafe_code --output_path "leaderboard/results/$name/${task%%:*}"
  done
done
$bin/zoo leaderboard leaderboard/results --out leaderboard
