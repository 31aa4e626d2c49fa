"""python -m services.node_telemetry"""

from services.node_telemetry.app import main

main()
