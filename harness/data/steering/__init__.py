"""Adaptive stage mixtures ("steering"): controllers that move a stage's task weights as it trains, and the stream
that draws its batches from the current weights.

- :mod:`.controller`: what every controller shares (the floor, the registry entry, state in and out);
- :mod:`.odm`: Online Data Mixing (Albalak et al. 2023): Exp3 with the per-task training loss as reward;
- :mod:`.doremi`: DoReMi (Xie et al. 2023): exponentiated-gradient weights on the loss in excess of a reference;
- :mod:`.groupdro`: Group DRO (Sagawa et al. 2020): exponentiated-gradient weights on each task's error on a steering
  split (or its training loss);
- :mod:`.stream`: :class:`~.stream.AdaptiveStream`, one global batch per step drawn from the current weights.

Importing this package fills :data:`harness.core.registry.MIXTURE_CONTROLLERS` (it is that registry's provider).
"""

from harness.data.steering.controller import Controller, floored
from harness.data.steering.doremi import DoReMi  # registers "doremi"
from harness.data.steering.groupdro import GroupDRO  # registers "groupdro"
from harness.data.steering.odm import OnlineDataMixing  # registers "odm"

__all__ = ["Controller", "DoReMi", "GroupDRO", "OnlineDataMixing", "floored"]
