from adapters.base import (
    Adapter,
    Capabilities,
    ClientRequestError,
    Completion,
    EngineError,
    EngineStats,
    Health,
    RequestContext,
    StreamEvent,
    UnsupportedError,
    Usage,
)
from adapters.config import EngineConfig
from adapters.spec import EngineSpec, Layout, ServerSpec

__all__ = [
    "Adapter",
    "Capabilities",
    "ClientRequestError",
    "Completion",
    "EngineConfig",
    "EngineError",
    "EngineSpec",
    "EngineStats",
    "Health",
    "Layout",
    "RequestContext",
    "ServerSpec",
    "StreamEvent",
    "UnsupportedError",
    "Usage",
]
