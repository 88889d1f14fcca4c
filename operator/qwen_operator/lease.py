"""The leader election's durations, names and rules, without the kubernetes client: `qwen-operator run`'s
flags take their defaults from here (the CLI's other commands must start without the client); the
election itself is `leader`."""

from __future__ import annotations

from dataclasses import dataclass

#: How long a Lease stays valid without a renewal: the failover time when a leader dies without
#: releasing it (SIGKILL, node loss). The defaults of controller-runtime and kube-controller-manager.
LEASE_SECONDS = 15.0
#: A leader that could not renew for this long stops (exits): shorter than the Lease, so it is gone
#: before any other replica may take over, with 5 s to spare for the process to die.
RENEW_DEADLINE_SECONDS = 10.0
#: Pause between attempts to acquire or renew; also the longest one API call may take.
RETRY_SECONDS = 2.0
#: Name of the Lease in the operator's namespace.
LEASE_NAME = "qwen-operator"
#: Exit status after losing the Lease: the pod restarts clean, as a follower (controller-runtime exits
#: too); a status of its own makes the cause visible in the container's last state.
LOST_EXIT_CODE = 3


@dataclass(frozen=True)
class Timing:
    """Lease duration, renew deadline and retry period, in seconds."""

    lease: float = LEASE_SECONDS
    renew_deadline: float = RENEW_DEADLINE_SECONDS
    retry: float = RETRY_SECONDS

    def problems(self) -> list[str]:
        """Why these durations would be unsafe: a leader must give up before its Lease can expire."""
        found = []
        if not self.retry > 0:
            found.append(f"retry period {self.retry:g} s must be positive")
        if not self.renew_deadline > self.retry:
            found.append(f"renew deadline {self.renew_deadline:g} s must exceed the retry period")
        if not self.lease > self.renew_deadline:
            found.append(f"lease duration {self.lease:g} s must exceed the renew deadline")
        return found
