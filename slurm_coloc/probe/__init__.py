"""Script probe: estimate a batch script's GPU memory from its own first training steps.

``command.py`` finds the training command in a batch script (pure); ``runner.py`` runs it in a
child process of the job's own Python with the ``inject`` package loaded, which makes one CUDA
device appear to exist without a GPU, keeps every tensor fake, replays the allocations through
the estimator's caching-allocator model and stops the program after its first optimizer steps.
``probe.probe_script`` is the entry point. Importing this package is cheap (stdlib only).
"""
from __future__ import annotations
