"""The rule table as a whole: ids unique, the keys' admissible values (facts.key_ranges) among its
rules with the same words, and the README carrying the table it generates."""

from __future__ import annotations

from pathlib import Path

from mbridge_offload.facts.key_ranges import KEY_RANGES
from mbridge_offload.validation import RULES, RULES_BY_ID, rules_markdown

REPO = Path(__file__).resolve().parents[2]


def test_rule_ids_are_unique():
    assert len(RULES_BY_ID) == len(RULES)


def test_every_key_range_is_a_rule_of_the_table():
    for key_range in KEY_RANGES:
        rule = RULES_BY_ID[key_range.id]
        assert (rule.key, rule.text, rule.applies(None)) == (key_range.key, key_range.text, True)


def test_rules_table_names_every_rule_and_readme_carries_it():
    table = rules_markdown()
    for rule in RULES:
        assert rule.text in table
    readme = (REPO / "README.md").read_text()
    assert table in readme, "README's rule table is stale: paste `run_recipe.py --rules` into it"
