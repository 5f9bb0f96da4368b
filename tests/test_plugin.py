"""A drafter plugin written from the docs alone: the example in docs/kinds.md is extracted from it, installed as a
distribution with an entry point in the ``specdraft_eval.drafts`` group, and run by the Python API and by the stock
``lm_eval --model specdec``."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support import ROOT, run_cli, save_tiny

KIND = "repeat-last"


def install_readme_plugin(site: Path) -> Path:
    """Write docs/kinds.md's plugin module and a ``.dist-info`` declaring its entry point into ``site``."""
    readme = (ROOT / "docs" / "kinds.md").read_text()
    found = re.search(r"<!-- plugin example: (\w+)\.py -->\s*```python\n(.*?)```", readme, re.S)
    assert found, "docs/kinds.md lost its plugin example"
    module, code = found.groups()
    site.mkdir(parents=True, exist_ok=True)
    (site / f"{module}.py").write_text(code)
    info = site / f"{module}-0.1.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 0.1\n")
    kind, target = re.search(r'\[project\.entry-points\."specdraft_eval\.drafts"\]\n(\S+) = "(.+?)"\n', readme).groups()
    (info / "entry_points.txt").write_text(f"[specdraft_eval.drafts]\n{kind} = {target}\n")  # pip writes TOML's as INI
    return site


def test_readme_plugin_drafts_losslessly_through_the_api(tmp_path):
    site = install_readme_plugin(tmp_path / "site")
    tiny = save_tiny(tmp_path / "tiny")
    code = (
        "from specdraft_eval import load_target, load_draft, speculative_generate, autoregressive_generate\n"
        "from specdraft_eval.drafts.spec import draft_kinds\n"
        f"assert {KIND!r} in draft_kinds()\n"
        f"target = load_target({str(tiny)!r})\n"
        f"draft = load_draft({KIND!r}, target)\n"
        "spec, stats = speculative_generate(target.model, draft, [3, 4, 5, 5, 5], 24, num_draft_tokens=3)\n"
        "plain, _ = autoregressive_generate(target.model, [3, 4, 5, 5, 5], 24)\n"
        "assert spec == plain, (spec, plain)\n"
        "print(draft.name, stats.steps, stats.draft_tokens)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(site), "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    name, steps, drafted = done.stdout.split()
    assert name == KIND and int(drafted) > 0 and int(steps) < 24


@pytest.mark.slow
def test_readme_plugin_runs_under_lm_eval(tmp_path):
    site = install_readme_plugin(tmp_path / "site")
    done = run_cli("lm_eval", "--model", "specdec", "--model_args",
                   f"pretrained=smollm2-135m-instruct,draft={KIND},num_draft_tokens=2,baseline=true",
                   "--include_path", "tasks", "--tasks", "specdec_humaneval", "--limit", "2",
                   "--gen_kwargs", "max_gen_toks=24", "--confirm_run_unsafe_code", "--output_path",
                   str(tmp_path / "out"),
                   env={"PYTHONPATH": str(site), "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    block = json.loads(next((tmp_path / "out").rglob("results_*.json")).read_text())["config"]["specdec"]
    assert block["draft"] == KIND and block["draft_tokens"] > 0 and block["baseline_mismatches"] == 0


def test_a_plugin_declaring_a_bare_build_function_is_refused_in_one_line(tmp_path):
    """The old protocol (a ``build(arg, target)`` function as the entry point) is named, with the fix."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "old_kinds.py").write_text("def build(arg, target):\n    return None\n")
    info = site / "old_kinds-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: old_kinds\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[specdraft_eval.drafts]\nold = old_kinds:build\n")
    code = ("from specdraft_eval.drafts.spec import DraftSpec\nfrom specdraft_eval.errors import SpecdecError\n"
            "try:\n    DraftSpec.parse('prompt-lookup')\nexcept SpecdecError as exc:\n    print(exc)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(site)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == ("draft kind entry point old = old_kinds:build is not a DraftKind named 'old': "
                                   "point it at an instance of a DraftKind subclass")
