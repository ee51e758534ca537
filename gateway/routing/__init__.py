from gateway.routing.admission import Admission, DeadlineExceeded, QueueFull, Refusal, Ticket
from gateway.routing.lifecycle import EngineChoice, Lifecycles, ModelLifecycle, ModelUnavailable, State
from gateway.routing.pool import Lease, Replica, RouteKey
from gateway.routing.registry import Backend, ModelRegistry

__all__ = [
    "Admission", "Backend", "DeadlineExceeded", "EngineChoice", "Lease", "Lifecycles", "ModelLifecycle", "ModelRegistry",
    "ModelUnavailable", "QueueFull", "Refusal", "Replica", "RouteKey", "State", "Ticket",
]
