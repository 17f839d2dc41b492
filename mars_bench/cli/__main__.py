"""``python -m mars_bench.cli ...`` = the ``mars-bench`` command."""
from mars_bench.cli.app import main

if __name__ == "__main__":
    main()
