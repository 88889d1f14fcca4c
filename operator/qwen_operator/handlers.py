"""kopf wiring only: watch QwenDeployments, keep the newest version of each in the cache, and hand each
change to the work queue. Children, pods and nodes are watched by the operator's own informers
(k8s.Caches), which hand their changes to the queue too (runtime.py).

Only watching handlers are used (no create/update handlers, timers or daemons), so kopf writes no
annotations and adds no finalizer: deleting a QwenDeployment never hangs on the operator, children
go with it through their ownerReferences, and a resync that finds nothing to do writes nothing.
"""

from __future__ import annotations

import logging
from typing import Any

import kopf

from .api.spec import GROUP, PLURAL, VERSION
from .names import LABEL_PREFIX
from .workqueue import WorkQueue

_queue: WorkQueue | None = None


def install(queue: WorkQueue) -> None:
    """Route every watch event of a QwenDeployment to `queue` (once, before kopf runs)."""
    global _queue
    _queue = queue


def _trigger(namespace: str, name: str, generation: int | None = None) -> None:
    assert _queue is not None, "handlers.install() was not called"
    _queue.trigger((namespace, name), generation)


@kopf.on.event(GROUP, VERSION, PLURAL)
def on_qwendeployment(event: kopf.RawEvent, type: str | None, **_: Any) -> None:
    assert _queue is not None, "handlers.install() was not called"
    _queue.qwd_contact.heard()
    raw: dict[str, Any] = dict(event["object"])
    meta = raw["metadata"]
    _queue.cluster.seen_qwendeployment(raw, deleted=type == "DELETED")
    if type == "DELETED":  # its retry, its scheduled look and its metrics go with it
        _queue.forget((meta["namespace"], meta["name"]))
    else:
        _trigger(meta["namespace"], meta["name"], meta.get("generation"))


#: kopf's retries of a failing API call (watches, lists): its default sequence, then every 30 s, 10.6 min.
API_ERROR_BACKOFFS = (1, 1, 2, 3, 5, 8, 13, 21) + (30,) * 19


def on_child(namespace: str, owner: str) -> None:
    """A child or a pod of `owner` changed or vanished (an informer's event): reconcile the owner
    (reverts hand edits, recreates deletions, follows pods becoming ready), once per burst of events."""
    assert _queue is not None, "handlers.install() was not called"
    _queue.trigger_soon((namespace, owner))


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=LABEL_PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=LABEL_PREFIX)
    settings.posting.level = logging.INFO
    settings.peering.standalone = True
    settings.watching.server_timeout = 270
    # kopf gives up on a watch after its API retries run out (54 s by default) and the process exits;
    # ride out an API server outage of about ten minutes instead (then exit: the pod restarts clean).
    settings.networking.error_backoffs = API_ERROR_BACKOFFS
    settings.networking.enforce_retry_after = True
    settings.execution.max_workers = 4
