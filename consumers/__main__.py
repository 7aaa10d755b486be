"""`python -m consumers --config FILE` is `bridge consume --config FILE`."""

import sys

from bridge.cli import main

sys.argv[1:1] = ["consume"]
main()
