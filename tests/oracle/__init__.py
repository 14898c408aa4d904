"""Expected results the tests compute on their own, sharing no code with `jobs/` (see standardize.py)."""
