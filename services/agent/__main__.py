"""python -m services.agent: the node agent (same as `gpusched agent`)."""

import sys

from libs.cli.main import main

main(["agent", *sys.argv[1:]])
