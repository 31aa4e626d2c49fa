"""python -m services.quota"""

from services.quota.app import main

main()
