"""Rules files: parsing, validation errors that name the file, line or rule, and standardization."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pyarrow as pa
import pytest

from jobs.lib.rules.files import available_rules, load_rules, normalize, rules_path
from orchestrator.core.exceptions import RulesError

MINIMAL = """\
format_version = 1

[titles.aliases]
"Software Engineer" = ["swe", "software developer"]
"""


def write(tmp_path: Path, text: str, name: str = "rules.toml") -> Path:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


def error_of(path: Path) -> str:
    with pytest.raises(RulesError) as e:
        load_rules(path)
    return str(e.value)


# -- shipped rules ------------------------------------------------------------------------------

def test_shipped_rulesets_load_and_differ():
    assert available_rules("titles")[:2] == ["v1", "v2"]
    v1, v2 = load_rules(rules_path("titles", "v1")), load_rules(rules_path("titles", "v2"))
    assert re.fullmatch(r"[0-9a-f]{64}", v1.content_hash)
    assert v1.content_hash != v2.content_hash
    assert v1.version == "v1" and v2.version == "v2"


@pytest.mark.parametrize("raw, v1, v2", [
    ("Sr. Software Engineer", "Software Engineer", "Senior Software Engineer"),
    ("Senior SWE", "Senior SWE", "Senior Software Engineer"),
    ("sr software eng", "sr software eng", "Senior Software Engineer"),
    ("Software Dev", "Software Dev", "Software Engineer"),
    ("Software Developer", "Software Developer", "Software Engineer"),
    ("Ingénieur logiciel", "Ingénieur logiciel", "Software Engineer"),
    ("ソフトウェアエンジニア", "ソフトウェアエンジニア", "Software Engineer"),
    ("Инженер-программист", "Инженер-программист", "Software Engineer"),
    ("  SOFTWARE   engineer ", "Software Engineer", "Software Engineer"),
    ("Summer Intern", "Intern", "Intern"),
    ("Chief  Happiness Officer 🎉", "Chief Happiness Officer 🎉", "Chief Happiness Officer 🎉"),
    (None, None, None),
    ("   ", None, None),
])
def test_shipped_title_rules(raw, v1, v2):
    assert load_rules(rules_path("titles", "v1")).standardize_title(raw) == v1
    assert load_rules(rules_path("titles", "v2")).standardize_title(raw) == v2


def test_shipped_company_rules():
    v2 = load_rules(rules_path("titles", "v2"))
    assert v2.standardize_company("ACME Corp.") == "Acme Corporation"
    assert v2.standardize_company("Mueller GmbH") == "Müller GmbH"
    assert v2.standardize_company("Wayne Ent.") == "Wayne Enterprises"
    assert load_rules(rules_path("titles", "v1")).standardize_company("Wayne Ent.") == "Wayne Ent."


# -- normalisation and lookup order --------------------------------------------------------------

def test_normalize():
    assert normalize("Sr.  SOFTWARE\tengineer!") == "sr software engineer"
    assert normalize("C++ / C# Developer") == "c++ c# developer"
    assert normalize("ＳＷＥ") == "swe"  # NFKC: full-width letters
    assert normalize("Straße") == "strasse"  # case folding
    assert normalize("इंजीनियर") == "इंजीनियर"  # combining marks are kept
    assert normalize("...") == ""


def test_lookup_order_exact_then_regex_by_priority_then_unmatched(tmp_path):
    rules = load_rules(write(tmp_path, """\
format_version = 1
[titles]
unmatched = "null"
[titles.exact]
"lead engineer" = "Lead Engineer"
[[titles.regex]]
pattern = 'engineer'
canonical = "Engineer"
priority = 1
[[titles.regex]]
pattern = '^lead'
canonical = "Lead"
priority = 5
[[titles.regex]]
pattern = '^lead eng'
canonical = "Lead (tie, later in file)"
priority = 5
"""))
    assert rules.standardize_title("Lead Engineer") == "Lead Engineer"          # exact beats regex
    assert rules.standardize_title("lead engineering") == "Lead"               # priority 5, first in file
    assert rules.standardize_title("civil engineer") == "Engineer"
    assert rules.standardize_title("plumber") is None                          # unmatched = "null"
    assert rules.standardize_company("Anything Inc") == "Anything Inc"         # no [companies]: unchanged


def test_standardize_array_maps_distinct_values_and_keeps_nulls():
    rules = load_rules(rules_path("titles", "v2"))
    values = pa.array(["SWE", None, "Senior SWE", "SWE", "Nurse", None, "SWE"])
    out = rules.standardize_array("titles", values)
    assert out.to_pylist() == ["Software Engineer", None, "Senior Software Engineer", "Software Engineer",
                               "Nurse", None, "Software Engineer"]
    chunked = pa.chunked_array([values.slice(0, 3), values.slice(3)])
    assert rules.standardize_array("titles", chunked).to_pylist() == out.to_pylist()


def test_content_hash_ignores_formatting_but_not_content(tmp_path):
    a = load_rules(write(tmp_path, MINIMAL, "a.toml"))
    b = load_rules(write(tmp_path, "# a comment\n\n" + MINIMAL.replace(" = [", "=[") + "\n\n", "b.toml"))
    c = load_rules(write(tmp_path, MINIMAL.replace('"swe", ', ""), "c.toml"))
    assert a.content_hash == b.content_hash
    assert a.content_hash != c.content_hash


# -- validation errors --------------------------------------------------------------------------

def test_toml_syntax_error_names_file_and_line(tmp_path):
    p = write(tmp_path, MINIMAL + '"Data Scientist" = "ds" "x"\n"Nurse" = ["rn"]\n')
    assert error_of(p) == (f"rules file {p}: TOML syntax error: Expected newline or end of document after a "
                           f"statement (at line 5, column 25)")


def test_bad_regex_names_rule_and_line(tmp_path):
    p = write(tmp_path, MINIMAL + """
[[titles.regex]]
pattern = 'engineer$'
canonical = "Engineer"

[[titles.regex]]
pattern = '(sr|senior'
canonical = "Senior"
""")
    assert error_of(p) == (f"rules file {p}: titles.regex[1] (line 10): bad regex '(sr|senior': "
                           f"missing ), unterminated subpattern at position 0")


def test_alias_mapping_to_two_canonical_values(tmp_path):
    p = write(tmp_path, MINIMAL + '"Senior Software Engineer" = ["senior swe", "Software  Developer"]\n')
    assert error_of(p) == (
        f"rules file {p}: titles.aliases[\"Senior Software Engineer\"][1] (line 5): spelling "
        f"'Software  Developer' (normalised 'software developer') maps to 'Senior Software Engineer' but "
        f"titles.aliases[\"Software Engineer\"][1] already maps it to 'Software Engineer'; a spelling must "
        f"map to one canonical value: remove one of them")


def test_exact_map_conflicting_with_alias(tmp_path):
    assert load_rules(write(tmp_path, MINIMAL + '[titles.exact]\n"S.W.E." = "Engineer"\n')).standardize_title(
        "s w e") == "Engineer"  # "s w e" is another spelling than "swe"
    p = write(tmp_path, MINIMAL + '[titles.exact]\n"SWE!" = "Engineer"\n')
    assert error_of(p) == (
        f"rules file {p}: titles.aliases[\"Software Engineer\"][0] (line 4): spelling 'swe' (normalised 'swe') "
        f"maps to 'Software Engineer' but titles.exact[\"SWE!\"] already maps it to 'Engineer'; a spelling "
        f"must map to one canonical value: remove one of them")


def test_unknown_keys(tmp_path):
    p = write(tmp_path, MINIMAL.replace("format_version = 1\n", "format_version = 1\nversoin = 2\n"))
    assert error_of(p) == (f"rules file {p}: versoin (line 2): unknown top-level key; allowed keys are "
                           f"companies, description, format_version, normalize, titles (format_version = 2 allows "
                           f"any section that names its column)")
    p = write(tmp_path, MINIMAL.replace("[titles.aliases]", "[titles]\nunmatch = 'keep'\n[titles.aliases]"))
    assert error_of(p) == (f"rules file {p}: titles (line 4): unknown key 'unmatch'; allowed keys are "
                           f"aliases, column, exact, regex, unmatched")
    p = write(tmp_path, MINIMAL + "[[titles.regex]]\npattern = 'x'\ncanonical = 'X'\nprio = 3\n")
    assert error_of(p) == (f"rules file {p}: titles.regex[0] (line 5): unknown key 'prio'; allowed keys "
                           f"are canonical, pattern, priority")


def test_wrong_types(tmp_path):
    p = write(tmp_path, MINIMAL + "[[titles.regex]]\npattern = 'x'\ncanonical = 'X'\npriority = 'high'\n")
    assert error_of(p) == (f"rules file {p}: titles.regex[0] (line 5): priority must be an integer, "
                           f"got str 'high'")
    p = write(tmp_path, MINIMAL + '"Data Scientist" = "ds"\n')
    assert error_of(p) == (f"rules file {p}: titles.aliases[\"Data Scientist\"] (line 5): must be a list "
                           f"of spellings, got str")
    p = write(tmp_path, MINIMAL + '"Data Scientist" = ["ds", 7]\n')
    assert error_of(p).startswith(f"rules file {p}: titles.aliases[\"Data Scientist\"][1]")
    assert error_of(p).endswith("a spelling must be a string, got int 7")
    p = write(tmp_path, MINIMAL + "[[titles.regex]]\ncanonical = 'X'\n")
    assert error_of(p) == f"rules file {p}: titles.regex[0] (line 5): missing 'pattern'"
    p = write(tmp_path, MINIMAL.replace("[titles.aliases]", "[titles]\nunmatched = 'drop'\n[titles.aliases]"))
    assert error_of(p) == (f"rules file {p}: titles.unmatched (line 4): must be one of 'keep', 'null', "
                           f"got 'drop'")


def test_format_version(tmp_path):
    p = write(tmp_path, MINIMAL.replace("format_version = 1\n", ""))
    assert error_of(p) == f"rules file {p}: format_version: missing; add `format_version = 2` at the top"
    p = write(tmp_path, MINIMAL.replace("format_version = 1", "format_version = 3"))
    assert error_of(p) == (f"rules file {p}: format_version (line 1): unsupported value 3; this kappa "
                           f"reads format_version = 1 or 2")


def test_format_2_sections_name_the_column_they_standardize(tmp_path):
    """Any section, for any job: each names its column; format 1's files keep working, their
    columns implied (titles -> title, companies -> company), their hashes unchanged."""
    p = write(tmp_path, 'format_version = 2\n[plans]\ncolumn = "plan"\n[plans.aliases]\n"Pro" = ["professional", "pro+"]\n'
                        '[regions]\ncolumn = "region"\nunmatched = "null"\n[regions.exact]\n"emea" = "EMEA"\n')
    rules = load_rules(p)
    assert rules.columns == {"plans": "plan", "regions": "region"}
    assert (rules.standardize("plans", "PROFESSIONAL"), rules.standardize("regions", "apac")) == ("Pro", None)
    assert rules.standardize("regions", " Emea ") == "EMEA"
    shipped = load_rules(rules_path("titles", "v1"))
    assert shipped.columns == {"titles": "title", "companies": "company"}
    p = write(tmp_path, 'format_version = 2\n[plans]\n[plans.exact]\n"p" = "P"\n')
    assert error_of(p) == (f"rules file {p}: plans (line 2): names no column: add column = \"<the column it "
                           f"standardizes>\" to the section")
    p = write(tmp_path, 'format_version = 2\n[a]\ncolumn = "plan"\n[b]\ncolumn = "plan"\n')
    assert error_of(p) == (f"rules file {p}: b.column (line 5): column 'plan' is already the column of [a]; a "
                           f"column is standardized by one section")
    p = write(tmp_path, 'format_version = 2\n[a]\ncolumn = "plan_raw"\n')
    assert error_of(p).startswith(f"rules file {p}: a.column (line 3): must be a column name (letters, digits, "
                                  f"underscores, not ending in _raw")
    p = write(tmp_path, 'format_version = 2\nowner = "ana"\n[a]\ncolumn = "plan"\n')
    assert error_of(p).startswith(f"rules file {p}: owner (line 2): unknown top-level key; allowed keys are "
                                  f"description, format_version, normalize and field sections")


def test_empty_rules_and_blank_spelling(tmp_path):
    p = write(tmp_path, "format_version = 1\n")
    assert error_of(p) == f"rules file {p}: rules: no rules: add at least one section of [titles], [companies]"
    p = write(tmp_path, MINIMAL + '"Data Scientist" = ["..."]\n')
    assert error_of(p) == (f"rules file {p}: titles.aliases[\"Data Scientist\"][0] (line 5): spelling '...' "
                           f"is empty after normalisation")


def test_missing_and_unreadable_files(tmp_path):
    missing = tmp_path / "nope.toml"
    assert error_of(missing) == f"rules file {missing} does not exist; pass an existing file with --rules"
    bad = tmp_path / "latin1.toml"
    bad.write_bytes(b'format_version = 1\n[titles.exact]\n"caf\xe9" = "Cafe"\n')
    assert error_of(bad) == f"rules file {bad}: not UTF-8 (byte 38); save it as UTF-8"


def test_rules_path_names_known_versions_and_refuses_traversal():
    with pytest.raises(RulesError) as e:
        rules_path("titles", "v99")
    assert "ruleset 'titles' has versions v1, v2" in str(e.value)
    with pytest.raises(RulesError) as e:
        rules_path("titles", "../../etc/passwd")
    assert str(e.value).startswith("invalid rules version '../../etc/passwd'")
    with pytest.raises(RulesError):
        rules_path("Titles", "v1")


def test_available_rules_natural_order(tmp_path, monkeypatch):
    import jobs.lib.rules.files as rules_mod

    for v in ("v10", "v2", "v1"):
        shutil.copy(rules_path("titles", "v1"), tmp_path / f"{v}.toml")
    monkeypatch.setattr(rules_mod, "RULES_DIR", tmp_path.parent)
    # through the module: other tests may have re-imported jobs.lib.rules.files since this file imported from it
    assert rules_mod.available_rules(tmp_path.name) == ["v1", "v2", "v10"]
    assert rules_mod.available_rules("no_such_ruleset") == []


def test_python_regex_syntax_and_classes_are_spelled_out_for_java():
    from jobs.lib.rules.files import java_regex

    word = r"[\p{L}\p{N}_]"
    assert java_regex(r"^(sr|senior) .*engineer$") == r"(?Ud)^(sr|senior) .*engineer$"
    assert java_regex(r"\w\W\s\S\Z") == rf"(?Ud){word}[^\p{{L}}\p{{N}}_][\s\x{{1c}}-\x{{1f}}][^\s\x{{1c}}-\x{{1f}}]\z"
    assert java_regex(r"\bx") == rf"(?Ud)(?:(?<={word})(?!{word})|(?<!{word})(?={word}))x"
    assert java_regex(r"[\w&[]") == r"(?Ud)[\p{L}\p{N}_\&\[]"
    assert java_regex(r"[]a][^]b]") == r"(?Ud)[\]a][^\]b]"
    assert java_regex(r"(?P<t>a)(?P=t)a{,2}\u00e9\U0001F4A1") == r"(?Ud)(?<t>a)\k<t>a{0,2}\x{00e9}\x{0001F4A1}"
