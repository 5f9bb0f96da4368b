"""Hatch build hook: ship ``specdraft_eval_hook.pth`` at the root of site-packages, and in a (non-editable) wheel
the published measurements.

The .pth line makes the stock ``lm_eval`` command see ``--model specdec`` (see
``specdraft_eval/integration/lm_eval_hook.py``); it is installed for normal and editable installs alike. A wheel
also carries ``leaderboard/results`` and the shipped n-gram draft and EAGLE head under
``specdraft_eval/_published/leaderboard/`` (what ``draft=auto``, ``zoo recommend`` and ``zoo rank`` read by default:
``specdraft_eval/published.py``); an editable install reads them from the checkout.
"""

import os

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

PUBLISHED = ("leaderboard/results", "leaderboard/drafts/smollm2-ngram", "leaderboard/drafts/smollm2-eagle",
             "leaderboard/drafts/smollm2-eagle3")


class CustomBuildHook(BuildHookInterface):
    def initialize(self, version: str, build_data: dict) -> None:
        key = "force_include_editable" if version == "editable" else "force_include"
        build_data.setdefault(key, {})["scripts/specdraft_eval_hook.pth"] = "specdraft_eval_hook.pth"
        if version != "editable":
            for folder in PUBLISHED:
                build_data[key][os.path.join(self.root, folder)] = f"specdraft_eval/_published/{folder}"
