"""Validation of a rules file's content (`jobs.lib.rules.files.parse_rules`): each error names the file,
the line or rule, and what is wrong. The format is described in `jobs.lib.rules.files`."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

from jobs.lib.rules.model import (DEFAULT_KEEP, REGEX_KEYS, SECTION_KEYS, UNMATCHED_CHOICES, FORMAT_VERSIONS, SECTIONS,
                                  FieldRules, RegexRule, Rules, normalize)
from orchestrator.core.exceptions import RulesError

__all__ = ["Validator"]

_COLUMN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class Validator:
    def __init__(self, path: Path, text: str, content: dict):
        self.path = path
        self.lines = text.splitlines()
        self.content = content

    # -- error reporting -----------------------------------------------------------------------
    def fail(self, where: str, what: str, line: int | None = None) -> None:
        at = f" (line {line})" if line else ""
        raise RulesError(f"rules file {self.path}: {where}{at}: {what}")

    def _section_start(self, header: str) -> int | None:
        pat = re.compile(r"^\s*\[\s*" + re.escape(header).replace(r"\.", r"\s*\.\s*") + r"\s*\]\s*(#.*)?$")
        for i, line in enumerate(self.lines):
            if pat.match(line):
                return i
        return None

    def line_of_key(self, table: str, key: str) -> int | None:
        """Best-effort line of `key` (or of a list item equal to it) inside [table]."""
        start = self._section_start(table)
        first = 0 if start is None else start + 1
        quoted = (json.dumps(key, ensure_ascii=False), f"'{key}'")
        bare = re.compile(r"^\s*" + re.escape(key) + r"\s*=")
        for i in range(first, len(self.lines)):
            line = self.lines[i]
            if start is not None and i > first and re.match(r"^\s*\[", line):
                break
            if any(q in line for q in quoted) or bare.match(line):
                return i + 1
        return None

    def line_of_array_item(self, header: str, index: int) -> int | None:
        pat = re.compile(r"^\s*\[\[\s*" + re.escape(header).replace(r"\.", r"\s*\.\s*") + r"\s*\]\]")
        seen = -1
        for i, line in enumerate(self.lines):
            if pat.match(line):
                seen += 1
                if seen == index:
                    return i + 1
        return None

    def line_of_top(self, key: str) -> int | None:
        bare = re.compile(r"^\s*" + re.escape(key) + r"\s*=")
        for i, line in enumerate(self.lines):
            if re.match(r"^\s*\[", line):
                return None
            if bare.match(line):
                return i + 1
        return None

    def check_keys(self, where: str, table: dict, allowed: set[str], header: str | None = None,
                   line: int | None = None) -> None:
        unknown = sorted(set(table) - allowed)
        if unknown:
            if header is not None:
                line = self.line_of_key(header, unknown[0])
            self.fail(where, f"unknown key {unknown[0]!r}; allowed keys are {', '.join(sorted(allowed))}",
                      line)

    # -- validation ----------------------------------------------------------------------------
    def build(self) -> Rules:
        c = self.content
        if "format_version" not in c:
            self.fail("format_version", f"missing; add `format_version = {max(FORMAT_VERSIONS)}` at the top")
        fv = c["format_version"]
        if type(fv) is not int or fv not in FORMAT_VERSIONS:
            self.fail("format_version", f"unsupported value {fv!r}; this kappa reads format_version = "
                      f"{' or '.join(map(str, FORMAT_VERSIONS))}", self.line_of_top("format_version"))
        top = {"format_version", "description", "normalize"}
        sections = [key for key in c if key not in top]
        for key in sections:
            if fv == 1 and key not in SECTIONS:
                self.fail(key, f"unknown top-level key; allowed keys are {', '.join(sorted(top | set(SECTIONS)))} "
                          f"(format_version = 2 allows any section that names its column)",
                          self.line_of_top(key) or self.line_of_key(key, key))
            if fv == 2 and not isinstance(c[key], dict):
                self.fail(key, f"unknown top-level key; allowed keys are {', '.join(sorted(top))} and field "
                          f"sections ([<section>] with column = \"<column>\")", self.line_of_top(key))
        if "description" in c and not isinstance(c["description"], str):
            self.fail("description", "must be a string", self.line_of_top("description"))
        keep = DEFAULT_KEEP
        if "normalize" in c:
            norm = c["normalize"]
            if not isinstance(norm, dict):
                self.fail("normalize", "must be a table", self.line_of_top("normalize"))
            self.check_keys("normalize", norm, {"keep"}, header="normalize")
            keep = norm.get("keep", DEFAULT_KEEP)
            if not isinstance(keep, str):
                self.fail("normalize.keep", "must be a string of characters",
                          self.line_of_key("normalize", "keep"))
        if not sections:
            self.fail("rules", "no rules: add at least one section" + (
                f" of {', '.join(f'[{s}]' for s in SECTIONS)}" if fv == 1 else
                " ([<section>] with column = \"<column>\" and its exact, aliases or regex rules)"))
        fields = {s: self.section(s, c[s], keep, self.column_of(s, c[s], fv)) for s in sections}
        taken: dict[str, str] = {}
        for s, f in fields.items():
            if f.column_name in taken:
                self.fail(f"{s}.column", f"column {f.column_name!r} is already the column of [{taken[f.column_name]}]; "
                          f"a column is standardized by one section", self.line_of_key(s, "column"))
            taken[f.column_name] = s
        canonical = json.dumps(c, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)
        digest = hashlib.sha256(canonical.encode("utf-8")).hexdigest()
        return Rules(self.path, c, fields, digest)

    def column_of(self, name: str, sec: Any, fv: int) -> str:
        """The column a section standardizes: its ``column`` (required from format 2), else format 1's."""
        if not isinstance(sec, dict) or "column" not in sec:
            if fv == 1:
                return SECTIONS[name]
            self.fail(name, "names no column: add column = \"<the column it standardizes>\" to the section",
                      self.line_of_top(name) or (self._section_start(name) or 0) + 1)
        col = sec["column"]
        if not isinstance(col, str) or not _COLUMN.match(col) or col.endswith("_raw"):
            self.fail(f"{name}.column", f"must be a column name (letters, digits, underscores, not ending in _raw: "
                      f"the raw value is kept as <column>_raw), got {col!r}", self.line_of_key(name, "column"))
        return col

    def section(self, name: str, sec: Any, keep: str, column: str) -> FieldRules:
        if not isinstance(sec, dict):
            self.fail(name, f"must be a table ([{name}]), got {type(sec).__name__}", self.line_of_top(name))
        self.check_keys(name, sec, SECTION_KEYS | {"column"}, header=name)
        unmatched = sec.get("unmatched", "keep")
        if unmatched not in UNMATCHED_CHOICES:
            self.fail(f"{name}.unmatched", f"must be one of {', '.join(map(repr, UNMATCHED_CHOICES))}, got {unmatched!r}",
                      self.line_of_key(name, "unmatched"))

        lookup: dict[str, str] = {}
        origin: dict[str, str] = {}

        def add(spelling: Any, canonical: str, where: str, table: str) -> None:
            if not isinstance(spelling, str):
                self.fail(where, f"a spelling must be a string, got {type(spelling).__name__} {spelling!r}",
                          self.line_of_key(table, str(spelling)))
            key = normalize(spelling, keep)
            if not key:
                self.fail(where, f"spelling {spelling!r} is empty after normalisation",
                          self.line_of_key(table, spelling))
            prev = lookup.get(key)
            if prev is not None and prev != canonical:
                self.fail(where, f"spelling {spelling!r} (normalised {key!r}) maps to {canonical!r} but "
                          f"{origin[key]} already maps it to {prev!r}; a spelling must map to one canonical "
                          f"value: remove one of them", self.line_of_key(table, spelling))
            if prev is None:
                lookup[key] = canonical
                origin[key] = where

        exact = sec.get("exact", {})
        if not isinstance(exact, dict):
            self.fail(f"{name}.exact", "must be a table of \"spelling\" = \"Canonical\"",
                      self.line_of_key(name, "exact"))
        for spelling, canonical in exact.items():
            where = f"{name}.exact[{json.dumps(spelling, ensure_ascii=False)}]"
            if not isinstance(canonical, str) or not canonical.strip():
                self.fail(where, f"canonical value must be a non-empty string, got {canonical!r}",
                          self.line_of_key(f"{name}.exact", spelling))
            add(spelling, canonical, where, f"{name}.exact")

        aliases = sec.get("aliases", {})
        if not isinstance(aliases, dict):
            self.fail(f"{name}.aliases", "must be a table of \"Canonical\" = [\"spelling\", ...]",
                      self.line_of_key(name, "aliases"))
        for canonical, spellings in aliases.items():
            base = f"{name}.aliases[{json.dumps(canonical, ensure_ascii=False)}]"
            if not canonical.strip():
                self.fail(base, "canonical value must not be blank", self.line_of_key(f"{name}.aliases", canonical))
            if not isinstance(spellings, list):
                self.fail(base, f"must be a list of spellings, got {type(spellings).__name__}",
                          self.line_of_key(f"{name}.aliases", canonical))
            add(canonical, canonical, base, f"{name}.aliases")
            for i, spelling in enumerate(spellings):
                add(spelling, canonical, f"{base}[{i}]", f"{name}.aliases")

        regex = sec.get("regex", [])
        if not isinstance(regex, list):
            self.fail(f"{name}.regex", "must be an array of tables ([[" + name + ".regex]])",
                      self.line_of_key(name, "regex"))
        rules: list[RegexRule] = []
        for i, item in enumerate(regex):
            where = f"{name}.regex[{i}]"
            line = self.line_of_array_item(f"{name}.regex", i)
            if not isinstance(item, dict):
                self.fail(where, f"must be a table with pattern, canonical, priority, got {item!r}", line)
            self.check_keys(where, item, REGEX_KEYS, line=line)
            for key, typ in (("pattern", str), ("canonical", str)):
                if key not in item:
                    self.fail(where, f"missing {key!r}", line)
                if not isinstance(item[key], typ) or not item[key]:
                    self.fail(where, f"{key} must be a non-empty string, got {item[key]!r}", line)
            priority = item.get("priority", 0)
            if type(priority) is not int:
                self.fail(where, f"priority must be an integer, got {type(priority).__name__} {priority!r}", line)
            try:
                compiled = re.compile(item["pattern"])
            except re.error as e:
                self.fail(where, f"bad regex {item['pattern']!r}: {e}", line)
            rules.append(RegexRule(i, compiled, item["canonical"], priority))
        rules.sort(key=lambda r: (-r.priority, r.index))
        return FieldRules(name, lookup, tuple(rules), unmatched, keep, column)
