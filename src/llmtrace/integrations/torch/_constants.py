"""Constants of the ``torch`` integration."""

from __future__ import annotations

from typing import Final

MODULE: Final = "torch"
DISTRIBUTION: Final = "torch"
SUPPORTED: Final = ">=2.2"
#: Keyword arguments that carry a model's main input, in order of preference.
INPUT_KWARGS: Final = ("input_ids", "inputs_embeds", "pixel_values", "input_values", "input_features", "x")
