"""The recent requests the console's Live requests page shows: one record per API request, kept in a
bounded ring in memory (this gateway's only), and streamed live to admin readers."""

from gateway.recent.facts import (
           FACTS_STATE_KEY,
           RECORDED_ROUTES,
           RequestFacts,
           finish_of,
           request_facts,
)
from gateway.recent.query import Filters, may_see, select
from gateway.recent.recorder import finish, start
from gateway.recent.ring import RecentRequests, Subscription

__all__ = ["FACTS_STATE_KEY", "RECORDED_ROUTES", "Filters", "RecentRequests", "RequestFacts", "Subscription",
           "finish", "finish_of", "may_see", "request_facts", "select", "start"]
