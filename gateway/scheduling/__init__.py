"""Admission as a scheduler: whose request goes next (gateway/routing/admission.py applies it)."""

from gateway.scheduling.demand import RANK, TIERS, Demand
from gateway.scheduling.fair_queue import REFUSAL_REASONS, FairQueue, Refused, RefusalReason, Waiter
from gateway.scheduling.slots import Block, FlowWindow, Occupancy, blocked, borrows, may_preempt_for

__all__ = ["RANK", "REFUSAL_REASONS", "TIERS", "Block", "Demand", "FairQueue", "FlowWindow", "Occupancy", "Refused",
           "RefusalReason", "Waiter", "blocked", "borrows", "may_preempt_for"]
