"""Tqdm: the tqdm bar class TQDMProgressBar draws with (Lightning's public ``Tqdm``), with steady-width numbers."""

from __future__ import annotations

from typing import Any

from tqdm import tqdm

_WIDTH = 5  # digits and point of a padded number: "0.1" shows as "0.100", so the bar does not jump


class Tqdm(tqdm):
    """A tqdm bar whose postfix numbers keep their width from one redraw to the next.

    Subclass it (or return your own bar from ``TQDMProgressBar.init_train_tqdm``) to change how a bar looks.
    Example: ``Tqdm.format_num(0.1) == "0.100"``.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)

    @staticmethod
    def format_num(n: int | float | str) -> str:
        """tqdm's short form of a number, floats and numeric strings padded with zeros to five characters."""
        text = n if isinstance(n, str) else tqdm.format_num(n)
        if not isinstance(n, (float, str)) or "e" in text:
            return text  # ints and scientific notation keep tqdm's form
        if "." not in text and len(text) < _WIDTH:
            try:
                float(text)
            except ValueError:
                return text  # a word, not a number
            text += "."
        return text + "0" * (_WIDTH - len(text))
