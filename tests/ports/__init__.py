"""Lightning 2.x style training scripts ported to Tandem by changing their imports, and their tests.

Each port module (gan.py, transformer.py, ...) is written as a Lightning user would write it; only the import
lines name Tandem. Its ``main(**overrides)`` builds the run the way the script's ``__main__`` does and
returns what the run produced; the keyword arguments replace Trainer options (``callbacks`` are added to
the script's own), so the tests can point the run at a temporary directory or at two processes.
"""
