"""Cache-aware routing: where each replica's prompt cache holds what, and what a request costs where.

Pure decisions (table-tested): `blocks` (a prompt's chained block hashes), `index` (an approximate
prefix index per replica, bounded and aging, corrected by what the engine reports), `slots` (which
llama-server slot holds a session's KV), `cost` (expected wait against recomputing the uncached
prompt). Side effects live in `tracker` (one per replica: feeds the pure parts) and `kv_events`
(vLLM's own KV cache events over ZMQ: the precise mode).
"""
