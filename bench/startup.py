"""Start-up time: from process start to the first training step of `python train.py`.

    python bench/startup.py                    # the default command, 5 runs (~1 minute)
    python bench/startup.py model=small data=numbers --repeats 3

Each run launches `python train.py [overrides]` with a probe callback (FirstStep, below) that
notes the wall-clock time at the start of fit, of the train loop and of the first training
batch, prints them and ends the process there. The first run generates the data into a fresh
directory; the later runs find it cached, as every run after a user's first does. For scale,
the table also times bare `python`, `import torch` and `import lightning` in new processes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
MARK = "STARTUP-PROBE "

if __name__ != "__main__":  # only train.py's process imports the probe; the launcher needs none
    import lightning as L

    class FirstStep(L.Callback):
        """Prints the times the fit and the first batch began, then ends the process."""

        def __init__(self) -> None:
            self.times: dict[str, float] = {}

        def on_fit_start(self, trainer, pl_module) -> None:
            self.times["fit"] = time.time()

        def on_train_start(self, trainer, pl_module) -> None:
            self.times["train_loop"] = time.time()

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            self.times["first_batch"] = time.time()
            print("\n" + MARK + json.dumps(self.times), flush=True)  # after the progress bar
            os._exit(0)  # nothing after the first step is measured; skip the rest of the run


def seconds_to_run(argv: list[str], env: dict[str, str]) -> tuple[float, dict[str, float]]:
    """Wall time of a process, and the probe's timestamps relative to its launch."""
    start = time.time()
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    wall = time.time() - start
    if done.returncode != 0:
        sys.exit(f"error: {' '.join(argv)} exited {done.returncode}:\n{done.stderr[-2000:]}")
    probe = next((line for line in done.stdout.splitlines() if MARK in line), None)
    found = json.loads(probe.split(MARK, 1)[1]) if probe else {}
    marks = {k: v - start for k, v in found.items()}
    return wall, marks


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=5, help="runs of train.py (first: cold)")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for train.py")
    args = parser.parse_args()
    sys.path.insert(0, str(HERE))
    from common import environment, print_table

    env = dict(os.environ, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH")]))
    python = sys.executable
    rows = []
    for name, code in (
        ("python -c pass", "pass"),
        ("import torch", "import torch"),
        ("import lightning", "import lightning"),
    ):
        walls = [seconds_to_run([python, "-c", code], env)[0] for _ in range(3)]
        rows.append([name, "", "", f"{statistics.median(walls):.2f}"])

    with tempfile.TemporaryDirectory() as tmp:
        command = [
            python, "train.py", *args.overrides, f"paths.data_dir={tmp}/data",
            f"hydra.run.dir={tmp}/run", "+callbacks.startup_probe._target_=startup.FirstStep",
        ]  # fmt: skip
        runs = []
        for i in range(args.repeats):
            _, marks = seconds_to_run(command, env)
            if "first_batch" not in marks:
                sys.exit("error: the run ended before its first training step")
            runs.append(marks)
            print(f"  run {i}: first step after {marks['first_batch']:.2f} s", file=sys.stderr)

    def cells(marks: list[dict[str, float]]) -> list[str]:
        return [
            f"{statistics.median(m[key] for m in marks):.2f}"
            for key in ("fit", "train_loop", "first_batch")
        ]

    label = " ".join(["python train.py", *args.overrides])
    rows.append([f"{label} (first run: makes the data)", *cells(runs[:1])])
    if len(runs) > 1:
        rows.append([f"{label} (data cached; median of {len(runs) - 1})", *cells(runs[1:])])
    print(f"# start-up, {environment()}\n")
    print("Seconds from process launch to each point (a bare import: to the process's end).\n")
    print_table(["command", "fit starts", "train loop starts", "first step"], rows)


if __name__ == "__main__":
    main()
