"""python -m services.preemption"""

from services.preemption.app import main

main()
