"""`spark-submit bridge_shell/cli/spark_submit.py --source files ...` runs `bridge produce`.

The producer job's own module stays free of the command line (the core never imports the
shell); this file is the entry point spark-submit runs on the driver.
"""

import sys

from bridge_shell.cli import main

if __name__ == "__main__":
    sys.argv[1:1] = ["produce"]
    main()
