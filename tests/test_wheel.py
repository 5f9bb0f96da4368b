"""Installed, not only cloned: a wheel installed (not editable) into a fresh environment answers ``zoo recommend``,
``zoo rank --gpu h100`` and ``resolve_auto`` (``draft=auto``) from a temporary directory as the checkout does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest
from support import BIN, ROOT

from specdraft_eval.integration.recommend import FALLBACK_DRAFT

pytestmark = pytest.mark.slow

PROBE = """
import json, sys
from specdraft_eval import load_draft, load_target, published
from specdraft_eval.integration.recommend import resolve_auto
target = load_target("smollm2-135m-instruct")
draft = load_draft(resolve_auto(target).draft, target)
module = __import__("specdraft_eval").__file__
print(json.dumps({"auto": draft.name, "published": str(published.base()), "module": module}))
"""


def _normalised(text: str, base: str) -> str:
    return text.replace(base.rstrip("/") + "/", "")


def _answers(python: Path, scripts: Path, cwd: Path, env: dict) -> dict:
    def run(*args: str) -> str:
        done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, env=env, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout

    probe = json.loads(run(str(python), "-c", PROBE).strip().splitlines()[-1])
    recommend = json.loads(run(str(scripts / "zoo"), "recommend", "--json"))
    rank = json.loads(run(str(scripts / "zoo"), "rank", "--target", "smollm2-135m-instruct", "--gpu", "h100", "--json"))
    base = probe["published"]
    return {"module": probe["module"], "auto": _normalised(probe["auto"], base),
            "recommend": (_normalised(recommend["draft"], base), recommend["num_draft_tokens"],
                          recommend["dynamic_gamma"]),
            "rank": [(r["draft"], r["best_gamma"], r["predicted_tokens_per_second"]) for r in rank["rows"]]}


def test_installed_wheel_answers_like_the_checkout(tmp_path):
    dist = tmp_path / "dist"
    build = subprocess.run([str(BIN / "python"), "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w",
                            str(dist), str(ROOT)], capture_output=True, text=True, timeout=600)
    if build.returncode != 0 and "hatchling" in build.stderr:  # no hatchling in the environment: let pip fetch it
        build = subprocess.run([str(BIN / "python"), "-m", "pip", "wheel", "--no-deps", "-w", str(dist), str(ROOT)],
                               capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-2000:]
    [wheel] = dist.glob("specdraft_eval-*.whl")
    fresh = tmp_path / "env"
    venv.EnvBuilder(with_pip=False).create(fresh)
    python = fresh / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    # the dependencies come from the test environment's site-packages, added as a plain path: its .pth files
    # (the editable install of this checkout among them) are not processed there
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    install = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-compile", "--target",
                              str(site), str(wheel)], capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, install.stderr[-2000:]
    scripts = fresh / "bin"
    (scripts / "zoo").write_text(f"#!{python}\nfrom zoo.cli import app\napp()\n")
    (scripts / "zoo").chmod(0o755)
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    installed = _answers(python, scripts, work, env)
    checkout = _answers(BIN / "python", BIN, work, env)
    assert installed["module"].startswith(str(site)) and not checkout["module"].startswith(str(site))
    # the published fastest configuration, which names a shipped draft (the wheel's copy), not the fallback
    assert installed["auto"] != FALLBACK_DRAFT and "leaderboard/drafts/" in installed["auto"]
    for key in ("auto", "recommend", "rank"):
        assert installed[key] == checkout[key], key
