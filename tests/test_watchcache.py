"""The watch cache's store: newer versions win, indexes follow changes, a re-LIST reports the
difference; what counts as an informer hearing from the server, and /healthz failing on a stuck one; a
CRD that comes while its watch was away gets its informer. The informers themselves run against the
real API server in e2e/test_watch_cache.py (and under faults in e2e/test_api_faults.py,
e2e/test_faults.py)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import urllib3
from kubernetes.client.rest import ApiException

from qwen_operator.k8s import Caches, Cluster, _slim_node, _slim_pod, _without_managed_fields
from qwen_operator.kinds import optional
from qwen_operator.runtime import QWD_WATCH, health
from qwen_operator.watchcache import Informer, Store
from qwen_operator.workqueue import WorkQueue


def obj(name: str, version: int, owner: str = "a", namespace: str = "ns") -> dict[str, Any]:
    labels = {"qwenops.dev/deployment": owner}
    return {
        "metadata": {"name": name, "namespace": namespace, "resourceVersion": str(version), "labels": labels}
    }


def by_owner(o: dict[str, Any]) -> list[tuple[str, str]]:
    return [(o["metadata"]["namespace"], o["metadata"]["labels"]["qwenops.dev/deployment"])]


def test_an_older_version_never_replaces_a_newer_one() -> None:
    store = Store()
    assert store.put(obj("x", 7))  # a write's answer
    assert not store.put(obj("x", 5))  # a late watch event of before the write
    assert store.get("ns", "x")["metadata"]["resourceVersion"] == "7"  # type: ignore[index]
    assert store.put(obj("x", 7)) and store.put(obj("x", 9))  # the watch catching up, then a change


def test_indexes_follow_changes_and_removals() -> None:
    store = Store(indexes={"owner": by_owner})
    store.put(obj("x", 1, owner="a"))
    store.put(obj("y", 1, owner="a"))
    store.put(obj("x", 2, owner="b"))  # relabelled
    assert [o["metadata"]["name"] for o in store.by("owner", ("ns", "a"))] == ["y"]
    assert [o["metadata"]["name"] for o in store.by("owner", ("ns", "b"))] == ["x"]
    store.remove(("ns", "y"))
    assert store.by("owner", ("ns", "a")) == [] and len(store) == 1


def test_a_relist_reports_what_changed_and_what_went() -> None:
    store = Store()
    for name, version in (("kept", 1), ("changed", 1), ("gone", 1)):
        store.put(obj(name, version))
    changed, gone = store.replace([obj("kept", 1), obj("changed", 4), obj("new", 5)])
    assert sorted(o["metadata"]["name"] for o in changed) == ["changed", "new"]
    assert [o["metadata"]["name"] for o in gone] == ["gone"]
    assert sorted(o["metadata"]["name"] for o in store.items()) == ["changed", "kept", "new"]


def test_nodes_and_pods_on_them_are_kept_slim() -> None:
    node = {
        "metadata": {"name": "n", "labels": {"a": "b"}, "resourceVersion": "3", "managedFields": [{}] * 20},
        "spec": {"taints": [{"key": "k", "effect": "NoSchedule"}], "podCIDR": "10.0.0.0/24"},
        "status": {
            "allocatable": {"nvidia.com/gpu": "8"},
            "images": [{"names": ["x"] * 50}],
            "conditions": [],
        },
    }
    assert _slim_node(node) == {
        "metadata": {"name": "n", "labels": {"a": "b"}, "resourceVersion": "3"},
        "spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]},
        "status": {"allocatable": {"nvidia.com/gpu": "8"}},
    }
    pod = {
        "metadata": {
            "name": "p",
            "namespace": "ns",
            "resourceVersion": "4",
            "annotations": {"x": "y" * 1000},
        },
        "spec": {
            "nodeName": "n",
            "containers": [{"name": "c", "image": "i", "resources": {"requests": {"cpu": "1"}}}],
        },
        "status": {"phase": "Running"},
    }
    assert _slim_pod(pod) == {
        "metadata": {"name": "p", "namespace": "ns", "resourceVersion": "4"},
        "spec": {"nodeName": "n", "containers": [{"resources": {"requests": {"cpu": "1"}}}]},
    }


def test_children_are_kept_whole_but_for_their_managed_fields() -> None:
    """The transform of the children's, own pods' and QwenDeployments' stores: a write's answer (or a
    watch event) loses metadata.managedFields, nothing else, and the caller's object is left as it was."""
    fields = [{"manager": "qwen-operator", "operation": "Apply", "fieldsV1": {"f:spec": {}}}]
    answer = obj("x", 3) | {"spec": {"replicas": 2}}
    answer["metadata"] |= {"managedFields": fields, "annotations": {"qwenops.dev/hash": "h"}}
    store = Store(transform=_without_managed_fields)
    store.put(answer)
    kept = store.get("ns", "x")
    assert kept is not None and "managedFields" not in kept["metadata"]
    meta = {k: v for k, v in answer["metadata"].items() if k != "managedFields"}
    assert kept == answer | {"metadata": meta}
    assert answer["metadata"]["managedFields"] == fields
    assert _without_managed_fields(obj("y", 1)) == obj("y", 1)


class Answer:
    """One response as the kubernetes client's call_api gives it to an Informer: a LIST's body, or a
    watch's event lines (the stream ends after them, as when the server ends the watch, or `fails`)."""

    def __init__(
        self,
        status: int = 200,
        body: dict[str, Any] | None = None,
        events: tuple[dict[str, Any], ...] = (),
        fails: Exception | None = None,
    ) -> None:
        self.status, self.reason = status, "Reason"
        self.body, self.events, self.fails = body or {}, events, fails
        self.response = self  # the urllib3 response of a stream

    def read(self) -> bytes:
        return json.dumps(self.body).encode()

    def stream(self, amt: int | None = None, decode_content: bool = True) -> Iterator[bytes]:
        for event in self.events:
            yield json.dumps(event).encode() + b"\n"
        if self.fails is not None:
            raise self.fails

    def release_conn(self) -> None:
        pass


class ScriptedApi:
    """Answers an Informer's requests in order."""

    def __init__(self, *answers: Answer) -> None:
        self.answers = list(answers)

    def param_serialize(self, method: str, path: str, **_: Any) -> tuple[Any, ...]:
        return method, path, {}, None, None

    def call_api(self, method: str, url: str, **_: Any) -> Answer:
        return self.answers.pop(0)


NODES = {"kind": "NodeList", "apiVersion": "v1", "metadata": {"resourceVersion": "5"}, "items": []}
BOOKMARK = {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "9"}}}
READ_TIMEOUT = urllib3.exceptions.ReadTimeoutError(None, "/api/v1/nodes", "read timed out")


def silent_since_long(informer: Informer) -> Informer:
    informer.contact.last = time.monotonic() - 700
    assert informer.stalled(time.monotonic(), 600)
    return informer


def test_an_informer_hears_from_lists_events_bookmarks_and_watches_the_server_ends() -> None:
    informer = Informer(ScriptedApi(), "/api/v1/nodes", Store(), name="nodes")  # type: ignore[arg-type]
    assert not informer.stalled(time.monotonic() + 10**6, 600), "not started: not watching"
    cases = [
        ("a LIST", Answer(body=NODES), lambda: informer._list()),
        ("a bookmark, then a broken stream", Answer(events=(BOOKMARK,), fails=READ_TIMEOUT), None),
        ("an idle watch the server ends at its timeout", Answer(), lambda: informer._watch("9")),
    ]
    for what, answer, call in cases:
        informer.api = ScriptedApi(answer)  # type: ignore[assignment]
        silent_since_long(informer)
        if call is None:
            with pytest.raises(urllib3.exceptions.ReadTimeoutError):
                informer._watch("5")
        else:
            call()
        assert not informer.stalled(time.monotonic(), 600), what
    informer.api = ScriptedApi(Answer(fails=READ_TIMEOUT))  # type: ignore[assignment]
    silent_since_long(informer)
    with pytest.raises(urllib3.exceptions.ReadTimeoutError):
        informer._watch("9")  # accepted, then silent until the read timed out: no sign of life
    assert informer.stalled(time.monotonic(), 600)
    informer.stop()
    assert not informer.stalled(time.monotonic() + 10**6, 600), "stopped: not watching"


def test_an_absent_collection_is_never_stuck() -> None:
    api = ScriptedApi(Answer(status=404))
    informer = Informer(api, "/apis/monitoring.coreos.com/v1/servicemonitors", Store())  # type: ignore[arg-type]
    informer.contact.heard()  # as start() does
    informer._run()  # returns at once: not served
    assert informer.absent and not informer.stalled(time.monotonic() + 10**6, 600)


def test_health_fails_while_a_watch_is_stuck_and_a_follower_is_healthy() -> None:
    caches = Caches(["ns"])  # nothing started: a follower waiting for the Lease
    queue = WorkQueue(Cluster(caches=caches))
    assert health(caches, queue, bound=600) == {"ok": True}
    now = time.monotonic()
    for informer in caches.all():  # started, each just heard from the server
        informer.contact.last = now
    queue.qwd_contact.last = now
    assert health(caches, queue, bound=600) == {"ok": True}
    caches.nodes.contact.last = now - 700
    answer = health(caches, queue, bound=600)
    assert answer["ok"] is False and answer["boundSeconds"] == 600
    assert list(answer["stuck"]) == ["nodes"] and answer["stuck"]["nodes"] >= 700
    caches.nodes.contact.last = now
    # kopf's watch of QwenDeployments shows contact by its events or the resync's LIST: a period more.
    queue.qwd_contact.last = now - 700
    assert health(caches, queue, bound=600) == {"ok": True}
    queue.qwd_contact.last = now - 1000
    assert list(health(caches, queue, bound=600)["stuck"]) == [QWD_WATCH]
    queue.stop()


def test_the_crd_of_an_absent_kind_arriving_as_modified_starts_its_informer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A CRD installed while the CRD watch was away comes back in its re-LIST, which reports MODIFIED
    (never ADDED); so does the CRD's status turning Established after an ADDED."""
    started: list[Informer] = []
    monkeypatch.setattr(Informer, "start", lambda self: started.append(self) or self)
    caches = Caches(["ns"])
    kind = optional()[0]
    absent = caches.children[(kind.plural, "ns")]
    absent.absent = True
    caches._crd_event("DELETED", {"metadata": {"name": kind.crd}})
    caches._crd_event("MODIFIED", {"metadata": {"name": "other.example.com"}})
    assert caches.children[(kind.plural, "ns")] is absent and started == []
    caches._crd_event("MODIFIED", {"metadata": {"name": kind.crd}})
    informer = caches.children[(kind.plural, "ns")]
    assert started == [informer] and informer is not absent
    assert (informer.path, informer.query) == (absent.path, absent.query) and not informer.absent
    caches._crd_event("MODIFIED", {"metadata": {"name": kind.crd}})  # cached already: left alone
    assert started == [informer]


def test_an_optional_crd_deleted_while_watched_empties_its_cache_and_ends_the_watch() -> None:
    """Issue 39 item 15: KEDA's CRDs deleted under a running operator. Before: its informer retried the
    404 forever, silent, and /healthz failed after WATCH_STALL_SECONDS (a restart for nothing)."""
    path = "/apis/keda.sh/v1alpha1/scaledobjects"
    listed = {
        "kind": "ScaledObjectList",
        "apiVersion": "keda.sh/v1alpha1",
        "metadata": {"resourceVersion": "5"},
    }
    listed["items"] = [obj("chat-engine", 4)]
    api = ScriptedApi(Answer(body=listed), Answer(status=404), Answer(status=404))
    seen: list[tuple[str, str]] = []
    informer = Informer(api, path, Store(), on_event=lambda t, o: seen.append((t, o["metadata"]["name"])))  # type: ignore[arg-type]
    informer.contact.heard()
    informer._run()  # the LIST, then the WATCH's 404: returns instead of retrying
    assert informer.absent and len(informer.store) == 0
    assert seen == [("DELETED", "chat-engine")]
    assert not informer.stalled(time.monotonic() + 10**6, 600)


@pytest.mark.parametrize(
    "failure",
    [
        urllib3.exceptions.MaxRetryError(
            None, "/api/v1/nodes", urllib3.exceptions.NewConnectionError(None, "refused")
        ),  # type: ignore[arg-type]
        urllib3.exceptions.ProtocolError("Connection aborted.", ConnectionResetError()),
        ApiException(status=503, reason="Service Unavailable"),
        ApiException(status=429, reason="Too Many Requests"),
    ],
    ids=["refused", "reset", "503", "429"],
)
def test_a_watch_whose_api_server_is_down_is_not_stuck(failure: Exception) -> None:
    """An outage longer than the stall bound: every request fails for want of an API server. A restart
    cannot help, so /healthz stays ok (before: it failed, and the kubelet's restarts became
    CrashLoopBackOff); the first answer afterwards ends the outage."""
    informer = Informer(ScriptedApi(), "/api/v1/nodes", Store(), name="nodes")  # type: ignore[arg-type]
    silent_since_long(informer)
    assert informer._failed(failure, 1.0) is False  # retried
    assert not informer.stalled(time.monotonic(), 600)
    informer.contact.heard()
    informer.contact.last = time.monotonic() - 700
    assert informer.stalled(time.monotonic(), 600), "an answer ended the outage"
    # A read that timed out on an accepted watch is a stall, not an outage.
    timed_out = urllib3.exceptions.MaxRetryError(None, "/api/v1/nodes", READ_TIMEOUT)  # type: ignore[arg-type]
    assert informer._failed(timed_out, 1.0) is False and informer.stalled(time.monotonic(), 600)
    assert informer._failed(READ_TIMEOUT, 1.0) is False and informer.stalled(time.monotonic(), 600)
