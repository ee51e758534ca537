"""Model arithmetic: the model's layer list from its config.json, and the parameters counted from it.

`layer_list()` reads which layers are attention (full or sliding), linear attention or SSM, and which
hold experts (with each one's MLP size), under every layer-frequency convention the configs use;
`count()` counts total and active parameters layer by layer, with the vision tower of a multimodal
checkpoint. Pure functions of the config dict: no files read here.
"""

from gateway.planning.stack.layers import Layer, Stack, layer_list
from gateway.planning.stack.params import Params, count

__all__ = ["Layer", "Params", "Stack", "count", "layer_list"]
