"""The code's shape: imports only down the layers and no cycle (with a negative control), every package's docstring,
one draft-spec parser, a request object, ranking of every published record."""

from __future__ import annotations

import ast
import inspect
import json
from pathlib import Path

import pytest
from support import run_cli

from specdraft_eval import published
from specdraft_eval.drafts.spec import COMPOSITE, MODEL, DraftSpec, draft_kinds
from specdraft_eval.engine import loop as engine
from specdraft_eval.engine.params import DecodeParams
from specdraft_eval.errors import SpecdecError
from specdraft_eval.results.record import scan_results

ROOT = Path(__file__).resolve().parents[1]


def _imports(path: Path, package: str) -> set[str]:
    """Modules of ``package`` that ``path`` imports anywhere (functions included)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        found |= {n for n in names if n.split(".")[0] == package}
    return found


LAYERS = (
    ("specdraft_eval", "specdraft_eval.errors", "specdraft_eval.files", "specdraft_eval.published"),
    ("specdraft_eval.measure",),
    ("specdraft_eval.results",),
    ("specdraft_eval.models",),
    ("specdraft_eval.engine",),
    ("specdraft_eval.drafts",),
    ("specdraft_eval.integration",),
    ("zoo",),
)
"""The layers, bottom first (ARCHITECTURE.md): a module imports only modules of its own layer or below."""


def _graph(root: Path, packages: tuple[str, ...]) -> dict[str, set[str]]:
    """Module -> the modules of ``packages`` under ``root`` that it imports (itself excluded)."""
    modules = {}
    for package in packages:
        for path in (root / package).rglob("*.py"):
            name = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
            modules[name] = path
    return {name: {m for package in packages for m in _imports(path, package) if m in modules and m != name}
            for name, path in modules.items()}


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path that starts and ends at the same module, or None."""
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return trail[trail.index(nxt):] + [node, nxt] if nxt in trail else [node, nxt]
            if nxt not in state and (found := visit(nxt, trail + [node])):
                return found
        state[node] = 2
        return None

    return next((found for name in sorted(graph) if name not in state and (found := visit(name, []))), None)


def _layer(module: str, layers: tuple[tuple[str, ...], ...]) -> int:
    """The index of the most specific layer prefix that ``module`` falls under."""
    best, best_length = None, -1
    for index, prefixes in enumerate(layers):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best_length:
                best, best_length = index, len(prefix)
    assert best is not None, f"{module} is in no layer: add it to LAYERS and ARCHITECTURE.md"
    return best


def _upward(graph: dict[str, set[str]], layers: tuple[tuple[str, ...], ...]) -> list[str]:
    """Every import of a module from a layer above the importer's."""
    return sorted(f"{a} -> {b}" for a, targets in graph.items() for b in targets
                  if _layer(b, layers) > _layer(a, layers))


def test_no_import_cycle():
    assert _find_cycle(_graph(ROOT, ("specdraft_eval", "zoo"))) is None


def test_imports_only_go_down_the_layers():
    graph = _graph(ROOT, ("specdraft_eval", "zoo"))
    assert not _upward(graph, LAYERS)
    assert {_layer(m, LAYERS) for m in graph} == set(range(len(LAYERS)))  # every layer holds modules


def test_each_package_says_its_job():
    for init in (ROOT / "specdraft_eval").rglob("__init__.py"):
        assert ast.get_docstring(ast.parse(init.read_text())), f"{init} has no docstring"


def test_the_checks_catch_a_cycle_and_an_upward_import(tmp_path):
    """Negative control: a synthetic package with a cycle and an import from a higher layer is reported."""
    (tmp_path / "pkg" / "low").mkdir(parents=True)
    (tmp_path / "pkg" / "high").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "low" / "a.py").write_text("from pkg.low import b\nfrom pkg.high import c\n")
    (tmp_path / "pkg" / "low" / "b.py").write_text("import pkg.low.a\n")
    (tmp_path / "pkg" / "high" / "c.py").write_text("import os\n")
    graph = _graph(tmp_path, ("pkg",))
    assert _find_cycle(graph) in (["pkg.low.a", "pkg.low.b", "pkg.low.a"], ["pkg.low.b", "pkg.low.a", "pkg.low.b"])
    layers = (("pkg", "pkg.low"), ("pkg.high",))
    assert _upward(graph, layers) == ["pkg.low.a -> pkg.high.c"]
    graph["pkg.low.a"] -= {"pkg.high.c", "pkg.low.b"}
    assert _find_cycle(graph) is None and not _upward(graph, layers)


def test_engine_entry_points_take_at_most_four_positional_parameters():
    for fn in (engine.speculative_generate, engine.speculative_generate_batch, engine.autoregressive_generate,
               engine.autoregressive_generate_batch):
        positional = [p for p in inspect.signature(fn).parameters.values()
                      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        assert len(positional) <= 4, fn.__name__


def test_request_and_run_settings_one_line_errors_and_keywords():
    from specdraft_eval.engine.params import GammaPolicy, RunSettings

    with pytest.raises(SpecdecError, match="num_draft_tokens must be an integer >= 1"):
        GammaPolicy(0)
    with pytest.raises(SpecdecError, match="top_p must be in"):
        DecodeParams(8, top_p=0.0)
    with pytest.raises(SpecdecError, match="a run takes num_draft_tokens"):
        DecodeParams.of(8, gamma=3)
    params = DecodeParams(8, seed=3)
    assert DecodeParams.of(params) is params and DecodeParams.of(8, seed=3) == params
    settings = {"num_draft_tokens": 3, "dynamic_gamma": True, "compile": True, "seed": 3}
    run = RunSettings.of(None, settings)  # the run's keywords taken out, the request's left
    assert run == RunSettings(GammaPolicy(3, True), static_cache=True, compile=True) and settings == {"seed": 3}
    assert run.gamma.max_num_draft_tokens == 12 and GammaPolicy(3).max_num_draft_tokens == 3


@pytest.mark.parametrize("text, kind, arg, parts", [
    ("prompt-lookup", "prompt-lookup", None, 0),
    ("prompt-lookup:2-3", "prompt-lookup", "2-3", 0),
    ("layers:0-3+29", "layers", "0-3+29", 0),
    ("ngram:some/dir", "ngram", "some/dir", 0),
    ("HuggingFaceTB/SmolLM2-135M", MODEL, "HuggingFaceTB/SmolLM2-135M", 0),
    ("prompt-lookup:2-3|ngram:leaderboard/drafts/smollm2-ngram", COMPOSITE, None, 2),
    ("auto", "auto", None, 0),
])
def test_draft_spec_parse(text, kind, arg, parts):
    spec = DraftSpec.parse(text)
    assert (spec.kind, spec.arg, len(spec.parts)) == (kind, arg, parts)
    assert spec.name == text  # the canonical text round-trips


def test_draft_spec_recognises_a_kinds_directory_and_bad_composites(tmp_path):
    (tmp_path / "ngram.json").write_text("{}")
    assert DraftSpec.parse(str(tmp_path)).kind == "ngram"  # zoo ngram's output named on its own
    for bad in ("", "prompt-lookup|", "|layers:0"):
        with pytest.raises(SpecdecError):
            DraftSpec.parse(bad)


def test_builtin_kinds_come_from_the_entry_points():
    """The kinds are what pyproject.toml declares: nothing is filled in beside the entry points."""
    from importlib.metadata import entry_points

    declared = {ep.name for ep in entry_points(group="specdraft_eval.drafts")}
    assert set(draft_kinds()) == declared and {"prompt-lookup", "layers", "ngram"} <= declared


def test_zoo_rank_ranks_every_published_record(tmp_path):
    """Every committed results file's draft measured in our engine, composites and auto runs included, ranks for a
    named GPU, from a directory that is not the checkout (the published results resolve from the package); vLLM's
    rows (drafts such as ``zoo export``'s folders, which reproduce.sh rebuilds) are not ours to predict."""
    every = scan_results([published.results()])
    files = [f for f in every if f.record.runtime.engine_name == "specdec"]
    assert len(files) < len(every)  # the board has vLLM rows: they are left out
    drafts = {f.record.draft for f in files}
    fixed = {f.record.draft for f in files if not f.record.dynamic_gamma}  # dynamic-γ runs give no TAR per γ
    assert any("|" in d for d in fixed), fixed
    done = run_cli("zoo", "rank", "--target", "smollm2-135m-instruct", "--gpu", "h100", "--json", cwd=tmp_path,
                   env={"HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(done.stdout)["rows"]
    ranked = {r["draft"] for r in rows}
    assert drafts <= ranked, drafts - ranked
    assert all(r["predicted_tokens_per_second"] for r in rows if r["draft"] in fixed)


TEMPORARY = r"/tmp/|\btmp\.[A-Za-z0-9]{10}\b|__tmp__"  # mktemp's folders, lm-eval's name for a path under one
WORK_ITEM = r"^(docs|benchmarks)/(.*/)?[A-Za-z_-]*[a-z]\d{2}(/|$)"  # a folder named after an issue: auto52, heads54


def offenders(files: dict[str, str]) -> list[str]:
    """Committed paths, or files' text, that name a temporary directory; folders named after a work item."""
    import re

    return [path for path, text in files.items()
            if re.search(TEMPORARY, path) or re.search(TEMPORARY, text) or re.search(WORK_ITEM, path)]


def test_no_committed_file_names_a_temporary_directory_and_no_folder_a_work_item():
    import subprocess

    root = Path(__file__).resolve().parents[1]
    listed = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True)
    if listed.returncode != 0:
        pytest.skip("not a git checkout")
    files = {}
    for path in listed.stdout.splitlines():
        if path == "tests/test_structure.py" or not (root / path).is_file():
            continue
        try:
            files[path] = (root / path).read_text()
        except UnicodeDecodeError:  # images
            files[path] = ""
    assert offenders(files) == []
    assert offenders({"docs/auto52/README.md": "", "benchmarks/x.json": '{"store": "/tmp/tmp.vczihG0jws"}',
                      "benchmarks/a/__tmp__tmp.WEdJc5S6oL__model/r.json": "", "docs/zoo.md": "see docs/x"}) == [
        "docs/auto52/README.md", "benchmarks/x.json", "benchmarks/a/__tmp__tmp.WEdJc5S6oL__model/r.json"]
