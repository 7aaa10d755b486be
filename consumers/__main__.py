"""`python -m consumers --config FILE` is `bridge consume --config FILE`."""

from consumers.run import main

main()
