from tests.unit.planning.planning_table import page_table, table


def test_docs_planning_table_is_generated_from_the_scenarios() -> None:
    assert page_table() == table(), "docs/planning.md's table is out of date: run python -m gateway.docgen"
