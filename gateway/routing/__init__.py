from gateway.routing.admission import Admission, QueueFull
from gateway.routing.lifecycle import EngineChoice, Lifecycles, ModelLifecycle, ModelUnavailable, State
from gateway.routing.pool import Lease, Replica, RouteKey
from gateway.routing.registry import Backend, ModelRegistry

__all__ = [
    "Admission", "Backend", "EngineChoice", "Lease", "Lifecycles", "ModelLifecycle", "ModelRegistry",
    "ModelUnavailable", "QueueFull", "Replica", "RouteKey", "State",
]
