"""The one flag hot paths read: `if switch.ON:` costs a module attribute load when tracing is off,
and no span object, context or attribute dict is made. Set once, by `setup.configure`."""

ON: bool = False
CAPTURE_CONTENT: bool = False
"""Prompt and completion text on the attempt spans (OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT)."""
