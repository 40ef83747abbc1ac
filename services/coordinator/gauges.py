"""Reads the farm's gauges from Redis for `metrics.FarmCollector`, at scrape time.

Queue depth is the broker's list length: jobs no worker has taken yet. In flight is
the job records in RUNNING: with prefetch 1 and late acks, a job a worker took is
no longer in the list, so the two add up to the work the queue's workers owe. KEDA
scales on that sum (k8s/keda.yaml); the list length alone would scale a pool down
while its workers are still compiling.

The queues reported are every farm queue that a live worker serves, that a job
record names, or that the broker has seen declared. So a queue whose workers all left
still reports its waiting jobs, next to `torchfarm_workers 0`.
"""

from __future__ import annotations

from collections import Counter

from services.coordinator.farm import Dispatcher
from services.coordinator.metrics import FarmGauges
from torchfarm import metric_labels
from torchfarm.storage.store import JobState, Store
from torchfarm.wire import routing


def _is_farm_queue(name: str) -> bool:
    # The broker also holds Celery's own queues (remote control "...pidbox" and the like).
    device = metric_labels.device_of(metric_labels.target_of_queue(name))
    return device in routing.DEVICES and "pidbox" not in name and "@" not in name


def read_gauges(store: Store, dispatcher: Dispatcher) -> FarmGauges:
    """One reading; raises on a Redis or broker error (the collector reports it)."""
    workers = store.live_workers()
    jobs = store.job_states()
    served = Counter(q for w in workers.values() for q in dict.fromkeys(w.get("queues", ())))
    known = set(served) | {q for q, _ in jobs} | dispatcher.queues()
    queues = sorted(q for q in known if _is_farm_queue(q))
    running = Counter(q for q, state in jobs if state == JobState.RUNNING)
    info = store.c.info()
    return FarmGauges(
        queued={q: dispatcher.depth(q) for q in queues},
        in_flight={q: running[q] for q in queues},
        workers={q: served[q] for q in queues},
        cache_used_bytes=int(info.get("used_memory", 0)),
        cache_max_bytes=int(info.get("maxmemory", 0)),
        cache_evictions=int(info.get("evicted_keys", 0)),
    )
