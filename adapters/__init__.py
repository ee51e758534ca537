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

__all__ = [
    "Adapter",
    "Capabilities",
    "ClientRequestError",
    "Completion",
    "EngineError",
    "EngineStats",
    "Health",
    "RequestContext",
    "StreamEvent",
    "UnsupportedError",
    "Usage",
]
