"""Standardization rules: where rules files live, reading and validating them (the format and the
model are in `jobs.lib.rules.model`, whose names this module re-exports; the validator is
`jobs.lib.rules.validation`)."""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path

from jobs.lib.rules.validation import Validator
from jobs.lib.rules.model import (NAME_PATTERN, FORMAT_VERSION, FORMAT_VERSIONS, RULES_DIR, SECTIONS, FieldRules, RegexRule, Rules,
                                  java_regex, normalize)
from orchestrator.core.exceptions import RulesError

__all__ = ["FORMAT_VERSION", "FORMAT_VERSIONS", "RULES_DIR", "SECTIONS", "normalize", "RegexRule", "FieldRules", "Rules", "rules_root",
           "rules_path", "available_rules", "load_rules", "read_rules_text", "parse_rules", "java_regex"]



def rules_root(location: str | os.PathLike | None = None) -> Path:
    """The rules folder: `location` (a local folder or a file:// URI), else the shipped `jobs/rules`."""
    if location is None or str(location) == "":
        return RULES_DIR
    text = str(location)
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", text) and not text.startswith("file:"):
        raise RulesError(f"rules location {text!r}: kappa reads rules from a local folder or a file:// URI; "
                         f"check the rules out (or sync them) to a folder and set rules_location "
                         f"(--rules-location, KAPPA_RULES) to it")
    if text.startswith("file:"):
        from orchestrator.core.uris import local_path

        if (local := local_path(text)) is None:
            raise RulesError(f"rules location {text!r} is not a valid file:// URI; write file:///absolute/folder")
        return local
    return Path(text).expanduser().resolve()


def rules_path(ruleset: str, version: str, location: str | os.PathLike | None = None) -> Path:
    """`<rules location>/<ruleset>/<version>.toml`; RulesError naming the versions there if it is missing."""
    for what, name in (("ruleset", ruleset), ("rules version", version)):
        if not isinstance(name, str) or not NAME_PATTERN.match(name):
            raise RulesError(
                f"invalid {what} {name!r}: expected lowercase letters, digits, '_', '.', '-' "
                f"(at most 63 characters, no path separators)"
            )
    path = (root := rules_root(location)) / ruleset / f"{version}.toml"
    if not path.is_file():
        known = available_rules(ruleset, location)
        where = "" if root.is_dir() else f" (the rules location {root} is not a folder; set rules_location)"
        raise RulesError(
            f"no rules file {path}{where}: ruleset {ruleset!r} has "
            + (f"versions {', '.join(known)}" if known else "no versions")
            + f"; add {path.name} to {path.parent} or pick one of those"
        )
    return path


def available_rules(ruleset: str, location: str | os.PathLike | None = None) -> list[str]:
    """Rules versions of a ruleset, in natural order (v1, v2, ..., v10)."""
    folder = rules_root(location) / ruleset
    if not folder.is_dir():
        return []
    names = [p.stem for p in folder.glob("*.toml") if NAME_PATTERN.match(p.stem)]

    def natural(s: str):
        return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s)]

    return sorted(names, key=natural)


def load_rules(path: str | Path) -> Rules:
    """Read and validate a rules file; RulesError names the file, line or rule and what is wrong."""
    return parse_rules(read_rules_text(path), path)


def read_rules_text(path: str | Path) -> str:
    """A rules file's text; RulesError when it is missing, unreadable or not UTF-8."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise RulesError(f"rules file {path} does not exist; pass an existing file with --rules") from None
    except OSError as e:
        raise RulesError(f"rules file {path} cannot be read: {e.strerror}") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RulesError(f"rules file {path}: not UTF-8 (byte {e.start}); save it as UTF-8") from None


def parse_rules(text: str, path: str | Path) -> Rules:
    """Validate the text of a rules file; `path` names it in errors and gives the version (its stem)."""
    path = Path(path)
    try:
        content = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise RulesError(f"rules file {path}: TOML syntax error: {e}") from None
    return Validator(path, text, content).build()
