"""Repeatable measurements (issue 62's goals), on this machine with the embedded default target:

1. ``zoo bench --drafts suffix --repeats 3``: each repeat's TAR (every repeat starts from a fresh draft, so a suffix
   cache never holds an earlier repeat's answers): ``bench_suffix.json``.
2. ``lm_eval --model specdec ... seed=1234`` on ``specdec_humaneval_sampled`` (``repeats: 4``, temperature 0.8) for
   prompt lookup and the shipped EAGLE head: the distinct samples per document, a rerun, and batch 1 against
   batch 4: ``seeded_repeats.json``.

Beside them, plain sampling of the same documents by lm-eval's own ``--model hf`` (its seed, 1234), for how many of a
document's 4 samples differ when nothing speculates (a sample that starts with a stop sequence is the empty answer).

Run from the repository root: ``.venv/bin/python benchmarks/repeatability/measure.py [bench|seeded]`` (both: about
25 minutes on 2 cores). The results store is a temporary one: these runs do not feed ``draft=auto``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).parent
BIN = Path(sys.executable).parent
DRAFTS = {"prompt-lookup": "prompt-lookup", "eagle": "eagle:leaderboard/drafts/smollm2-eagle"}
DOCUMENTS = 3


def run(*args: str, env: dict) -> str:
    done = subprocess.run([str(BIN / args[0]), *args[1:]], capture_output=True, text=True, env=env, check=False)
    if done.returncode:
        raise SystemExit(f"{' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return done.stdout


def samples(draft: str | None, batch_size: int, env: dict, workdir: Path) -> list[list[str]]:
    """Each document's 4 sampled answers (``draft`` None: lm-eval's ``--model hf``, plain sampling)."""
    out = workdir / f"{(draft or 'hf').split(':')[0]}-{batch_size}-{len(list(workdir.iterdir()))}"
    if draft is None:
        from specdraft_eval.models.targets import local_dir, resolve

        model = ("hf", f"pretrained={local_dir(resolve('smollm2-135m-instruct')).path}")
    else:
        model = ("specdec", f"pretrained=smollm2-135m-instruct,draft={draft},num_draft_tokens=4,seed=1234")
    run("lm_eval", "--model", model[0], "--model_args", model[1], "--include_path", "tasks",
        "--tasks", "specdec_humaneval_sampled", "--limit", str(DOCUMENTS), "--gen_kwargs", "max_gen_toks=48",
        "--batch_size", str(batch_size), "--confirm_run_unsafe_code", "--log_samples", "--output_path", str(out),
        env=env)
    [file] = out.rglob("samples_specdec_humaneval_sampled_*.jsonl")
    docs = sorted((json.loads(line) for line in file.read_text().splitlines()), key=lambda d: d["doc_id"])
    return [list(doc["resps"][0]) for doc in docs]


def main(parts: list[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "SPECDRAFT_EVAL_STORE": str(Path(tmp) / "store"), "TOKENIZERS_PARALLELISM": "false"}
        if "bench" in parts:
            bench = json.loads(run("zoo", "bench", "--drafts", "suffix", "--repeats", "3", "--limit", "4",
                                   "--max-new-tokens", "96", "--json", env=env))
            (HERE / "bench_suffix.json").write_text(json.dumps(bench, indent=1) + "\n")
            for row in bench["configs"]:
                if row.get("draft") == "suffix":
                    print(row["engine"], "TAR by repeat", row.get("tar_by_repeat"))
        if "seeded" in parts:
            seeded(env, Path(tmp))


def seeded(env: dict, tmp: Path) -> None:
    """The seeded-repeats part (2.), with plain sampling beside it."""
    found = {}
    work = tmp / "runs"
    work.mkdir()
    plain = samples(None, 1, env, work)
    for name, draft in DRAFTS.items():
        one, four, again = (samples(draft, 1, env, work), samples(draft, 4, env, work),
                            samples(draft, 4, env, work))
        found[name] = {"draft": draft, "distinct_per_document": [len(set(s)) for s in one],
                       "batch_4_equals_batch_1": four == one, "rerun_equals": again == four,
                       "first_document_samples": one[0]}
    summary = {"plain_sampling_distinct_per_document": [len(set(s)) for s in plain],
               "plain_command": "lm_eval --model hf --model_args pretrained=SMOLLM2_DIR --include_path tasks "
                                f"--tasks specdec_humaneval_sampled --limit {DOCUMENTS} --gen_kwargs "
                                "max_gen_toks=48 --confirm_run_unsafe_code --log_samples",
               "command": "lm_eval --model specdec --model_args pretrained=smollm2-135m-instruct,draft=DRAFT,"
                          "num_draft_tokens=4,seed=1234 --include_path tasks --tasks specdec_humaneval_sampled "
                          f"--limit {DOCUMENTS} --gen_kwargs max_gen_toks=48 --batch_size 1|4 "
                          "--confirm_run_unsafe_code --log_samples", "drafts": found}
    (HERE / "seeded_repeats.json").write_text(json.dumps(summary, indent=1, ensure_ascii=False) + "\n")
    print("plain", summary["plain_sampling_distinct_per_document"])
    for name, figures in found.items():
        print(name, {k: v for k, v in figures.items() if k != "first_document_samples"})


if __name__ == "__main__":
    main(sys.argv[1:] or ["bench", "seeded"])
