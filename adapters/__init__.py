from adapters.base import (
    Adapter,
    Capabilities,
    ClientRequestError,
    Completion,
    EngineError,
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
    "Health",
    "RequestContext",
    "StreamEvent",
    "UnsupportedError",
    "Usage",
]
