"""Adaptive stage mixtures ("steering"): controllers that move a stage's task weights as it trains, and the stream
that draws its batches from the current weights.

- :mod:`.controller`: what every controller shares (the floor, the registry entry, state in and out);
- :mod:`.odm`: Online Data Mixing (Albalak et al. 2023): Exp3 with the per-task training loss as reward;
- :mod:`.doremi`: DoReMi (Xie et al. 2023): exponentiated-gradient weights on the loss in excess of a reference;
- :mod:`.groupdro`: Group DRO (Sagawa et al. 2020): exponentiated-gradient weights on each task's error on a steering
  split (or its training loss);
- :mod:`.stream`: :class:`~.stream.AdaptiveStream`, one global batch per step drawn from the current weights.

Importing this package fills :data:`harness.core.registry.MIXTURE_CONTROLLERS` (it is that registry's provider): it
imports every public module of its folder (:func:`harness.core.registry.import_submodules`), so a new built-in
controller is one new file.
"""

from harness.core.registry import import_submodules
from harness.data.steering.controller import Controller, floored
from harness.data.steering.doremi import DoReMi
from harness.data.steering.groupdro import GroupDRO
from harness.data.steering.odm import OnlineDataMixing

#: The package's public modules, every one imported (in this order) for its registration side effect; the names above
#: are re-exported, not a list of what registers.
BUILTIN_MODULES = import_submodules(__name__)

__all__ = ["BUILTIN_MODULES", "Controller", "DoReMi", "GroupDRO", "OnlineDataMixing", "floored"]
