"""Preemption: which streams may be cut and resumed, the body that resumes one, and the splice that makes
its segments one client stream. Pure; gateway/api/resume.py runs it, gateway/routing/admission.py decides
whom to cut."""

from gateway.preemption.resume import resumable, resume_body
from gateway.preemption.splice import Splice

__all__ = ["Splice", "resumable", "resume_body"]
