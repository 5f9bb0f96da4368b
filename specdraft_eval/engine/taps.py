"""The target's hidden states at a draft's taps, recorded during each forward pass (forward hooks), for drafts
that read them back (:attr:`~specdraft_eval.engine.drafter.Drafter.taps`: EAGLE-style heads)."""

from __future__ import annotations

import torch
from torch.nn import Module

from specdraft_eval.engine.drafter import FINAL
from specdraft_eval.errors import SpecdecError
from specdraft_eval.models.structure import decoder_layers


class FeatureTap:
    """Records ``taps`` of ``target`` on every forward pass until :meth:`close`; :meth:`take` returns the last
    pass's, concatenated in tap order: ``[rows, columns, len(taps) * hidden]``; with ``history``, :meth:`passes`
    returns every pass's."""

    def __init__(self, target_model: Module, taps: tuple[int, ...], history: bool = False) -> None:
        self._seen: dict[int, torch.Tensor] = {}
        self._taps = taps
        self._history: list[torch.Tensor] | None = [] if history else None
        self._hooks = []
        layers = decoder_layers(target_model)
        for tap in taps:
            if tap == FINAL:
                norm = getattr(target_model.base_model, "norm", None)
                if norm is None:
                    raise SpecdecError(f"{type(target_model).__name__} has no final norm to read features from: use a "
                                       "draft model instead of an EAGLE head")
                self._hooks.append(norm.register_forward_hook(self._output_hook(tap)))
            elif 0 <= tap < len(layers):
                self._hooks.append(layers[tap].register_forward_pre_hook(self._input_hook(tap), with_kwargs=True))
            else:
                raise SpecdecError(f"a draft reads layer {tap} of a target with {len(layers)} layers: use a head "
                                   "trained for this target")

    def _output_hook(self, tap: int):
        def hook(module, args, output):
            self._record(tap, output)
        return hook

    def _record(self, tap: int, value: torch.Tensor) -> None:
        self._seen[tap] = value.detach()
        if self._history is not None and len(self._seen) == len(self._taps):
            self._history.append(self.take())

    def _input_hook(self, tap: int):
        def hook(module, args, kwargs):
            self._record(tap, args[0] if args else kwargs["hidden_states"])
        return hook

    def take(self) -> torch.Tensor | None:
        """The last pass's features (None when no pass ran since the last take)."""
        if not self._seen:
            return None
        features = torch.cat([self._seen[tap] for tap in self._taps], dim=-1)
        self._seen = {}
        return features

    def passes(self) -> list[torch.Tensor]:
        """With ``history``: every pass's features since the last call, in order."""
        passes, self._history = self._history, []
        return passes

    def close(self) -> None:
        for hook in self._hooks:
            hook.remove()
