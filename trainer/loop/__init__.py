"""How a stage runs: the session around it (session.py), the fit and evaluation loops (fit.py,
evaluation.py), the hooks and their order (hooks.py), the loop's state (state.py), optimizers and schedulers
(optim.py), data loaders (data.py), batch transfer (transfer.py) and stop signals (signals.py)."""
