"""What every check of this project reports: a ``Problem`` (key, value, rule, fix) and the ``Report``
of one command. Rules of the rule table, the planner's checks and upstream's translated errors all
produce the same type."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    key: str
    value: str
    rule: str
    fix: str
    severity: str = "error"
    rule_id: str = ""
    source: str = "plugin"  # "plugin" (rule table) or "upstream" (ConfigContainer.validate)
    origin: str = ""  # an upstream message with no rule: where it came from ("upstream: <function> / <section>")

    def format(self) -> str:
        if not self.rule_id and self.origin:  # upstream's own words, whole: no rule of ours states it
            head = f"{self.severity.upper():7} [{self.origin}]" + (f" {self.key} = {self.value}" if self.key else "")
            said = "\n                  ".join(self.rule.strip().splitlines())
            return (f"{head}\n"
                    f"        upstream: {said}\n"
                    f"        fix:  {self.fix}")
        tag = self.rule_id or self.source
        return (f"{self.severity.upper():7} [{tag}] {self.key} = {self.value}\n"
                f"        rule: {self.rule}\n"
                f"        fix:  {self.fix}")


@dataclass(frozen=True)
class Report:
    num_gpus: int
    problems: tuple[Problem, ...]

    def __post_init__(self):
        # each problem once: the planner refuses a config it cannot model with the validator's own rules
        # (planning/plannable.py), which a dry run has already reported
        seen, kept = set(), []
        for p in self.problems:
            said = (p.rule_id, p.key, p.value, p.severity)
            if not p.rule_id or said not in seen:
                seen.add(said)
                kept.append(p)
        object.__setattr__(self, "problems", tuple(kept))

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == "error"]

    @property
    def warnings(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == "warning"]

    @property
    def ok(self) -> bool:
        return not self.errors

    def format(self) -> str:
        n_err, n_warn = len(self.errors), len(self.warnings)
        head = (f"Validation for {self.num_gpus} GPU{'s' if self.num_gpus != 1 else ''}: "
                f"{'OK' if self.ok else 'FAILED'} ({n_err} error{'s' if n_err != 1 else ''}, "
                f"{n_warn} warning{'s' if n_warn != 1 else ''})")
        return "\n".join([head] + ["  " + p.format() for p in self.errors + self.warnings])
