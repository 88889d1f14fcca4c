"""Watch-fed caches (informers): what a reconcile reads comes from memory, kept current by one LIST and
then one long WATCH per collection; the API server hears from the operator only when it writes.

An `Informer` LISTs a collection (in pages), then WATCHes it from the LIST's resourceVersion with
bookmarks, applying every event to its store and reporting it to `on_event`; a watch that ends is
resumed from the last version seen, and one whose version expired (410 Gone) LISTs again and reports
what changed meanwhile. A `Store` keeps objects by (namespace, name), optionally trimmed (`transform`:
only the fields the reconcile reads, so that thousands of pods cost little memory) and indexed.

Writes go through too (`Store.put` of a write's answer): the next reconcile must not see its own last
write missing, or it would write again. A store keeps the newer of two versions of an object by
resourceVersion (etcd's revision, an integer in every API server this operator supports), the rule of
client-go's mutation cache, so a late watch event never replaces a newer written answer.

Each informer keeps a `Contact`: when it last heard from the API server (a LIST page, a watch event or
bookmark, a watch the server ended at its timeout). An idle collection still hears at least every
WATCH_SECONDS, so one silent for much longer is stuck, and /healthz says so (runtime.py).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import urllib3
from kubernetes.client import ApiClient
from kubernetes.client.rest import ApiException

log = logging.getLogger(__name__)

Obj = dict[str, Any]
Key = tuple[str, str]  # (namespace or "", name)
#: Objects per LIST page; a watch's server-side timeout (it is resumed at once) and the client's.
PAGE = 500
WATCH_SECONDS = 300
READ_TIMEOUT = WATCH_SECONDS + 30
#: Waits after a failed LIST or WATCH: doubling from 1 s up to 10 s (about 2 requests a second from all
#: the informers together while the API server is down).
RETRY_FIRST, RETRY_MAX = 1.0, 10.0


def key_of(obj: Obj) -> Key:
    meta = obj["metadata"]
    return meta.get("namespace", ""), meta["name"]


def _version(obj: Obj | None) -> int:
    try:
        return int((obj or {}).get("metadata", {}).get("resourceVersion", -1))
    except ValueError:
        return -1


class Store:
    """Objects by (namespace, name), with indexes by a key function; safe across threads."""

    def __init__(
        self,
        transform: Callable[[Obj], Obj] | None = None,
        indexes: dict[str, Callable[[Obj], list[Any]]] | None = None,
    ) -> None:
        self._transform = transform or (lambda o: o)
        self._objects: dict[Key, Obj] = {}
        self._index_fns = indexes or {}
        self._indexes: dict[str, dict[Any, set[Key]]] = {n: {} for n in self._index_fns}
        self._lock = threading.Lock()

    def put(self, obj: Obj) -> bool:
        """Keep `obj` unless the store has a newer version; returns whether it was kept."""
        obj = self._transform(obj)
        key = key_of(obj)
        with self._lock:
            old = self._objects.get(key)
            if old is not None and _version(old) > _version(obj):
                return False
            self._unindex(key, old)
            self._objects[key] = obj
            for name, fn in self._index_fns.items():
                for value in fn(obj):
                    self._indexes[name].setdefault(value, set()).add(key)
        return True

    def remove(self, key: Key) -> Obj | None:
        with self._lock:
            old = self._objects.pop(key, None)
            self._unindex(key, old)
        return old

    def _unindex(self, key: Key, old: Obj | None) -> None:
        if old is None:
            return
        for name, fn in self._index_fns.items():
            for value in fn(old):
                keys = self._indexes[name].get(value)
                if keys is not None:
                    keys.discard(key)
                    if not keys:
                        del self._indexes[name][value]

    def replace(self, objects: list[Obj]) -> tuple[list[Obj], list[Obj]]:
        """Make the store hold exactly `objects` (a fresh LIST); returns (changed or new, removed)."""
        fresh = {key_of(o): o for o in objects}
        with self._lock:
            gone = [o for k, o in self._objects.items() if k not in fresh]
            before = {k: _version(o) for k, o in self._objects.items()}
        for obj in gone:
            self.remove(key_of(obj))
        changed = [o for k, o in fresh.items() if before.get(k) != _version(o)]
        for obj in objects:
            self.put(obj)
        return changed, gone

    def get(self, namespace: str, name: str) -> Obj | None:
        with self._lock:
            return self._objects.get((namespace, name))

    def by(self, index: str, value: Any) -> list[Obj]:
        with self._lock:
            return [self._objects[k] for k in self._indexes[index].get(value, ())]

    def items(self) -> list[Obj]:
        with self._lock:
            return list(self._objects.values())

    def __len__(self) -> int:
        return len(self._objects)


class Contact:
    """When a watch last heard from the API server (monotonic seconds); None while it is not meant to
    run (not started, stopped, or a forbidden or absent collection: not watched on purpose).

    A watch whose requests fail because the API server is down (refused or reset connections, 5xx, 429)
    is not stalled: it knows why it hears nothing and keeps trying, and a restart of the operator would
    not bring the API server back. Counting it as stuck turned an outage of over WATCH_STALL_SECONDS into
    restarts and CrashLoopBackOff, whose back-off then delayed the recovery."""

    def __init__(self) -> None:
        self.last: float | None = None
        #: Since when every request failed for want of an API server; None while it answers.
        self.unreachable_since: float | None = None

    def heard(self) -> None:
        """An answer came; also called as the watch starts (its first answer is due from then)."""
        self.last = time.monotonic()
        self.unreachable_since = None

    def unreachable(self) -> None:
        """A request failed for want of an API server (unreachable(exc) is true)."""
        if self.unreachable_since is None:
            self.unreachable_since = time.monotonic()

    def ended(self) -> None:
        self.last = None
        self.unreachable_since = None

    def silent_for(self, now: float) -> float | None:
        return None if self.last is None else now - self.last

    def stalled(self, now: float, bound: float) -> bool:
        silent = self.silent_for(now)
        return silent is not None and silent > bound and self.unreachable_since is None


def unreachable(exc: BaseException) -> bool:
    """The request failed because the API server cannot serve: no connection (refused, reset, a DNS or
    TLS failure before any answer), or an answer saying so (5xx, 429). A watch accepted and then silent
    until its read timed out is not such a failure: that is what a stall looks like."""
    if isinstance(exc, ApiException):
        return exc.status is not None and (exc.status >= 500 or exc.status == 429)
    if isinstance(exc, urllib3.exceptions.MaxRetryError):
        return not isinstance(exc.reason, urllib3.exceptions.ReadTimeoutError)
    return isinstance(exc, (urllib3.exceptions.NewConnectionError, urllib3.exceptions.ProtocolError, OSError))


class Informer:
    """One collection (a path such as /api/v1/pods, with selectors) mirrored into `store`.

    `synced` is set once the first LIST is in the store; `forbidden` when that LIST was refused (403:
    the operator lacks the right, e.g. cluster-wide pods in a namespaced install) and `absent` when the
    collection does not exist (404: an optional CRD not installed, or deleted since: the store is emptied
    and its objects reported DELETED); both are final for this informer (Caches starts a new one when
    the CRD comes back).
    `on_event(type, obj)` is called from the informer's thread for every change after the first LIST.
    """

    def __init__(
        self,
        api: ApiClient,
        path: str,
        store: Store,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        metadata_only: bool = False,
        on_event: Callable[[str, Obj], None] | None = None,
        name: str | None = None,
    ) -> None:
        self.api, self.path, self.store = api, path, store
        self.name = name or path
        self.query = [
            (k, v) for k, v in (("labelSelector", label_selector), ("fieldSelector", field_selector)) if v
        ]
        self.metadata_only = metadata_only
        self.on_event = on_event
        self.synced = threading.Event()
        self.forbidden = False
        self.absent = False
        self.contact = Contact()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Informer:
        self.contact.heard()
        self._thread = threading.Thread(target=self._run, name=f"informer {self.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        self.contact.ended()

    def stalled(self, now: float, bound: float) -> bool:
        """True when this informer should be watching and heard nothing from the server for `bound` s."""
        return self.contact.stalled(now, bound)

    def _heard(self) -> None:
        if not self._stopped.is_set():  # the loop's last steps after stop() are no sign of a watch
            self.contact.heard()

    # --- the loop --------------------------------------------------------------------------------
    def _run(self) -> None:
        wait, version = RETRY_FIRST, None
        while not self._stopped.is_set():
            try:
                if version is None:
                    version = self._list()
                version = self._watch(version)
                wait = RETRY_FIRST
            except _Expired:
                version = None  # LIST again (410 Gone: the version is older than the API server keeps)
            except Exception as exc:  # an error answer; connection refused, reset, timeout
                if self._failed(exc, wait):
                    return
                self._stopped.wait(wait)
                wait = min(wait * 2, RETRY_MAX)

    def _failed(self, exc: Exception, wait: float) -> bool:
        """Take a failed LIST or WATCH into account; True when this informer is done: its collection is
        not served (404: an optional CRD not installed, or deleted while it was watched) or, at the
        first LIST, not to the operator (403)."""
        status = exc.status if isinstance(exc, ApiException) else None
        if status == 404 or (status == 403 and not self.synced.is_set()):
            if self.synced.is_set():  # the CRD was deleted: its objects went with it
                for obj in self.store.items():
                    self.store.remove(key_of(obj))
                    self._report("DELETED", obj)
            self.forbidden, self.absent = status == 403, status == 404
            log.info("%s: %s, not cached", self.name, "forbidden" if self.forbidden else "not served")
            self.contact.ended()
            self.synced.set()
            return True
        if unreachable(exc):
            self.contact.unreachable()
        if isinstance(exc, ApiException):
            log.warning("%s: %s %s, retrying in %.0f s", self.name, exc.status, exc.reason, wait)
        else:
            log.warning("%s: %s: %s, retrying in %.0f s", self.name, type(exc).__name__, exc, wait)
        return False

    def _request(self, query: list[tuple[str, Any]], stream: bool) -> Any:
        accept = "application/json"
        if self.metadata_only:  # objects as PartialObjectMetadata: a LIST of them, or a WATCH of each
            accept = f"application/json;as=PartialObjectMetadata{'' if stream else 'List'};g=meta.k8s.io;v=v1"
        headers = {"Accept": accept}
        method, url, headers, _, _ = self.api.param_serialize(
            "GET", self.path, query_params=query, header_params=headers, auth_settings=["BearerToken"]
        )
        timeout = (10, READ_TIMEOUT) if stream else 60
        resp = self.api.call_api(method, url, header_params=headers, _request_timeout=timeout)
        if resp.status >= 400:
            raise ApiException(
                status=resp.status, reason=resp.reason, body=resp.read().decode(errors="replace")
            )
        return resp

    def _list(self) -> str:
        """LIST every page into the store; returns the collection's resourceVersion."""
        items: list[Obj] = []
        token = None
        while True:
            query = [*self.query, ("limit", PAGE)] + ([("continue", token)] if token else [])
            page = json.loads(self._request(query, stream=False).read())
            self._heard()
            # A LIST's items omit their apiVersion and kind (a watch's objects have them): put them back,
            # so that a cached object compares equal to the object as it is applied.
            kind = {
                "apiVersion": page.get("apiVersion"),
                "kind": str(page.get("kind", "")).removesuffix("List"),
            }
            items += [kind | item for item in page.get("items", [])]
            token = page.get("metadata", {}).get("continue")
            if not token:
                break
        changed, gone = self.store.replace(items)
        if self.synced.is_set():  # a re-LIST: report what happened while the watch was away
            for obj in gone:
                self._report("DELETED", obj)
            for obj in changed:
                self._report("MODIFIED", obj)
        self.synced.set()
        return str(page.get("metadata", {}).get("resourceVersion", ""))

    def _watch(self, version: str) -> str:
        """One WATCH from `version` until the server ends it; returns the last version seen."""
        query = [
            *self.query,
            ("watch", "true"),
            ("allowWatchBookmarks", "true"),
            ("resourceVersion", version),
            ("timeoutSeconds", WATCH_SECONDS),
        ]
        resp = self._request(query, stream=True)
        try:
            for event in _events(resp):
                if self._stopped.is_set():
                    break
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise _Expired()
                    raise ApiException(status=obj.get("code"), reason=obj.get("message"))
                self._heard()
                version = obj.get("metadata", {}).get("resourceVersion", version)
                if kind == "BOOKMARK":
                    continue
                if kind == "DELETED":
                    self.store.remove(key_of(obj))
                    self._report(kind, obj)
                elif self.store.put(obj):
                    self._report(str(kind), obj)
        finally:
            resp.response.release_conn()
        # The server ended it (its timeoutSeconds): contact, the proof that an idle watch is alive. A
        # watch accepted and then silent is not: its read times out instead, and raises.
        self._heard()
        return version

    def _report(self, kind: str, obj: Obj) -> None:
        if self.on_event is None:
            return
        try:
            self.on_event(kind, obj)
        except Exception:  # one handler's bug must not stop the cache
            log.exception("%s: event handler failed", self.name)


class _Expired(Exception):
    """The watch's resourceVersion is too old (410 Gone): LIST again."""


def _events(resp: Any) -> Iterator[Obj]:
    """The JSON lines of a watch response, as they arrive."""
    buffer = b""
    for chunk in resp.response.stream(amt=None, decode_content=True):
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            if line.strip():
                yield json.loads(line)


def wait_synced(informers: list[Informer], timeout: float, progress: Callable[[str], None]) -> bool:
    """Wait until every informer has its first LIST, saying which ones it waits for every 10 s; False
    when `timeout` s passed first."""
    deadline = time.monotonic() + timeout
    while waiting := [i for i in informers if not i.synced.is_set()]:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        if not waiting[0].synced.wait(min(10.0, left)):
            progress(f"waiting for the first LIST of {len(waiting)} collection(s): {waiting[0].name}, ...")
    return True
