"""Standardization rules, the model: versioned TOML files that map raw values of named columns to canonical ones.

A rules file is `<rules location>/<ruleset>/<version>.toml` (standardize: ruleset "titles", versions
"v1", "v2", ...); the location is the setting `rules_location` (a local folder or file:// URI such
as a team's repository), else the examples kappa ships in `jobs/rules/`. A file is validated before
a job starts, so a bad file fails the deploy naming the file, the line or the rule, and nothing is
written. Deploy stores the text with the version (`orchestrator.jobctl.version_rules`); every
later start of that version uses it, never the file as it is by then.

Format (format_version 2; 1 is read too)::

    format_version = 2                       # required: 2, or 1 (below)
    description = "what changed and why"     # optional

    [normalize]                              # optional
    keep = "+#"                              # punctuation kept by normalisation (default "+#")

    [titles]                                 # one section per column, any name
    column = "title"                         # the column it standardizes (its raw value: title_raw)
    unmatched = "keep"                       # "keep" (default): the raw value with its whitespace
                                             #   collapsed; "null": null

    [titles.exact]                           # normalised spelling -> canonical value
    "swe" = "Software Engineer"

    [titles.aliases]                         # canonical value -> list of spellings
    "Senior Software Engineer" = ["Sr. Software Engineer", "senior swe"]

    [[titles.regex]]                         # tried when no exact map or alias matched
    pattern = '^(sr|senior) .*engineer$'     # Python regex, searched in the normalised value
    canonical = "Senior Software Engineer"
    priority = 10                            # higher first; equal priorities in file order

Format 1 (the shipped `titles/v1.toml` and `v2.toml`) is the same without ``column``: its sections
are ``[titles]`` (column ``title``) and ``[companies]`` (column ``company``) only. A job applies
the rules with `Rules.apply` (every section on its column) or `Rules.column` (one section's
expression); `kappa rules preview` compares each section's ``<column>_raw`` and ``<column>`` in the
served table.

Normalisation, applied to raw values and to every spelling in the file alike: Unicode NFKC,
case folding, every character that is not a letter, digit, combining mark or one of `keep`
becomes a space, runs of whitespace collapse to one space, ends stripped. So "Sr.  SOFTWARE
engineer" and "sr software engineer" are the same spelling. A canonical value is also an
implicit alias of itself.

Lookup order for one value: exact maps and aliases (one table; a spelling that would map to two
canonical values is an error), then regex rules by priority, then the `unmatched` policy.
Null or blank raw values become null.

`Rules.content_hash` is the sha256 of the parsed content in canonical JSON (sorted keys), so
comments and formatting do not change it; any change to a mapping does.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any


__all__ = ["FORMAT_VERSION", "FORMAT_VERSIONS", "RULES_DIR", "SECTIONS", "normalize", "RegexRule", "FieldRules", "Rules",
           "java_regex"]

FORMAT_VERSION = 2
#: The formats this kappa reads: 1 (sections titles and companies, their columns implied) and 2.
FORMAT_VERSIONS = (1, 2)
RULES_DIR = Path(__file__).resolve().parents[2] / "rules"

#: Format 1's sections and the column each one standardizes (format 2 names it in the section).
SECTIONS = {"titles": "title", "companies": "company"}

NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")
SECTION_KEYS = {"unmatched", "exact", "aliases", "regex"}
REGEX_KEYS = {"pattern", "canonical", "priority"}
UNMATCHED_CHOICES = ("keep", "null")
DEFAULT_KEEP = "+#"
_CACHE_LIMIT = 200_000


def normalize(value: str, keep: str = DEFAULT_KEEP) -> str:
    """The lookup form of a spelling (see the module docstring)."""
    folded = unicodedata.normalize("NFKC", value).casefold()
    chars = [
        ch if (ch.isalnum() or ch in keep or unicodedata.category(ch)[0] == "M") else " "
        for ch in folded
    ]
    return " ".join("".join(chars).split())


@dataclass(frozen=True)
class RegexRule:
    index: int  # position in the file's [[<section>.regex]] list
    pattern: re.Pattern
    canonical: str
    priority: int


@dataclass(frozen=True)
class FieldRules:
    """The compiled rules of one section (titles or companies)."""

    section: str
    lookup: dict[str, str]
    regex: tuple[RegexRule, ...]  # sorted: priority descending, then file order
    unmatched: str
    keep: str
    column_name: str = ""   # the column this section standardizes

    def column(self, raw: Any) -> Any:
        """These rules as a Spark expression over the string column `raw`, evaluated in the JVM but for
        the normalisation (Unicode NFKC and case folding, which Spark has no function for): a pandas
        UDF that normalises each distinct value of its input once. The exact and alias spellings are
        a map lookup, the regex rules ``rlike`` in priority order (`java_regex`: Python's syntax and
        classes in Java's regex), the ``keep`` policy a whitespace collapse. Equal to
        `standardize` on every value (tests/unit/standardize/test_standardize_rules_spark.py)."""
        from pyspark.sql import functions as F

        key = _normalizer(self.keep)(raw)
        out = F.lit(None).cast("string")
        if self.unmatched == "keep":
            out = F.trim(F.regexp_replace(raw, _PY_WHITESPACE, " "))
        for rule in reversed(self.regex):
            out = F.when(key.rlike(java_regex(rule.pattern.pattern)), F.lit(rule.canonical)).otherwise(out)
        if self.lookup:
            pairs = [F.lit(x) for k, v in sorted(self.lookup.items()) for x in (k, v)]
            out = F.coalesce(F.try_element_at(F.create_map(*pairs), key), out)
        return F.when(raw.isNull() | (key == ""), F.lit(None).cast("string")).otherwise(out)

    def standardize(self, raw: str | None) -> str | None:
        if raw is None:
            return None
        key = normalize(raw, self.keep)
        if not key:
            return None
        hit = self.lookup.get(key)
        if hit is not None:
            return hit
        for rule in self.regex:
            if rule.pattern.search(key):
                return rule.canonical
        return " ".join(raw.split()) if self.unmatched == "keep" else None


#: What Python's str.split() splits on, as a Java regex: Unicode White_Space and U+001C..U+001F, which
#: Python counts as whitespace and Unicode does not.
_PY_WHITESPACE = r"(?U)[\s\x{1c}-\x{1f}]+"

#: Python's \w on str (``c.isalnum() or c == "_"``) and \s (``c.isspace()``) as Java class bodies:
#: Java's (?U) \w also takes in combining marks, and its \s leaves out U+001C..U+001F.
_WORD = r"\p{L}\p{N}_"
_SPACE = r"\s\x{1c}-\x{1f}"
_OUTSIDE = {"w": f"[{_WORD}]", "W": f"[^{_WORD}]", "s": f"[{_SPACE}]", "S": f"[^{_SPACE}]", "Z": r"\z",
            "b": f"(?:(?<=[{_WORD}])(?![{_WORD}])|(?<![{_WORD}])(?=[{_WORD}]))",
            "B": f"(?:(?<=[{_WORD}])(?=[{_WORD}])|(?<![{_WORD}])(?![{_WORD}]))"}
_INSIDE = {"w": _WORD, "W": f"[^{_WORD}]", "s": _SPACE, "S": f"[^{_SPACE}]", "b": r"\x{08}"}


def java_regex(pattern: str) -> str:
    """A Python str regex as a Java regex that finds the same matches: Unicode classes and case
    (``(?U)``), ``.`` and ``$`` about \\n only (``(?d)``, as Python), Python's \\w, \\W, \\s,
    \\S, \\b, \\B and \\Z spelled out, ``\\uXXXX``/``\\UXXXXXXXX`` as ``\\x{...}``, named groups
    ``(?P<n>...)``/``(?P=n)``, ``{,n}``, and a ``[``, ``&`` or leading ``]`` inside a class taken
    literally (Java reads them as nested classes and intersections)."""
    out, i, n, in_class = ["(?Ud)"], 0, len(pattern), False
    while i < n:
        c = pattern[i]
        if c == "\\" and i + 1 < n:
            e = pattern[i + 1]
            if e in "uU":
                width = 4 if e == "u" else 8
                out.append("\\x{" + pattern[i + 2:i + 2 + width] + "}")
                i += 2 + width
                continue
            table = _INSIDE if in_class else _OUTSIDE
            out.append(table.get(e, "\\" + e))
            i += 2
            continue
        if in_class:
            if c == "]":
                in_class = False
                out.append(c)
            elif c in "[&":
                out.append("\\" + c)
            else:
                out.append(c)
            i += 1
            continue
        if c == "[":
            in_class = True
            out.append(c)
            i += 1
            if i < n and pattern[i] == "^":
                out.append("^")
                i += 1
            if i < n and pattern[i] == "]":
                out.append("\\]")
                i += 1
            continue
        if pattern.startswith("(?P<", i):
            out.append("(?<")
            i += 4
            continue
        if pattern.startswith("(?P=", i):
            end = pattern.index(")", i)
            out.append("\\k<" + pattern[i + 4:end] + ">")
            i = end + 1
            continue
        m = re.match(r"\{,(\d+)\}", pattern[i:])
        if m:
            out.append("{0," + m.group(1) + "}")
            i += m.end()
            continue
        out.append(c)
        i += 1
    return "".join(out)


def _normalizer(keep: str):
    """A pandas UDF: `normalize` of each distinct value of a string column (nulls stay null)."""
    import pandas as pd
    from pyspark.sql import functions as F
    from pyspark.util import PythonEvalType

    def normalize_column(values: pd.Series) -> pd.Series:
        distinct = values.dropna().unique()
        out = values.map({v: normalize(v, keep) for v in distinct}).astype(object)
        return out.where(values.notna(), None)   # all-null input maps to floats (NaN): nulls again

    return F.pandas_udf(normalize_column, "string", PythonEvalType.SQL_SCALAR_PANDAS_UDF)


class Rules:
    """A validated rules file. Build it with `load_rules(path)`."""

    def __init__(self, path: Path, content: dict, fields: dict[str, FieldRules], content_hash: str):
        self.path = path
        self.content = content
        self.fields = fields
        self.content_hash = content_hash
        self.description: str = content.get("description", "")
        self._caches: dict[str, dict[str | None, str | None]] = {s: {} for s in fields}

    def __repr__(self) -> str:
        return f"Rules({str(self.path)!r}, hash={self.content_hash[:12]})"

    @property
    def version(self) -> str:
        return self.path.stem

    def standardize(self, section: str, raw: str | None) -> str | None:
        """Canonical value of one raw value; a section the file does not have keeps values as they are."""
        field = self.fields.get(section)
        if field is None:
            return raw
        cache = self._caches[section]
        try:
            return cache[raw]
        except KeyError:
            pass
        out = field.standardize(raw)
        if len(cache) >= _CACHE_LIMIT:
            cache.clear()
        cache[raw] = out
        return out

    def column(self, section: str, raw: Any) -> Any:
        """The Spark expression of `standardize` over the column `raw` (`FieldRules.column`), made once per
        Spark context for each section and input expression (`jobs.lib.runtime.columns`: a section's
        lookup map alone is a JVM round trip per spelling, and a job asks for it every micro-batch). The
        input is told apart by its expression as Spark prints it without its call site: a column by name
        (``UnresolvedAttribute(List(title_raw), ...)``) is the same for every batch, a column of one
        DataFrame (``ExpressionColumnNode(title_raw#12, ...)``) is not, and gets its own."""
        from jobs.lib.runtime.columns import built_once

        field = self.fields.get(section)
        if field is None:
            return raw
        return built_once(("rules", self.content_hash, section, raw._jc.node().normalized().toString()),
                          lambda: field.column(raw))

    @property
    def columns(self) -> dict[str, str]:
        """Each section's column: {section: column}."""
        return {s: f.column_name for s, f in self.fields.items()}

    def apply(self, df: Any) -> Any:
        """Every section on its column of `df`: ``<column>`` standardized from ``<column>_raw`` (made
        from ``<column>`` when the frame has no raw column yet). Sections whose column `df` lacks are
        skipped; the frame's column order is kept, a new column goes last."""
        from pyspark.sql import functions as F

        for section, col in self.columns.items():
            raw = f"{col}_raw"
            if raw not in df.columns:
                if col not in df.columns:
                    continue
                df = df.withColumn(raw, F.col(col))
            df = df.withColumn(col, self.column(section, F.col(raw)))
        return df

    def standardize_title(self, raw: str | None) -> str | None:
        return self.standardize("titles", raw)

    def standardize_company(self, raw: str | None) -> str | None:
        return self.standardize("companies", raw)

    def standardize_array(self, section: str, values):
        """Standardize a pyarrow string array, computing each distinct value once.

        Runs on the driver inside a micro-batch: the distinct values of a batch are few, so the
        Python work is proportional to them, not to the rows.
        """
        import pyarrow as pa
        import pyarrow.compute as pc

        if section not in self.fields:
            return values
        if isinstance(values, pa.ChunkedArray):
            values = values.combine_chunks()
        encoded = pc.dictionary_encode(values)
        mapped = pa.array([self.standardize(section, v) for v in encoded.dictionary.to_pylist()],
                          type=pa.string())
        return mapped.take(encoded.indices)
