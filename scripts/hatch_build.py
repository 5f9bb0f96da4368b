"""Hatch build hook: ship ``specdraft_eval_hook.pth`` at the root of site-packages.

The .pth line makes the stock ``lm_eval`` command see ``--model specdec`` (see
``specdraft_eval/_lm_eval_hook.py``); it is installed for normal and editable installs alike.
"""

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


class CustomBuildHook(BuildHookInterface):
    def initialize(self, version: str, build_data: dict) -> None:
        key = "force_include_editable" if version == "editable" else "force_include"
        build_data.setdefault(key, {})["scripts/specdraft_eval_hook.pth"] = "specdraft_eval_hook.pth"
