"""EAGLE-style heads: lossless in every layout we load (greedy identity, batches, static caches, composites), the
published layouts read from tiny checkpoints built here, one-line errors, and `zoo train-head` learning."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from support import SMALL, eagle3_dir, eagle_dir, observed, prompts_file, run_cli, save_tiny, tiny_llama

from specdraft_eval import (
    autoregressive_generate,
    speculative_generate,
    speculative_generate_batch,
)
from specdraft_eval.drafts import load_draft
from specdraft_eval.drafts.eagle import KIND, head_config, new_head
from specdraft_eval.engine import kv_cache
from specdraft_eval.engine.drafter import FINAL
from specdraft_eval.errors import SpecdecError
from specdraft_eval.integration.serving import speculative_config
from specdraft_eval.models.targets import LoadSettings, Target
from zoo.build.train_head import HeadTraining, save_head, train_head

TARGET_LAYERS = 6  # the `target` and `tiny` fixtures' depth

PROMPTS = [[1], [3, 4, 5, 6], list(range(2, 40)), [7, 7, 7, 9, 7, 7]]


def eagle_repo_dir(tmp: Path, target) -> Path:
    """The EAGLE repository's layout: config.json + pytorch_model.bin (fc with bias, layers.0 with the input norm
    EAGLE skips, the embedding), no eagle.json."""
    path = tmp / "eagle-repo"
    path.mkdir()
    head = new_head(target, seed=4)
    state = {k: v for k, v in head.state_dict().items() if not k.startswith(("lm_head.", "rotary_emb."))}
    state["layers.0.input_layernorm.weight"] = torch.ones(target.config.hidden_size)
    state["embed_tokens.weight"] = target.get_input_embeddings().weight.detach().clone()
    torch.save(state, path / "pytorch_model.bin")
    config = head_config(target).to_dict()
    (path / "config.json").write_text(json.dumps({**config, "architectures": ["LlamaForCausalLM"], "bias": True},
                                                 default=str))
    return path


LAYOUTS = {
    "ours": lambda tmp, t: eagle_dir(tmp, t),
    "ours-reduced": lambda tmp, t: eagle_dir(tmp, t, list(range(0, 64, 3))),
    "eagle-repo": eagle_repo_dir,
    "eagle3-speculators": eagle3_dir,
    "eagle3-midlayer": lambda tmp, t: eagle3_dir(tmp, t, midlayer=True),
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_greedy_identity_in_every_layout(tmp_path, target, layout):
    draft = KIND.load(str(LAYOUTS[layout](tmp_path, target)), Target(target, None))
    for prompt in PROMPTS:
        baseline, _ = autoregressive_generate(target, prompt, 40)
        for gamma, static in ((1, False), (4, False), (3, True)):
            out, stats = speculative_generate(target, draft, prompt, 40, num_draft_tokens=gamma, static_cache=static)
            assert out == baseline, (layout, prompt, gamma, static)
            assert stats.draft_tokens > 0 or len(prompt) == 1 and len(baseline) <= 1
    outputs, stats = speculative_generate_batch(target, draft, PROMPTS, 30, num_draft_tokens=3)
    assert outputs == [autoregressive_generate(target, p, 30)[0] for p in PROMPTS]
    assert stats.draft_tokens > 0


def test_the_head_reads_the_targets_features(tmp_path, target):
    """The drafter sees exactly the target's final hidden state at every position it kept, from prefill and from
    each verification (a recording head in place of the real one)."""
    draft = KIND.load(str(eagle_dir(tmp_path, target)), Target(target, None))
    seen = observed(draft)
    prompt = list(range(2, 12))
    out, _ = speculative_generate(target, draft, prompt, 12, num_draft_tokens=2)
    features = torch.cat(seen)
    with torch.inference_mode():
        reference = target(torch.tensor([prompt + out]), output_hidden_states=True).hidden_states[-1][0]
    assert features.shape[0] == len(prompt) + len(out) - 1
    torch.testing.assert_close(features, reference[: features.shape[0]], rtol=1e-4, atol=1e-4)


def test_composite_with_a_head_is_lossless_and_the_head_keeps_up(tmp_path, target):
    """`prompt-lookup|eagle:DIR`: the head observes every step, also those prompt lookup drafted."""
    head = eagle_dir(tmp_path, target)
    draft = load_draft(f"prompt-lookup|eagle:{head}", Target(target, None))
    assert draft.taps == (FINAL,)
    for prompt in PROMPTS:
        out, _ = speculative_generate(target, draft, prompt, 40, num_draft_tokens=3)
        assert out == autoregressive_generate(target, prompt, 40)[0]
    assert all(draft.used), draft.used  # both parts drafted some steps


def test_our_head_directory_parses_as_its_kind(tmp_path, target):
    head = eagle_dir(tmp_path, target)
    assert load_draft(str(head), Target(target, None)).name == f"eagle:{head}"


def test_vllm_mapping(tmp_path, target):
    """Our heads carry an fc bias and a reduced vocabulary vLLM's eagle reader would not read: mapped only once
    exported (`zoo export`), as an absolute path."""
    from zoo.build.export import export_head

    head, head3 = eagle_dir(tmp_path, target), eagle3_dir(tmp_path, target)
    with pytest.raises(SpecdecError, match=r"an fc bias its eagle reader drops.*zoo export"):
        speculative_config(f"eagle:{head}", 4)
    exported = export_head(head, "vllm", tmp_path / "vllm")
    assert speculative_config(f"eagle:{exported.path}", 4) == {"method": "eagle", "model": exported.path,
                                                               "num_speculative_tokens": 4}
    assert speculative_config(f"eagle:{head3}", 3)["method"] == "eagle3"


def _corrupt(tmp: Path, target, what: str) -> Path:
    path = eagle_dir(tmp, target)
    if what == "no weights":
        (path / "model.safetensors").unlink()
    elif what == "no config":
        (path / "config.json").unlink()
    elif what == "speculators eagle":
        (path / "config.json").write_text(json.dumps({"speculators_model_type": "eagle"}))
    elif what == "no fc":
        from safetensors.torch import load_file, save_file

        state = load_file(str(path / "model.safetensors"))
        save_file({k: v for k, v in state.items() if not k.startswith("fc.")}, str(path / "model.safetensors"))
    elif what == "wrong width":
        other = tiny_llama(seed=1, layers=6, hidden=48)
        (path / "model.safetensors").unlink()
        save_head(path, new_head(other), {"target": "other"})
    elif what == "format":
        (path / "eagle.json").write_text(json.dumps({"format": "specdraft-eagle/9"}))
    return path


@pytest.mark.parametrize("what, message", [
    ("no weights", "has no weights"),
    ("no config", "has no config.json"),
    ("speculators eagle", "is not supported (only eagle3)"),
    ("no fc", "lacks fc.weight"),
    ("wrong width", "use a head trained for this target"),
    ("format", "rebuild the head with zoo train-head"),
])
def test_bad_heads_get_one_line_errors(tmp_path, target, what, message):
    with pytest.raises(SpecdecError, match=re.escape(message)) as error:
        KIND.load(str(_corrupt(tmp_path, target, what)), Target(target, None))
    assert "\n" not in str(error.value)


def test_heads_for_another_target_or_tokenizer_are_refused(tmp_path, target):
    head3 = eagle3_dir(tmp_path, target)
    shallow = tiny_llama(seed=0, layers=3)
    with pytest.raises(SpecdecError, match=r"reads layers \[1, 3, 4\], but the target has 3 layers"):
        KIND.load(str(head3), Target(shallow, None))
    head = eagle_dir(tmp_path, target)
    meta = json.loads((head / "eagle.json").read_text())
    (head / "eagle.json").write_text(json.dumps({**meta, "vocab": "0000000000000000"}))
    from support import word_tokenizer

    with pytest.raises(SpecdecError, match="trained for another tokenizer"):
        KIND.load(str(head), Target(target, word_tokenizer(["<unk>", "</s>", *[f"w{i}" for i in range(62)]])))
    with pytest.raises(SpecdecError, match="eagle needs a head"):
        KIND.load(None, Target(target, None))


def test_hub_head_offline_and_uncached_says_how(monkeypatch, tmp_path, target):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    import huggingface_hub.constants as constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(SpecdecError, match="not in the Hugging Face cache and the hub is offline"):
        KIND.load("nobody/EAGLE-nothing", Target(target, None))


def test_train_head_learns_and_resumes(tmp_path, tiny):
    """Training raises the head's agreement with the target well above an untrained head's; an interrupted run
    keeps a checkpoint and the same call resumes from it; the result loads and stays lossless."""
    settings = HeadTraining(str(prompts_file(tmp_path)), steps=300, **SMALL)
    out = tmp_path / "head"
    calls = {"n": 0}

    def interrupt_at_step_50(advance=1, total=None):
        calls["n"] += advance
        if calls["n"] >= 40 + 50:  # 40 prompts continued, then 50 steps
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train_head(str(tiny), out, settings, tick=interrupt_at_step_50)
    work = tmp_path / ".head.train"
    assert torch.load(work / "checkpoint.pt", weights_only=False)["step"] == 50 and not out.exists()
    lines: list[str] = []
    result = train_head(str(tiny), out, settings, log=lines.append)
    assert "resuming at step 50" in lines and not work.exists()
    untrained = HeadTraining(str(prompts_file(tmp_path)), steps=1, **{**SMALL, "lr": 0.0})
    baseline = train_head(str(tiny), tmp_path / "untrained", untrained).record["top1_agreement_by_step"]
    trained = result.record["top1_agreement_by_step"]
    assert trained[0] > baseline[0] + 0.2 and trained[1] > baseline[1] + 0.1, (trained, baseline)
    loaded = LoadSettings().load(str(tiny))
    target = loaded.model
    draft = load_draft(f"eagle:{out}", loaded)
    for prompt in PROMPTS[1:]:
        spec, stats = speculative_generate(target, draft, prompt, 30, num_draft_tokens=4)
        assert spec == autoregressive_generate(target, prompt, 30)[0]


def test_train_head_cli(tmp_path, tiny):
    out = tmp_path / "cli-head"
    done = run_cli("zoo", "train-head", str(tiny), "--out", str(out), "--prompts", str(prompts_file(tmp_path)),
                   "--steps", "5", "--new-tokens", "16", "--vocab-top", "32", "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["draft"] == f"eagle:{out}"
    assert len(json.loads((out / "eagle.json").read_text())["token_ids"]) == 32
    again = run_cli("zoo", "train-head", str(tiny), "--out", str(out))
    assert again.returncode != 0 and again.stderr.strip().splitlines()[-1].startswith("zoo: error: output directory")


def test_rank_shapes_a_head_as_one_layer_with_its_vocabulary(tmp_path, target):
    from specdraft_eval.models.structure import shape_from_config
    from zoo.measure.shapes import draft_shape

    shape = shape_from_config(target.config)
    reduced = draft_shape(f"eagle:{eagle_dir(tmp_path, target, list(range(0, 64, 4)))}", shape)
    assert reduced.shape.layers == 1 and reduced.shape.vocab_size == 16
    full = draft_shape(f"eagle:{eagle3_dir(tmp_path, target)}", shape)
    assert full.shape.vocab_size == 11 and full.shape.parameters > reduced.shape.parameters - 48 * 32


def test_training_features_are_the_teacher_forced_ones(tiny):
    """Features recorded while generating (prefill + each decoding step, left-padded batch) equal one
    teacher-forced pass over the same tokens (up to their float16 storage)."""
    from zoo.build.train_head import generations

    loaded = LoadSettings().load(str(tiny))
    target, tokenizer = loaded.model, loaded.tokenizer
    texts = ["w1 w2 w3", "w5 w6 w7 w8 w9 w10 w11", "w3"]
    sequences, features, generated = generations(target, tokenizer, texts, HeadTraining(new_tokens=12),
                                                  lambda *a, **k: None)
    assert generated > 0 and [len(f) for f in features] == [len(s) for s in sequences]
    for tokens, seen in zip(sequences, features, strict=True):
        with torch.inference_mode():
            reference = target(torch.tensor([tokens]), output_hidden_states=True).hidden_states[-1][0]
        torch.testing.assert_close(seen.float(), reference, rtol=0, atol=3e-3)


def test_text_is_read_teacher_forced_at_the_heads_taps(tmp_path, tiny):
    """--text: files joined by EOS, cut into --context sequences up to --text-tokens, each with the features one
    teacher-forced pass gives at the taps (layer inputs, then the final hidden state); bad settings: one line."""
    from zoo.build.train_head import teacher_forced

    loaded = LoadSettings().load(str(tiny))
    target, tokenizer = loaded.model, loaded.tokenizer
    folder = tmp_path / "text"
    folder.mkdir()
    (folder / "a.py").write_text(" ".join(f"w{i % 60}" for i in range(50)))
    (folder / "b.md").write_text(" ".join(f"w{i % 7}" for i in range(50)))
    (folder / "skip.json").write_text("w1 " * 100)
    settings = HeadTraining(kind="eagle3", text=str(folder), text_tokens=48, context=16)
    taps = settings.taps(6)
    sequences, features = teacher_forced(target, tokenizer, settings, lambda *a, **k: None, taps)
    assert [len(s) for s in sequences] == [16, 16, 16] and features[0].shape == (16, len(taps) * 32)
    with torch.inference_mode():
        states = target(torch.tensor(sequences), output_hidden_states=True).hidden_states
    expected = torch.cat([states[t] for t in taps[:-1]] + [states[-1]], -1)
    torch.testing.assert_close(torch.stack(features).float(), expected, rtol=0, atol=3e-3)
    for bad, message in ((dict(text=str(tmp_path / "none"), text_tokens=10), "no .py/.md/.rst/.txt files"),
                         (dict(text="python"), "go together")):
        with pytest.raises(SpecdecError, match=message):
            HeadTraining(**bad).check() if "text_tokens" not in bad else teacher_forced(
                target, tokenizer, HeadTraining(**bad), lambda *a, **k: None, taps)


def test_profile_times_a_head_fed_as_the_engine_feeds_it(tmp_path, target):
    from specdraft_eval.drafts.prompt_lookup import PromptLookupDrafter
    from zoo.measure.timing import engine_latency

    head = KIND.load(str(eagle_dir(tmp_path, target)), Target(target, None))
    verify, drafts = engine_latency(target, [head, PromptLookupDrafter()], [1, 3], [list(range(2, 20))], 3)
    assert drafts[head.name].t_draft.median > 0 and set(verify) == {0, 1, 2, 3}


def test_train_head_kind_eagle3_learns_in_speculators_layout(tmp_path):
    """`zoo train-head --kind eagle3`: three unrolled steps (the later ones on its own features) raise agreement with
    the target above an untrained head's at every step; the head is written in speculators' layout, loads under
    the strict loader, drafts losslessly, and maps to vLLM as it is (no export needed)."""
    tiny = save_tiny(tmp_path / "tiny8", layers=8)
    settings = HeadTraining(str(prompts_file(tmp_path)), steps=300, kind="eagle3", **SMALL)
    result = train_head(str(tiny), tmp_path / "head3", settings)
    untrained = train_head(str(tiny), tmp_path / "untrained3", HeadTraining(
        str(prompts_file(tmp_path)), steps=1, kind="eagle3", **{**SMALL, "lr": 0.0}))
    trained, baseline = result.record["top1_agreement_by_step"], untrained.record["top1_agreement_by_step"]
    assert len(trained) == 3 and all(t > b + 0.05 for t, b in zip(trained, baseline)), (trained, baseline)
    config = json.loads((tmp_path / "head3" / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3" and config["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 3
    assert speculative_config(f"eagle:{tmp_path / 'head3'}", 3)["method"] == "eagle3"
    loaded = LoadSettings().load(str(tiny))
    draft = load_draft(result.draft, loaded)
    assert draft.taps == (2, 4, 5)
    for prompt in PROMPTS[1:]:
        assert speculative_generate(loaded.model, draft, prompt, 30, num_draft_tokens=4)[0] == \
            autoregressive_generate(loaded.model, prompt, 30)[0]


@pytest.mark.parametrize("masked", [True, False])
def test_eagle3_training_unrolls_what_the_drafter_computes(monkeypatch, masked):
    """The training-time test: each unrolled step's hidden state at index t equals, to float precision, the one the
    drafter computes at that depth after the target's features up to t (same attention, positions and inputs).
    Negative control: later steps that also see their own step's earlier keys (plain causal unrolling) differ."""
    import zoo.build.train_head as training
    from specdraft_eval.drafts.eagle import EagleDrafter, new_eagle3_head
    from specdraft_eval.engine.sampling import Sampler

    target = tiny_llama(seed=3, layers=6)
    head = new_eagle3_head(target, seed=4).float()
    with torch.no_grad():
        for p in head.parameters():  # away from the init, where later steps barely differ
            p.add_(0.05 * torch.randn_like(p))
    if not masked:
        monkeypatch.setattr(training, "unrolled_mask", lambda width, step, device, dtype: kv_cache.additive(torch.cat(
            [torch.ones(width - step, width - j, dtype=torch.bool).tril() for j in range(1, step + 1)], 1)[None],
            dtype))
    taps, embed = list(head.taps), target.get_input_embeddings()
    for prompt in ([5, 9, 2, 7], [5, 9, 2, 7, 7, 3, 11], list(range(10, 40, 3))):
        drafter = EagleDrafter(head, target, "t", None)
        with torch.no_grad():
            states = target(torch.tensor([prompt]), output_hidden_states=True).hidden_states
        drafter.observe(torch.cat([states[t][0, :-1] for t in taps], -1))
        seen: list[torch.Tensor] = []
        logits = head.logits
        monkeypatch.setattr(head, "logits", lambda hidden: (seen.append(hidden.reshape(-1)), logits(hidden))[1])
        with torch.no_grad():
            tokens = prompt + drafter.propose(prompt, 3, Sampler()).tokens  # training feeds the drafted tokens
            states = target(torch.tensor([tokens]), output_hidden_states=True).hidden_states
            feats = torch.cat([states[t] for t in taps], -1)[:, :-1]  # [1, W - 1, 3H]
            steps = list(training.unrolled(head, embed, torch.tensor([tokens]), feats, 3))
        monkeypatch.setattr(head, "logits", logits)
        close = [torch.allclose(seen[i], steps[i][0, len(prompt) - 2], atol=1e-5) for i in range(3)]
        assert close[0] and (all(close) if masked else not any(close[1:])), close
