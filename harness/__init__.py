"""harness: declarative multi-stage SFT experiments that make task-mixture interference (the seesaw) measurable.

Importing the package is cheap (no torch); the heavy modules are imported where they are used.
"""

__version__ = "0.1.0"
