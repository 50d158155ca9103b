"""The entry point of a small Lightning project (written for Tandem's tests, in Lightning's form): a regression
task and its DataModule behind LightningCLI. tests/test_lightning_cli_app.py runs `python main.py fit --config
config.yaml` as it is, under Lightning, and with its import lines rewritten to Tandem's (and nothing else)."""

from data import WavesData
from model import WaveRegressor
from pytorch_lightning.cli import LightningCLI


def main() -> None:
    LightningCLI(WaveRegressor, WavesData, trainer_defaults={"enable_progress_bar": False})


if __name__ == "__main__":
    main()
