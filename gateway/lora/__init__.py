"""LoRA adapters served as models of their own: what they cost the plan (memory, the engine that can
select one per request) and where a request for one goes among replicas (docs/lora.md)."""
