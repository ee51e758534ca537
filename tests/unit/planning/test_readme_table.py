from tests.unit.planning.readme_table import readme_table, table


def test_readme_planning_table_is_generated_from_the_scenarios() -> None:
    # regenerate with: python -m tests.unit.planning.readme_table --write
    assert readme_table() == table()
