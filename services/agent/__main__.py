"""python -m services.agent: the node agent (same as `gpusched agent`)."""

from libs.cli.main import main

main(["agent", *__import__("sys").argv[1:]])
