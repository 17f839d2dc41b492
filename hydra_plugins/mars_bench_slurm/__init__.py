"""Hydra plugin: the SLURM launcher of ``hydra/launcher=slurm`` (Hydra instantiates launchers only from the
``hydra_plugins`` package). It is hydra-submitit-launcher's, with SLURM's refusals said in one line
(``mars_bench.run.slurm``). Defined only where hydra-submitit-launcher is installed (``pip install
'mars-bench[slurm]'``); without it Hydra's scan finds nothing here instead of warning on every run."""
from __future__ import annotations

from typing import Sequence

try:
    from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher as _SubmititSlurmLauncher
except ImportError:
    _SubmititSlurmLauncher = None

if _SubmititSlurmLauncher is not None:
    class SlurmLauncher(_SubmititSlurmLauncher):
        """``conf/hydra/launcher/slurm.yaml``: a refused submission ends the multirun with one line, exit 2."""

        def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int):
            from mars_bench.run.slurm import refusals_in_one_line

            with refusals_in_one_line(self.params):
                return super().launch(job_overrides, initial_job_idx)
