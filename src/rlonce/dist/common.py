"""What the Ray parts share: importing Ray, the executor's failure, error text, awaiting refs."""

from __future__ import annotations

import logging

from rlonce.core.records import FailureCategory
from rlonce.engine.base import BackendMissing

log = logging.getLogger("rlonce.ray")


def ray_module():
    try:
        import ray
    except ImportError:
        raise BackendMissing("executor 'ray' needs Ray: pip install 'rlonce[ray]' (make test installs it)") from None
    return ray


class ExecutorFailure(RuntimeError):
    """A group could not be run; ``category`` says which part of the infrastructure failed."""

    def __init__(self, message: str, category: FailureCategory):
        super().__init__(message)
        self.category = category

    def __reduce__(self):  # raised in a harness pool, it reaches the driver inside a RayTaskError
        return type(self), (str(self), self.category)


def first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__




async def awaitable(ref):
    return await ref
