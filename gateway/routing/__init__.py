from gateway.routing.admission import Admission, QueueFull
from gateway.routing.pool import Lease, Replica, RouteKey
from gateway.routing.registry import Backend, ModelRegistry

__all__ = ["Admission", "Backend", "Lease", "ModelRegistry", "QueueFull", "Replica", "RouteKey"]
