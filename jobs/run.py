"""`python -m jobs.run --job MODULE:FUNCTION --key COLUMNS ...`: one pipeline version's job, whatever
module holds it (`jobs.lib.contract.runner`, the contract in `jobs.lib.contract.api`)."""

from jobs.lib.contract.runner import main

if __name__ == "__main__":
    main()
