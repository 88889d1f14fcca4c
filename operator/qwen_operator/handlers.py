"""kopf wiring only: watch QwenDeployments and their children, and hand each change to the work queue.

Only watching handlers are used (no create/update handlers, timers or daemons), so kopf writes no
annotations and adds no finalizer: deleting a QwenDeployment never hangs on the operator, children
go with it through their ownerReferences, and a resync that finds nothing to do writes nothing.
"""

from __future__ import annotations

import logging
from typing import Any

import kopf

from .api.spec import GROUP, PLURAL, VERSION
from .kinds import MANAGED
from .names import LABEL_PREFIX, MANAGED_BY
from .workqueue import WorkQueue

_queue: WorkQueue | None = None


def install(queue: WorkQueue) -> None:
    """Route every watch event to `queue` and register the child watchers (once, before kopf runs)."""
    global _queue
    _queue = queue
    for kind in MANAGED:
        kopf.on.event(kind.group, kind.version, kind.plural, labels=_CHILD_LABELS, id=f"child-{kind.plural}")(
            _on_child
        )


def _trigger(namespace: str, name: str, generation: int | None = None) -> None:
    assert _queue is not None, "handlers.install() was not called"
    _queue.trigger((namespace, name), generation)


@kopf.on.event(GROUP, VERSION, PLURAL)
def on_qwendeployment(body: kopf.Body, type: str | None, **_: Any) -> None:
    meta = body["metadata"]
    if type == "DELETED":
        assert _queue is not None, "handlers.install() was not called"
        _queue.forget((meta["namespace"], meta["name"]))
    else:
        _trigger(meta["namespace"], meta["name"], meta.get("generation"))


_CHILD_LABELS = {"app.kubernetes.io/managed-by": MANAGED_BY}

#: kopf's retries of a failing API call (watches, lists): its default sequence, then every 30 s, 10.6 min.
API_ERROR_BACKOFFS = (1, 1, 2, 3, 5, 8, 13, 21) + (30,) * 19


def _on_child(body: kopf.Body, **_: Any) -> None:
    """A child changed or vanished: reconcile its owner (reverts hand edits, recreates deletions)."""
    owner = body["metadata"].get("labels", {}).get(f"{LABEL_PREFIX}/deployment")
    if owner:
        _trigger(body["metadata"]["namespace"], owner)


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
