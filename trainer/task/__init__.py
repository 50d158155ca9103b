"""The user's side: Task (base.py, with the overridable defaults in defaults.py), DataModule
(datamodule.py) and what save_hyperparameters records (hparams.py)."""
