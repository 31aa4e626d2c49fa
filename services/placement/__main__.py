"""python -m services.placement"""

from services.placement.app import main

main()
