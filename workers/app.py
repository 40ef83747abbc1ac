"""The entry point of a worker: `celery -A workers.app worker` (or `torchfarm worker`).

The only place a worker's settings are read: from TORCHFARM_* variables, once, into the
one app this process runs (`create_app`, workers/factory.py). The queues it consumes
follow from the targets it serves (TORCHFARM_TARGETS, workers/serving.py): "cpu.avx512",
"cuda.sm_90", "kernels.cuda.sm_90", ...
"""

from __future__ import annotations

import os

from torchfarm.settings import from_env
from workers.factory import create_app
from workers.settings import WorkerSettings

# This process forks the pool, and a CUDA driver started here breaks CUDA in every pool
# process. torch.cuda.is_available() starts it (cuInit) unless this is set, and then
# asks NVML instead; torch reads it at each call. The serving plan itself asks a spawned
# probe (workers/gpu_probe.py).
os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")

app = create_app(from_env(WorkerSettings))
