"""Standardization rules: versioned TOML files that map raw values of named columns to canonical ones.

* `files`: where rules files live, reading and validating them (`load_rules`, `rules_path`);
* `model`: the format and the `Rules` a job applies;
* `validation`: the checks of a file's content, each error naming the file and the line or rule.

The rulesets kappa ships are data, not code: `jobs/rules/<ruleset>/<version>.toml`.
"""
