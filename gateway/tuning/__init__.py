"""`enginegate tune`: measure the planner's candidates on this host; plans use the record and its calibration."""

from gateway.tuning.apply import Tuning, apply_tuning
from gateway.tuning.lookup import lookup
from gateway.tuning.record import TUNE_DIR_ENV, TuneRecord, tune_dir

__all__ = ["TUNE_DIR_ENV", "TuneRecord", "Tuning", "apply_tuning", "lookup", "tune_dir"]
