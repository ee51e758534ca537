from gateway.routing.admission import Admission, QueueFull
from gateway.routing.registry import Backend, ModelRegistry

__all__ = ["Admission", "Backend", "ModelRegistry", "QueueFull"]
