"""Tenancy: keys with roles, models, limits and budgets; usage per key, model and day.

Pure decisions (`keys`, `limits`, `access`) with table tests; the side effects in `service`
(authenticate, reserve, settle, buffer), behind one store contract (`store`) with an embedded
SQLite and a shared Redis implementation; `middleware` is the ASGI seam."""
