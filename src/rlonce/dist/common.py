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


def first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__




async def awaitable(ref):
    return await ref
