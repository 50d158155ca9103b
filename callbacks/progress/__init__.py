"""Progress bars: the base class for custom bars, the tqdm bar (the default) and the rich bar."""

from callbacks.progress.base import ProgressBar
from callbacks.progress.rich_bar import RichProgressBar, RichProgressBarTheme
from callbacks.progress.tqdm_bar import TQDMProgressBar

__all__ = ["ProgressBar", "RichProgressBar", "RichProgressBarTheme", "TQDMProgressBar"]
