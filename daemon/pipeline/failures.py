"""What the pipeline's stages make of a failed call: final for the dlqId or not, and how
long to wait before the next try. One policy for the fetch and the batch."""

from __future__ import annotations

from collections.abc import Callable

from daemon.upstream import ServiceError, Unauthorized, is_transient


def is_final_for(error: ServiceError) -> bool:
    """Whether the service said something final about this dlqId. A refused token is
    about the account, not the dlqId: the rotation's lockout holds calls until a token
    works, and the dlqId waits."""
    return not is_transient(error) and not isinstance(error, Unauthorized)


def backoff(tries: int, base: float, cap: float, rand: Callable[[], float]) -> float:
    """`base` * 2**(tries-1), at most `cap`, jittered down to half so that work failed
    together (an outage) does not come due together."""
    return float(min(cap, base * 2 ** max(0, tries - 1)) * (0.5 + rand() / 2))
