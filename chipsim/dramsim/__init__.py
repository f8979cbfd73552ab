"""The command-level DRAM model (standard, controller, streams), its calibration of the event-level model
(calibrate) and its validation against Ramulator 2.1 (validate, points).

The controller and the streams are compiled by mypyc at install (chipsim._compiled); `BUILD` says how they run here.
"""

from chipsim import _compiled

BUILD = _compiled.load("dramsim")  # e.g. "compiled (mypyc)"
