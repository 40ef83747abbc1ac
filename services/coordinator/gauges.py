"""Reads the farm's gauges from Redis for `metrics.FarmCollector`, at scrape time.

Queue depth is the broker's list length: jobs no worker has taken yet. In flight is
the job records in RUNNING: with prefetch 1 and late acks, a job a worker took is
no longer in the list, so the two add up to the work the queue's workers owe. KEDA
scales on that sum (k8s/keda.yaml); the list length alone would scale a pool down
while its workers are still compiling.

The queues reported are every farm queue that a live worker serves, that a worker
served within the window (`known_target_window_s`), or that a job record names. So a
queue whose workers all left still reports its waiting jobs, next to
`torchfarm_workers 0`. A queue no worker served within the window counts at most its
live job records: a message whose record expired is one no client waits for and a
worker drops (workers/runtime.py). Counted, the messages of made-up builds a tenant
queued for a known target would hold that target's pool at its largest for ever, the
tenant's quota long since free again.
"""

from __future__ import annotations

import time
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


def read_gauges(store: Store, dispatcher: Dispatcher, window_s: float) -> FarmGauges:
    """One reading; raises on a Redis or broker error (the collector reports it)."""
    workers = store.live_workers()
    jobs = store.job_states()
    served = Counter(q for w in workers.values() for q in dict.fromkeys(w.get("queues", ())))
    recently = set(served) | store.queues_seen_since(time.time() - window_s)
    waiting = Counter(q for q, state in jobs if state == JobState.QUEUED)
    queues = sorted(q for q in recently | {q for q, _ in jobs} if _is_farm_queue(q))
    running = Counter(q for q, state in jobs if state == JobState.RUNNING)

    def depth(queue: str) -> int:
        found = dispatcher.depth(queue)
        return found if queue in recently else min(found, waiting[queue])

    info = store.c.info()
    return FarmGauges(
        queued={q: depth(q) for q in queues},
        in_flight={q: running[q] for q in queues},
        workers={q: served[q] for q in queues},
        cache_used_bytes=int(info.get("used_memory", 0)),
        cache_max_bytes=int(info.get("maxmemory", 0)),
        cache_evictions=int(info.get("evicted_keys", 0)),
    )
