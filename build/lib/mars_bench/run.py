"""``python -m mars_bench.run ...`` = the ``mars-bench`` command (mars_bench/cli.py), kept for scripts."""
from .cli import main

if __name__ == "__main__":
    main()
