from gateway.identity import Caller, caller_of, set_caller


def test_no_caller_without_keys() -> None:
    assert caller_of({"type": "http"}) is None
    assert caller_of({"type": "http", "state": {}}) is None
    assert caller_of({"type": "http", "state": {"caller": "not a caller"}}) is None


def test_caller_set_and_read_through_the_scope() -> None:
    scope: dict = {"type": "http"}
    set_caller(scope, Caller("team-a", role="admin", weight=2.0))
    caller = caller_of(scope)
    assert caller == Caller("team-a", role="admin", weight=2.0)
    assert caller is not None and caller.is_admin
    assert not Caller("team-b").is_admin
