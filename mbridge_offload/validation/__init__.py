"""Validation before any launch: the rule table (one module per concern, gathered in ``registry``),
upstream ``ConfigContainer.validate()`` translated (``upstream``), and the report of both (``checks``).

Importing this package is cheap: Megatron loads only when upstream validation runs.
"""

from mbridge_offload.validation.checks import check_rules, validate
from mbridge_offload.validation.problem import Problem, Report
from mbridge_offload.validation.registry import RULES, RULES_BY_ID, rules_markdown
from mbridge_offload.validation.rule import Context, Rule

__all__ = ["validate", "check_rules", "Problem", "Report", "Rule", "Context", "RULES", "RULES_BY_ID",
           "rules_markdown"]
