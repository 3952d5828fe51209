"""The training shell: Lightning and Hydra around the core.

module.py (the LightningModule: loss, steps, what is measured when), optim.py (AdamW and the
schedules), metrics.py, doctor.py (a run's health), callbacks.py (time budget, interrupts),
launch.py and preflight.py (the command line, checked before anything is written), report.py
and sweep.py (what a run and a sweep print at the end). Nothing outside this package imports
it but train.py (tests/test_architecture.py).
"""
