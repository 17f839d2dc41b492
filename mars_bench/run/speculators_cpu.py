"""Speculators 0.9.0's trainer on a CPU: the ONE place where that library is adjusted (bound to 0.9.0).

Its trainer assumes an accelerator: it moves the model and each batch to ``local_rank`` (the int 0, i.e.
``cuda:0``), runs the step under ``torch.autocast("cuda" when no accelerator is found)``, and its step timer
calls ``torch.accelerator.synchronize()``. Inside ``cpu_training()`` those point at the CPU (the local rank
becomes ``"cpu"``, the autocast device ``"cpu"``, the sync a no-op, a resumed checkpoint loads on the CPU), and the patches are undone on exit. Its
other CPU needs are flags of its CLI (``TRAIN_FLAGS``): the eager loss (the fused one is a Triton kernel),
SDPA attention for the draft layer (flex attention compiles), no data-loader workers.

Install (docs/eagle3.md): ``pip install --no-deps speculators==0.9.0 hs-connectors==0.9.0`` plus its real
requirements (``.ci/speculators.sh``); its torchvision / torchaudio requirements break beside the CPU torch.
"""
from __future__ import annotations

import contextlib
from importlib.metadata import version

import torch

VERSION = "0.9.0"
# the CPU flags, and the head this project computes exactly (no norm before fc, raw output fed back, the
# residual taken before hidden_norm, one full-attention layer; Speculators' defaults differ on all four)
TRAIN_FLAGS = ["--loss-implementation", "eager", "--draft-attn-impl", "sdpa", "--num-workers", "0",
               "--no-norm-before-fc", "--no-norm-output", "--no-norm-before-residual",
               "--full-attention-indices", "0"]


def check_version() -> None:
    got = version("speculators")
    if got != VERSION:
        raise RuntimeError(f"speculators=={got}; this recipe is written for speculators=={VERSION} "
                           "(mars_bench/run/speculators_cpu.py patches its trainer)")


@contextlib.contextmanager
def cpu_training():
    """Speculators' trainer with its device, autocast device and accelerator sync pointed at the CPU."""
    check_version()
    from speculators.train import checkpointer, trainer

    saved = (trainer.get_local_rank, trainer.Trainer.__init__, torch.accelerator.synchronize,
             checkpointer.get_current_device)
    init = trainer.Trainer.__init__

    def cpu_init(self, *a, **kw):
        init(self, *a, **kw)
        self.device_type = "cpu"

    trainer.get_local_rank = lambda: "cpu"
    trainer.Trainer.__init__ = cpu_init
    torch.accelerator.synchronize = lambda *a, **kw: None
    checkpointer.get_current_device = lambda: "cpu"          # where a resumed checkpoint is loaded
    try:
        yield
    finally:
        (trainer.get_local_rank, trainer.Trainer.__init__, torch.accelerator.synchronize,
         checkpointer.get_current_device) = saved


def train(argv: list[str]) -> None:
    """Run ``speculators train`` in this process on the CPU with ``argv`` (its CLI flags) + ``TRAIN_FLAGS``."""
    with cpu_training():
        from speculators.train.cli import main
        from speculators.train.config import TrainConfig

        main(TrainConfig.resolve(list(argv) + TRAIN_FLAGS))
