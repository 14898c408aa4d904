"""Names that become paths, group ids and table names: the rule and its exact errors."""

from __future__ import annotations

import pytest

from orchestrator.core.exceptions import ConfigError
from orchestrator.core.names import (NAME_RULE, TOPIC_RULE, validate_alias_name, validate_job_name,
                                validate_pipeline_name, validate_topic_name, validate_version_number)


@pytest.mark.parametrize("name", ["standardize", "a", "member_profiles_std", "p2", "a" * 63])
def test_valid_names(name):
    assert validate_pipeline_name(name) == name
    assert validate_alias_name(name) == name


@pytest.mark.parametrize("name", ["", "Standardize", "2fast", "_x", "a-b", "a b", "a.b", "../etc", "a/b",
                                  "a\\b", "a" * 64, "é", "a\n"])
def test_invalid_names(name):
    with pytest.raises(ConfigError) as e:
        validate_pipeline_name(name)
    assert str(e.value) == f"invalid pipeline name {name!r}: must be {NAME_RULE}"


def test_error_names_field_value_and_rule():
    with pytest.raises(ConfigError) as e:
        validate_alias_name("../../etc/passwd")
    assert str(e.value) == ("invalid alias name '../../etc/passwd': must be a lowercase letter followed by at "
                            "most 62 lowercase letters, digits or underscores (^[a-z][a-z0-9_]{0,62}$)")
    with pytest.raises(ConfigError) as e:
        validate_pipeline_name(None)
    assert str(e.value) == f"invalid pipeline name None (a NoneType, not a string): must be {NAME_RULE}"


def test_long_values_are_shortened_in_messages():
    with pytest.raises(ConfigError) as e:
        validate_pipeline_name("x" * 500)
    assert "'" + "x" * 77 + "...'" in str(e.value)


def test_a_job_is_a_module_or_module_function_without_keywords():
    for ok in ("standardize", "team_jobs.profiles", "team_jobs.profiles:transform", "Jobs2._x:run_it"):
        assert validate_job_name(ok) == ok
    with pytest.raises(ConfigError) as e:
        validate_job_name("team.import:transform")
    assert str(e.value) == ("invalid job 'team.import:transform': the Python keyword 'import' cannot be part of a "
                            "module or function name")
    for bad in ("team-jobs.x", "x:", "a:b:c", ".x", "x..y", "x/y"):
        with pytest.raises(ConfigError, match=r"name a Python module or module:function"):
            validate_job_name(bad)


@pytest.mark.parametrize("topic", ["member_profiles", "Page.Views-1", "a" * 249])
def test_valid_topics(topic):
    assert validate_topic_name(topic) == topic


@pytest.mark.parametrize("topic", ["", ".", "..", "a,b", "a b", "a/b", "a" * 250])
def test_invalid_topics(topic):
    with pytest.raises(ConfigError) as e:
        validate_topic_name(topic)
    assert str(e.value) == f"invalid topic name {topic[:77] + '...' if len(topic) > 80 else topic!r}: must be {TOPIC_RULE}"


@pytest.mark.parametrize("value", [0, -1, True, "1", 1.0, None])
def test_invalid_version_numbers(value):
    with pytest.raises(ConfigError) as e:
        validate_version_number(value)
    assert str(e.value) == f"invalid version {value!r}: must be a positive integer (1, 2, ...)"
    assert validate_version_number(7) == 7
