"""Make the stock ``lm_eval`` command know ``--model specdec``; imported by ``specdraft_eval_hook.pth``.

lm-eval 0.4.13 has no entry-point group for models: ``get_model()`` imports ``lm_eval.models`` only
while its registry is empty and then looks the name up. Registering early would keep the registry
non-empty and hide lm-eval's own models, so this installs a finder that waits for ``lm_eval.models`` to
finish loading and then adds a lazy ``"specdec"`` entry. Nothing heavy is imported at start-up.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys

WATCHED = "lm_eval.models"
TARGET = "specdraft_eval.integration.lm_eval_model:SpecDecLM"


def register() -> None:
    """Add the lazy ``specdec`` entry to lm-eval's model registry (idempotent)."""
    from lm_eval.api.registry import model_registry

    if "specdec" not in model_registry:
        model_registry.register("specdec", target=TARGET)


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader) -> None:
        self.inner = inner

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module) -> None:
        self.inner.exec_module(module)
        register()


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname != WATCHED:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


def install() -> None:
    if WATCHED in sys.modules:
        register()
    elif not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


install()
